"""Checkpoints on a cluster without shared storage (``sources.node_checkpoints``): a node that
lacks the driver's local files makes its own copies with the same bytes, or says what to give."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from trak_dist.errors import ConfigError
from trak_dist.examples import digits
from trak_dist.examples._cache import cached_state
from trak_dist.sources import checkpoint_paths, node_checkpoints
from trak_dist.store import file_fingerprint

TRAIN = partial(digits.train_subset, np.arange(200), 0, epochs=2)


def provider() -> list[Path]:
    """A checkpoint provider as the bundled examples are: trains into this node's cache."""
    return digits.checkpoints(num=2, epochs=1)


def test_a_missing_local_checkpoint_is_made_again_on_this_node_with_the_same_bytes(
    tmp_path, monkeypatch
):
    ref = "tests.test_node_checkpoints:provider"
    monkeypatch.setenv("TRAK_DIST_CACHE", str(tmp_path / "driver"))
    driver = checkpoint_paths(ref)
    prints = [file_fingerprint(p) for p in driver]
    assert node_checkpoints(ref, driver) == driver  # present here: used as they are
    # another node: its own cache, where the driver's files are not
    monkeypatch.setenv("TRAK_DIST_CACHE", str(tmp_path / "node"))
    for p in driver:
        Path(p).rename(Path(p).with_suffix(".gone"))
    here = node_checkpoints(ref, driver)
    assert [str(p) for p in here] != [str(p) for p in driver]
    assert [file_fingerprint(p) for p in here] == prints


def test_a_missing_checkpoint_path_says_what_to_give(tmp_path):
    with pytest.raises(ConfigError, match=r"are not on node .*object storage URLs"):
        node_checkpoints([str(tmp_path / "c0.pt")], [tmp_path / "c0.pt"])


def test_example_checkpoints_have_the_same_bytes_whatever_the_thread_count(tmp_path):
    """A matmul's rounding depends on torch's thread count, and torch.save names the archive
    inside after the file: cached_state trains on one thread and writes from memory."""
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        a = cached_state(tmp_path / "a.pt", TRAIN)
        torch.set_num_threads(1)
        b = cached_state(tmp_path / "b.pt", TRAIN)
    finally:
        torch.set_num_threads(previous)
    assert a.read_bytes() == b.read_bytes()
    assert torch.get_num_threads() == previous
