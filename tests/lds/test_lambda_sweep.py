"""A λ sweep measured by LDS (`eval.lambdas`), its recorded best, and `lambda_reg=best`."""

import dataclasses
import json
import shutil
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from tests.lds.test_eval import job
from trak_dist.config import EvalConfig, JobConfig
from trak_dist.errors import ConfigError, StoreStateError
from trak_dist.scoring import (
    AUTO_SCALE,
    BEST,
    ScoreRequest,
    ScoringConfig,
    compute_scores,
    parse_lambda,
)
from trak_dist.store import FeatureStore

P = 64  # the digits_store fixture's proj_dim


def files_of(root: Path) -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file under ``root``: what a refeaturisation would touch."""
    return {
        str(f): (f.stat().st_mtime_ns, f.stat().st_size) for f in root.rglob("*") if f.is_file()
    }


def test_best_and_the_sweep_entries_parse():
    assert parse_lambda(" Best ") == BEST
    assert JobConfig(lambda_reg="best").lambda_reg == BEST
    assert EvalConfig(lambdas=["grid", 1, "0.1", "AUTO", 1.0]).lambdas == ["grid", 1.0, 0.1, "auto"]
    assert EvalConfig(lambdas=0.5).lambdas == [0.5]
    with pytest.raises(ConfigError, match=r"eval\.lambdas holds 'best'"):
        EvalConfig(lambdas=[1, "best"])
    with pytest.raises(ConfigError, match=r"eval.lambdas entry=-1.0; expected 'auto'"):
        EvalConfig(lambdas=[-1])


def test_best_without_a_record_says_what_to_run(digits_store, tmp_path):
    path = tmp_path / "store.zarr"
    shutil.copytree(digits_store, path)
    store = FeatureStore.open(path)
    before = store.score_variants("targets")
    with pytest.raises(StoreStateError, match=r"no best λ is recorded .* `trak-dist eval "):
        compute_scores(store, ScoringConfig(), [0, 1], P, "best")
    assert store.score_variants("targets") == before  # nothing scored, no fallback to auto


def test_the_sweep_scores_with_the_job_s_scoring_settings(digits_store, tmp_path):
    """``eval.lambdas`` are scored with the job's whole ``scoring`` section: its memory budget
    (targets per pass over X), block rows, what is written and top-k, as ``trak-dist`` would."""
    from trak_dist.lds import score_lambdas

    path = tmp_path / "store.zarr"
    shutil.copytree(digits_store, path)
    c, tb, trb, k = 2, 64, 128, 5
    fits = 100  # targets the budget holds: super-blocks of 64 (whole target blocks), 5 passes
    memory = 4 * c * trb * P + 16 * trb * tb + fits * (4 * c * P + 48 * k)
    scoring = ScoringConfig(
        train_block=trb, target_block=tb, topk=k, memory=str(memory), block_rows=256,
        write_scores="topk",
    )  # fmt: skip
    cfg = dataclasses.replace(job(path, lambdas=[0.5]), proj_dim=P, scoring=scoring)
    assert score_lambdas(cfg) == ["p64_lambda0.5"]
    sset = FeatureStore.open(path).score_set("targets", "p64_lambda0.5")
    attrs = sset.attrs
    assert (attrs["super_block"], attrs["block_rows"], attrs["topk"]) == (64, 256, k)
    assert not sset.full and attrs["write_scores_asked"] == "topk"
    # the same bits as the score step with those settings, run directly on a copy
    again = tmp_path / "again.zarr"
    shutil.copytree(digits_store, again)
    ref = compute_scores(FeatureStore.open(again), scoring, [0, 1], P, 0.5)
    for key, value in ref.read_topk().items():
        np.testing.assert_array_equal(sset.read_topk()[key], value)


def independent_lds(store: FeatureStore, name: str, masks, margins) -> float:
    s = store.score_set("targets", name).scores().astype(np.float64)
    pred = masks.astype(np.float64) @ s
    rho = [spearmanr(pred[:, t], margins[:, t]).statistic for t in range(s.shape[1])]
    return float(np.nanmean(rho))


@pytest.mark.ray
def test_a_lambda_sweep_is_scored_from_the_store_measured_recorded_and_used(
    ray_session, digits_store, tmp_path
):
    from trak_dist.evaluation import evaluate_config
    from trak_dist.explain._tokens import job_score_set
    from trak_dist.pipeline import Reducer

    path = tmp_path / "store.zarr"
    shutil.copytree(digits_store, path)
    traker_lambda1 = FeatureStore.open(path).score_set("targets", "p64_lambda1").scores()
    shutil.rmtree(path / "scores" / "targets" / "p64_lambda1")  # the sweep scores it again
    features = files_of(path / "train") | files_of(path / "targets")

    base = job(path)
    cfg = dataclasses.replace(
        base, proj_dim=P, eval=dataclasses.replace(base.eval, lambdas=[1.0, "grid", 1e-3])
    )
    ev = evaluate_config(cfg, tmp_path / "lds")

    store = FeatureStore.open(path)
    # the grid: 10^-3 … 10 × the mean over checkpoints of auto's λ, 1.25·tr(XᵀX)/min(n, p),
    # from the stored XᵀX here
    n = store.spec.train_size
    auto = np.mean([AUTO_SCALE * np.trace(store.read_xtx(c)[:P, :P]) / min(n, P) for c in (0, 1)])
    grid = [auto * 10 ** (k / 2) for k in range(-6, 3)]
    scored = {name: store.score_set("targets", name).attrs["lambda_reg"] for name in ev.scored}
    assert "p64_lambdaauto" not in ev.scored  # already complete: kept as it was
    assert sorted(scored.values()) == pytest.approx(sorted([1.0, 1e-3, *grid]), rel=0.05)
    assert set(store.score_variants("targets")) == {"p64_lambdaauto", *ev.scored}
    # λ = 1 again, from the stored factorisation: TRAKer's scores, and no feature file touched
    np.testing.assert_allclose(
        store.score_set("targets", "p64_lambda1").scores(), traker_lambda1, rtol=1e-5, atol=1e-7
    )
    assert files_of(path / "train") | files_of(path / "targets") == features

    # each variant's LDS, against scipy on the stored scores and subset models
    masks, margins = store.eval_set("targets").finished()
    want = {
        name: independent_lds(store, name, masks, margins)
        for name in store.score_variants("targets")
    }
    got = {r.variant: r.result.lds for r in ev.variants}
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == pytest.approx(want[name], abs=1e-9)
    top = max(want, key=want.__getitem__)

    # the best is recorded in the store, with what it was measured on and when
    (rec,) = store.eval_set("targets").best_lambdas().values()
    assert rec == ev.recorded[P]
    written = json.loads((tmp_path / "lds" / "lds.json").read_text())
    assert written["recorded_best_lambda"] == {str(P): rec} and written["best"] == top
    assert rec["variant"] == top and rec["lds"] == pytest.approx(want[top], abs=1e-4)
    assert rec["lambda_reg"] == store.score_set("targets", top).attrs["lambda_reg"]
    assert len(rec["candidates"]) == len(want) and rec["models"] == 6
    assert rec["eval"]["recipe"] == "trak_dist.examples.digits:train_subset"
    assert rec["model_ids"] == [0, 1] and datetime.fromisoformat(rec["measured_at"])

    # lambda_reg=best: the recorded λ, wherever a job's λ is used
    best_cfg = dataclasses.replace(cfg, lambda_reg="best")
    measured = store.score_set("targets", top).scores()
    result = Reducer(store).score(ScoreRequest(best_cfg.scoring, (0, 1), P, best_cfg.lambda_reg))
    assert result.variant == top and result.lambda_reg == rec["lambda_reg"]
    again = store.score_set("targets", top)
    assert again.attrs["lambda_rule"].startswith(f"best by LDS ({rec['lds']:.3f}) among ")
    np.testing.assert_allclose(again.scores(), measured, rtol=1e-6, atol=0)  # the same λ
    assert job_score_set(best_cfg, store).group.basename == top
    with pytest.raises(StoreStateError, match=r"measured with scoring.kinv_scaling='mean_abs'"):
        compute_scores(store, ScoringConfig(kinv_scaling="none"), [0, 1], P, "best")
    with pytest.raises(StoreStateError, match=r"at proj_dim=32 .*for proj_dim 64\)"):
        compute_scores(store, ScoringConfig(), [0, 1], 32, "best")
