"""The cluster of ``tests/multinode`` with the local runs of the default and the causal-LM job
(``tests/multinode/_local.py``), and the LM's inputs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures import llm_models
from tests.fixtures.multinode import Cluster
from tests.multinode._jobs import LM_TRAIN_ROWS, lm_args
from tests.multinode._local import LocalRuns, cluster_with
from tests.multinode.conftest import s3_client

__all__ = ["s3_client"]


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
    """The cluster, and the local runs of the default job and the LM job."""
    runs = {"default": ["progress=false"], "lm": lm_args(str(lm_inputs))}
    yield from cluster_with(tmp_path_factory, runs)
