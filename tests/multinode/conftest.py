"""One multi-node cluster (``tests/fixtures/multinode.py``) for every test here, and the
single-node local-disk runs their results must equal bit for bit. The local runs go in the
background once the cluster is up (one at a time: the machine may have two cores)."""

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

from tests.fixtures import llm_models
from tests.fixtures.multinode import Cluster, require
from tests.multinode._jobs import FAULTS, LM_TRAIN_ROWS, lm_args

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


@pytest.fixture(scope="session")
def lm_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tiny GPT-2 checkpoint directories (``save_pretrained``, with the tokenizer) and
    ``train.jsonl`` / ``targets.jsonl``, made here from configs."""
    root = tmp_path_factory.mktemp("lm")
    docs = llm_models.sentences(LM_TRAIN_ROWS)
    llm_models.checkpoints(root, "gpt2", num=2, docs=docs)
    return root


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, lm_inputs: Path
) -> Iterator[tuple[Cluster, LocalRuns]]:
    """The cluster, and the local runs of the default job, the fault tests' job and the LM job
    (running beside the first cluster jobs)."""
    require()
    # the local runs start once the cluster is up: on a loaded machine, Ray nodes starting
    # beside a local Ray missed the 30 s `ray start` gives a raylet to register
    # TRAK_DIST_MULTINODE_STATE: a cluster brought up by hand (.ci/multinode/up.sh), kept after
    reuse = os.environ.get("TRAK_DIST_MULTINODE_STATE")
    c = Cluster.of(Path(reuse)) if reuse else Cluster.up(tmp_path_factory.mktemp("cluster"))
    local = LocalRuns(
        tmp_path_factory.mktemp("local"),
        {"default": ["progress=false"], "faults": FAULTS, "lm": lm_args(str(lm_inputs))},
    ).start()
    try:
        yield c, local
    finally:
        local.stop()
        if not reuse:
            c.down()


@pytest.fixture
def s3_client(cluster, monkeypatch) -> Cluster:
    """The cluster, whole again (``Cluster.heal``: a test may end with nodes lost), with its S3
    server's credentials in this process's environment (to read the stores of the jobs)."""
    c, _ = cluster
    c.heal()
    for k, v in c.s3_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return c
