"""``trak-dist serve``'s refusals before anything starts (one line, exit 2), and how it stops."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.serve import DigitsJob, P, free_port


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trak_dist", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help() -> None:
    out = _serve("--help")
    assert out.returncode == 0
    assert "POST /attribute" in out.stdout and "serve.token_file" in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve.host=0.0.0.0"], "serve.host=0.0.0.0 accepts connections from other machines"),
        (["serve.port=70000"], "ServeConfig.port=70000"),
        (["serve.index_dtype=int8"], "ServeConfig.index_dtype='int8'"),
        (["serve.require_token=true"], "needs a bearer token: set serve.token_file"),
    ],
)
def test_refused_settings(args: list[str], message: str) -> None:
    out = _serve(*args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_refused_token_file_and_store(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    out = _serve(f"serve.token_file={empty}", "serve.require_token=true")
    assert out.returncode == 2 and "holds 0 characters" in out.stderr, out.stderr
    out = _serve(f"store.path={tmp_path / 'none.zarr'}")
    assert out.returncode == 2 and "no store at" in out.stderr, out.stderr


def _port_free(port: int, wait_s: float = 10.0) -> bool:
    """Whether a new server can listen on ``port`` (within ``wait_s``). SO_REUSEADDR, as
    servers set it: a connection the old one closed (TIME_WAIT) does not count, a socket still
    listening does."""
    deadline = time.monotonic() + wait_s
    while True:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.ray
def test_sigterm_stops_the_service_and_frees_its_port(digits_job: DigitsJob, tmp_path: Path):
    """``docker stop``/systemd send SIGTERM: the service stops as on Ctrl-C (Serve shut down,
    exit 0, its port free). Before, Ray's handler aborted the process (a C++ stack dump, exit
    -6), Serve's actors outliving it."""
    port = free_port()
    ckpts = ",".join(digits_job.checkpoints)
    args = [f"store.path={digits_job.store}", f"proj_dim={P}", f"model.checkpoints=[{ckpts}]"]
    with open(tmp_path / "stderr", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trak_dist", "serve", *args, f"serve.port={port}"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # ends (and fails below) if the service exits instead
            if "trak-dist serve: ready at" in line:
                break
        health = f"http://127.0.0.1:{port}/health"
        with urllib.request.urlopen(health, timeout=30) as reply:
            assert reply.status == 200, (tmp_path / "stderr").read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, (tmp_path / "stderr").read_text()[-3000:]
        assert "trak-dist serve: stopping" in proc.stdout.read()
        assert _port_free(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
