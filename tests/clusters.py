"""Real clusters for tests: a `ray start --head` on 127.0.0.1, stopped by its process group."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# Loopback only: Ray otherwise rewrites 127.0.0.1 to the machine's routable address, and token
# authentication (on by default since Ray 2.5x) is off for these throwaway local clusters.
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    # a head stopped by SIGTERM otherwise drains 30 s for a GCS the same signal already killed
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    return {**os.environ, **LOOPBACK_ENV}


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


AGENT_PORT_FLAGS = (
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)


@contextlib.contextmanager
def ray_head(dashboard: bool = False, cpus: int = 2) -> Iterator[dict[str, str]]:
    """A real Ray head; yields {"address": "127.0.0.1:PORT", "dashboard": "http://…"}."""
    port, dash = free_port(), free_port()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    cmd = [
        ray_bin,
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        f"--num-cpus={cpus}",
        "--object-store-memory=268435456",
        f"--include-dashboard={'true' if dashboard else 'false'}",
        # Ray's per-node agents default to fixed ports (52365, …): a second cluster on this
        # machine (the tests' in-process one) would leave this head's job agent without its
        # HTTP port, and `ray job submit` is then refused with "No available agent" for good.
        *(f"--{flag}={free_port()}" for flag in AGENT_PORT_FLAGS),
    ]
    if dashboard:
        cmd += ["--dashboard-host=127.0.0.1", f"--dashboard-port={dash}"]
    head = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), start_new_session=True
    )
    try:
        _wait_port(port, 60)
        if dashboard:
            _wait_port(dash, 60)
        yield {"address": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dash}"}
    finally:
        # `ray start --block` stops what it started on SIGTERM; never `ray stop`, which would
        # kill every Ray on the machine
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=10)
