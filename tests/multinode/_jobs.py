"""What the multi-node tests run: the jobs' arguments, and the bit-for-bit comparison of a
store on the cluster's S3 with a local one."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# The digits example with a small store chunk and shard (many shards: time to lose a node while
# they run) and score blocks of 64 train rows (24 blocks: time to lose one while scoring).
FAULTS = [
    "proj_dim=64",
    "lambda_reg=0.01",
    "store.chunk_rows=64",
    "featurize.shard_rows=64",
    "scoring.train_block=64",
    "scoring.block_rows=64",
    "progress=false",
]
# A causal LM built from a config (tests/fixtures/llm_models.py), its data as JSONL
LM = [
    "task=causal_lm",
    "model=hf",
    "data=text",
    "proj_dim=16",
    "lambda_reg=0.01",
    "store.chunk_rows=16",
    "featurize.shard_rows=16",
    "progress=false",
]
LM_TRAIN_ROWS = 120


def lm_args(where: str) -> list[str]:
    """The causal-LM job on the inputs under ``where`` (a folder or an s3:// prefix)."""
    return [
        *LM,
        f"model.checkpoints=[{where}/c0,{where}/c1]",
        f"data.train={where}/train.jsonl",
        f"data.targets={where}/targets.jsonl",
    ]


def assert_same_bits(local: Path, url: str) -> dict[str, int]:
    """Every result of the store at ``url`` equals the local store's bit for bit: features and
    XᵀX per checkpoint, the scores and the top-k of every variant. Returns what was compared."""
    from trak_dist.store import FeatureStore

    a, b = FeatureStore.open(local, mode="r"), FeatureStore.open(url, mode="r")
    n, seen = a.spec.train_size, {"checkpoints": 0, "variants": 0}
    assert b.checkpoint_ids() == a.checkpoint_ids()
    for mid in a.checkpoint_ids():
        np.testing.assert_array_equal(b.train_rows(mid).read(0, n), a.train_rows(mid).read(0, n))
        np.testing.assert_array_equal(b.read_xtx(mid), a.read_xtx(mid))
        m = a.num_targets("targets")
        t_a, t_b = a.target_rows("targets", mid), b.target_rows("targets", mid)
        np.testing.assert_array_equal(t_b.read(0, m), t_a.read(0, m))
        seen["checkpoints"] += 1
    assert b.score_variants("targets") == a.score_variants("targets")
    for variant in a.score_variants("targets"):
        sa, sb = a.score_set("targets", variant), b.score_set("targets", variant)
        assert sa is not None and sb is not None and sa.full == sb.full
        if sa.full:
            np.testing.assert_array_equal(sb.scores(), sa.scores())
        top_a, top_b = sa.read_topk(), sb.read_topk()
        assert top_a.keys() == top_b.keys()
        for key, value in top_a.items():
            np.testing.assert_array_equal(top_b[key], value)
        seen["variants"] += 1
    return seen
