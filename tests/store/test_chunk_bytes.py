"""Chunks bounded in bytes along both axes (store/_layout.py).

traker's own ``test_class_featurize_noop`` (a ``NoOpProjector`` on a ResNet-18: p = 11.7M, 5
rows) made trak_dist lay out one 256 × 11.7M chunk, which Zarr allocated, padded and compared
whole on the write: the process was killed for memory at 24 GB. Here the same shape of problem,
at a width this machine survives, with the peak RSS measured in a fresh process; and the
multi-column-chunk paths (write, stage, fold, verify, repair) checked value by value on a store
whose chunk cap is made tiny.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_store import spec

from tests.fixtures.row_writers import P, item_hashes, row_values
from trak_dist.errors import StoreDamagedError
from trak_dist.store import FeatureStore
from trak_dist.store import _layout as layout
from trak_dist.store.verify import repair, verify

CHUNK_ROWS = 256

# A TRAKer featurising ``n`` rows of a linear model with an identity projection (p = d), in a
# fresh process: its peak RSS growth over the featurize call(s), and the store's chunks.
SCRIPT = textwrap.dedent(
    """
    import json, logging, resource, sys, tempfile
    import torch
    from torch import nn
    from trak_dist import TRAKer

    d_in, n, train_size, staged = (int(a) for a in sys.argv[1:5])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(d_in, 10))
    x, y = torch.randn(n, d_in), torch.randint(0, 10, (n,))
    with tempfile.TemporaryDirectory() as tmp:
        t = TRAKer(model=model, task="image_classification", train_set_size=train_size,
                   save_dir=tmp, device="cpu", projection="identity", chunk_rows=256,
                   logging_level=logging.ERROR)
        t.load_checkpoint(model.state_dict(), model_id=0)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if staged:  # two batches that fill no chunk: both staged, in the writer's shadow
            t.featurize([x, y], inds=torch.arange(n))
            t.featurize([x, y], inds=torch.arange(n) + 100)
        else:
            t.featurize([x, y], num_samples=n)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rows = t.store.train_rows(0)
        out = {
            "growth": (peak - base) * 1024,
            "p": rows.proj_dim,
            "chunks": list(rows.X.chunks),
            "itemsize": rows.X.dtype.itemsize,
            "complete": rows.is_complete(),
            "staged": int(rows.staged.staged_rows().sum()),
            "finite": bool(all(
                __import__("numpy").isfinite(rows.staged.shadows()[0].X[r].astype("float32")).all()
                for r in range(n)
            )) if staged else bool(__import__("numpy").isfinite(rows.read(0, n)).all()),
        }
    print(json.dumps(out))
    """
)


def featurise_wide(d_in: int, n: int, train_size: int, staged: bool) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(d_in), str(n), str(train_size), str(int(staged))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "staged", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["whole-row-set", "staged"]
)
def test_a_wide_identity_projection_never_holds_a_whole_wide_chunk(staged):
    """p = 3M, 5 rows (before: 3.8 GB peak growth whole, 5.4 GB staged; now ~150 / ~400 MB).
    A 256-row chunk of p float32 values is 3 GB: the growth must stay far below it."""
    d_in = 300_000
    out = featurise_wide(d_in, 5, 5 if not staged else 300, staged)
    p = int(out["p"])  # type: ignore[call-overload]
    assert p == d_in * 10 + 10
    rows, cols = out["chunks"]  # type: ignore[misc]
    assert rows * cols * int(out["itemsize"]) <= layout.CHUNK_BYTES  # type: ignore[call-overload]
    assert rows == (5 if not staged else CHUNK_ROWS)  # a row set of 5 rows: chunks of 5 rows
    assert out["finite"]
    assert out["complete"] if not staged else out["staged"] == 10
    whole_chunk = CHUNK_ROWS * p * 4
    assert out["growth"] < whole_chunk / 6, f"peak RSS grew {out['growth'] / 2**20:.0f} MiB"


def test_chunk_shapes_are_bounded_along_both_axes():
    assert layout.row_chunks(5, 11_700_000, 256, 2) == (5, 5_850_000)  # ResNet-18, noop, fp16
    r, c = layout.row_chunks(10_000, 11_700_000, 256, 2)
    assert r == 256 and r * c * 2 <= layout.CHUNK_BYTES and c * 90 >= 11_700_000
    assert layout.row_chunks(10_000, 2048, 256, 2) == (256, 2048)  # the usual store: unchanged
    assert layout.bounded_chunks((32768, 32768), 8) == (256, 32768)  # an XᵀX of p = 32768
    assert layout.bounded_chunks((), 8) == (1,)


@pytest.fixture
def tiny_chunks(monkeypatch):
    """X of P = 8 float16 columns in chunks of 64 rows × 2 columns: four column chunks."""
    monkeypatch.setattr(layout, "CHUNK_BYTES", 64 * 2 * 2)


def test_column_chunks_hold_what_was_written_staged_and_folded(store_path, tiny_chunks):
    store = FeatureStore.create_or_open(store_path, spec(proj_dim=P, train_size=200, chunk_rows=64))
    rs = store.ensure_checkpoint(0)
    assert rs.X.chunks == (64, 2)
    whole = np.arange(64, 128)
    rs.staged.write_rows(whole, *row_values(whole), h=item_hashes(whole), writer="a")  # direct
    for writer, part in (
        ("a", np.arange(0, 40)),
        ("b", np.arange(40, 64)),
        ("b", np.arange(130, 200)),
    ):
        rs.staged.write_rows(part, *row_values(part), h=item_hashes(part), writer=writer)
    # chunk 3 ([192, 200)) was whole in b's batch: committed directly. Chunk 0 comes from two
    # writers; chunk 2 lacks rows 128, 129
    assert rs.done_chunks().tolist() == [False, True, False, True]
    assert rs.staged.fold() == 1
    last = np.arange(128, 130)
    rs.staged.write_rows(last, *row_values(last), h=item_hashes(last), writer="c")
    assert rs.staged.fold() == 1 and rs.is_complete()
    everything = np.arange(200)
    np.testing.assert_array_equal(rs.read(0, 200), row_values(everything)[0])
    np.testing.assert_array_equal(rs.read_q(0, 200), row_values(everything)[1])
    np.testing.assert_array_equal(
        rs.read_hashes(slice(0, 200), checked=True), item_hashes(everything)
    )
    assert verify(store_path).problems == []


def test_a_damaged_column_chunk_is_found_and_its_row_chunk_uncommitted(store_path, tiny_chunks):
    store = FeatureStore.create_or_open(store_path, spec(proj_dim=P, train_size=128, chunk_rows=64))
    rs = store.ensure_checkpoint(0)
    inds = np.arange(128)
    rs.staged.write_rows(inds, *row_values(inds), h=item_hashes(inds), writer="a")
    (store_path / "train" / "0" / "X" / "c" / "1" / "3").unlink()  # rows [64, 128), cols [6, 8)
    with pytest.raises(
        StoreDamagedError, match=r"train/0/X chunk \(1, 3\) \(rows \[64, 128\), cols \[6, 8\)\)"
    ):
        rs.read(0, 128)
    report, actions = repair(store_path)
    assert [p.uncommit for p in report.problems] == [("train/0", 1)]
    assert actions == ["un-committed 1 chunk(s) of train/0 (rows [64, 128))"]
    rows = FeatureStore.open(store_path).train_rows(0)
    assert rows.done_chunks().tolist() == [True, False]
    # every column chunk of the un-committed row chunk is gone: none reads as data
    assert not any((store_path / "train" / "0" / "X" / "c" / "1").glob("*"))
    assert verify(store_path).problems == []
