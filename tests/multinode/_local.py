"""The single-node local-disk runs whose results the cluster's must equal bit for bit, and the
session's cluster with them (``cluster_with``: each conftest names its runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.fixtures.multinode import Cluster, require

TRAK_DIST = str(Path(sys.executable).with_name("trak-dist"))


@dataclass
class LocalRuns:
    """``trak-dist`` runs on this machine (the local Ray, the store on local disk), started one
    after the other in a thread; ``store(name)`` waits for one and gives its store."""

    root: Path
    runs: dict[str, list[str]]
    done: dict[str, threading.Event] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[str] | None = None
    stopped: bool = False

    def start(self) -> LocalRuns:
        self.done = {name: threading.Event() for name in self.runs}
        threading.Thread(target=self._run_all, daemon=True).start()
        return self

    def _run_all(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RAY_ADDRESS"))}
        env["TRAK_DIST_CACHE"] = str(self.root / "cache")
        for name, args in self.runs.items():
            if self.stopped:
                return
            # its own session: stop() ends it with its local Ray
            self.proc = subprocess.Popen(
                [TRAK_DIST, *args, f"store.path={self.root / name}.zarr",
                 f"hydra.run.dir={self.root / name}-out"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=self.root,
                env=env, start_new_session=True,
            )  # fmt: skip
            _, err = self.proc.communicate()
            if self.proc.returncode != 0:
                self.errors[name] = err[-3000:]
            self.done[name].set()

    def stop(self) -> None:
        self.stopped = True
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C: trak-dist stops its local Ray
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def store(self, name: str) -> Path:
        assert self.done[name].wait(900), f"the local run {name} did not end in 900 s"
        assert name not in self.errors, f"the local run {name} failed:\n{self.errors[name]}"
        return self.root / f"{name}.zarr"


def cluster_with(
    factory: pytest.TempPathFactory, runs: dict[str, list[str]]
) -> Iterator[tuple[Cluster, LocalRuns]]:
    """The cluster, and ``runs`` (name → ``trak-dist`` arguments) run locally in the background
    once it is up: on a loaded machine, Ray nodes starting beside a local Ray missed the 30 s
    `ray start` gives a raylet to register. ``TRAK_DIST_MULTINODE_STATE``: a cluster brought up
    by hand (.ci/multinode/up.sh), kept after."""
    require()
    reuse = os.environ.get("TRAK_DIST_MULTINODE_STATE")
    c = Cluster.of(Path(reuse)) if reuse else Cluster.up(factory.mktemp("cluster"))
    local = LocalRuns(factory.mktemp("local"), runs).start()
    try:
        yield c, local
    finally:
        local.stop()
        if not reuse:
            c.down()
