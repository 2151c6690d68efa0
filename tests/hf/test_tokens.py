"""Per-token explanations: the token scores of a train example add up to its score, and a span
planted in one train example, which a target asks, carries that example's score."""

from __future__ import annotations

import numpy as np
import pytest
from test_llm_cli import run_cli

from tests.fixtures import llm_models
from trak_dist.config import (
    DataConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    StoreConfig,
    TaskConfig,
)
from trak_dist.explain._tokens import TokenExplainer, token_batch
from trak_dist.pipeline import resolve_inputs
from trak_dist.store import FeatureStore, variant_name

PLANTED = 25  # the train row that states the planted span
SPAN = "zyx qwv jkp"


def test_token_batch_counts_one_token_per_copy():
    import torch

    item = {
        "input_ids": torch.tensor([5, 6, 7, 8, 0]),
        "attention_mask": torch.tensor([1, 1, 1, 1, 0]),
        "labels": torch.tensor([-100, -100, 7, 8, -100]),
    }
    batch, positions = token_batch(item)
    assert positions.tolist() == [2, 3]
    assert batch["labels"].tolist() == [[-100, -100, 7, -100, -100], [-100, -100, -100, 8, -100]]
    assert (batch["input_ids"] == item["input_ids"]).all()


@pytest.mark.slow
@pytest.mark.ray
def test_token_scores_sum_to_the_example_scores(tmp_path):
    docs = llm_models.sentences(40)
    # a span no other document has, in the middle of filler: its tokens, and only they, are
    # what the planted target asks of this document
    docs[PLANTED] = f"the old bird {SPAN} near the river"
    ckpts = llm_models.checkpoints(tmp_path, "llama", docs=docs)
    llm_models.write_jsonl(
        tmp_path / "targets.jsonl",
        [*llm_models.targets(), {"prompt": "the old bird", "completion": f" {SPAN}"}],
    )
    args = [
        "task=causal_lm",
        "model=hf",
        "data=text",
        "model.checkpoints=[c0,c1,c2]",
        "data.train=train.jsonl",
        "data.targets=targets.jsonl",
        "proj_dim=64",
        "featurize.half_precision=false",
        "progress=false",
        "cluster.num_workers=1",
        "hydra.run.dir=run",
    ]
    out = run_cli(args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    cfg = resolve_inputs(
        JobConfig(
            proj_dim=64,
            model=ModelConfig(factory="hf", checkpoints=[str(c) for c in ckpts]),
            data=DataConfig(
                format="text",
                train=str(tmp_path / "train.jsonl"),
                targets=str(tmp_path / "targets.jsonl"),
            ),
            task=TaskConfig(name="causal_lm"),
            featurize=FeaturizeConfig(half_precision=False),
            store=StoreConfig(path=str(tmp_path / "trak_store.zarr")),
        )
    )
    train = cfg.data.train()
    # a causal LM's Fisher: kinv_scaling auto is per_target (the explanations use its Y too)
    variant = variant_name(64, "auto", "per_target")
    scores = FeatureStore.open(cfg.store.path, mode="r").score_set("targets", variant)
    assert scores is not None
    s = scores.scores()
    top = scores.read_topk()
    m = s.shape[1]
    pairs = {
        (int(top[f"{side}_idx"][t, k]), t)
        for side in ("proponents", "opponents")
        for t in range(m)
        for k in range(2)
    } | {(0, 0), (39, m - 1), (PLANTED, m - 1)}
    found = TokenExplainer(cfg, train).explain(sorted(pairs))
    for (i, t), (positions, tokens) in found.items():
        # one score per counted token (every real token after the first, for a text column)
        assert len(positions) == int(train[i]["attention_mask"].sum()) - 1
        np.testing.assert_allclose(
            tokens.sum().item(), s[i, t], rtol=1e-4, atol=1e-6 * np.abs(s).max()
        )
    # the planted span holds the document's score for the target that asks it: its top half of
    # tokens are the document's top tokens, every token outside it scores below the span's
    # mean, and it carries more than half the score (positions are those of the tokens
    # predicted). Whether the span's weakest token outranks the filler after it depends on λ.
    positions, tokens = found[(PLANTED, m - 1)]
    tok = train.tokenizer
    start = len(tok("the old bird")["input_ids"])
    end = len(tok(f"the old bird {SPAN}")["input_ids"])
    inside = (positions >= start) & (positions < end)
    best = positions[tokens.argsort(descending=True)[: (end - start) // 2]]
    assert all(start <= b < end for b in best.tolist()), (positions, tokens)
    assert tokens[~inside].max() < tokens[inside].mean(), (positions, tokens)
    assert tokens[inside].sum() > 0.5 * tokens.sum()
