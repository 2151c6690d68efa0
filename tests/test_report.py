"""The run report and the sweep summary: λ per checkpoint, label agreement, LDS, best point."""

import csv
import dataclasses
import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import TensorDataset

from tests.fixtures.synthetic import synthetic_spec
from trak_dist.cli import SweepSummary
from trak_dist.lds import store_lds
from trak_dist.pipeline import JobResult, Reducer
from trak_dist.report import summarize, to_markdown
from trak_dist.scoring import ScoreRequest, ScoringConfig
from trak_dist.store import FeatureStore, ScoreSet

N, M, P, CLASSES = 120, 9, 10, 3


@pytest.fixture
def scored(store_path):
    """A synthetic store with two checkpoints, scored at λ=auto and λ=0.5 by the reducer."""
    store = FeatureStore.create_or_open(store_path, synthetic_spec(N, P, "float32", 40))
    rng = np.random.default_rng(0)
    store.ensure_experiment("t", M, None)
    for c in (0, 1):
        x = rng.standard_normal((N, P)).astype(np.float32) * (1 + c)
        rows = store.ensure_checkpoint(c)
        rows.write(0, x, rng.uniform(0.1, 1, N).astype(np.float32))
        rows.commit(0, N)
        store.write_xtx(c, x.T.astype(np.float64) @ x.astype(np.float64))
        target = store.ensure_target_checkpoint("t", c)
        target.write(0, rng.standard_normal((M, P)).astype(np.float32))
        target.commit(0, M)
    reducer = Reducer(str(store_path))
    reducer.factorize([0, 1], [P])
    variants = [
        reducer.score(ScoreRequest(ScoringConfig("t", "mean_abs", 4, 64, 64), (0, 1), P, lam))
        for lam in ("auto", 0.5)
    ]
    result = JobResult(
        store=str(store_path),
        exp="t",
        n=N,
        m=M,
        checkpoints=2,
        proj_dim=P,
        scores=variants,
        phases={"total": 1.0},
        rows_computed={"train": 2 * N, "target": 2 * M},
        rows_reused={"train": 0, "target": 0},
        worker_restarts=0,
        task_retries=0,
        conditioning={},
        format_version=store.spec.format_version,
    )
    labels = torch.arange(N) % CLASSES
    train = TensorDataset(torch.zeros(N, 1), labels)
    targets = TensorDataset(torch.zeros(M, 1), torch.arange(M) % CLASSES)
    return store, result, train, targets


def test_report_shows_lambda_per_checkpoint_and_label_agreement(scored):
    store, result, train, targets = scored
    summary = summarize(result, train, targets)
    auto, fixed = summary["variants"]
    n = store.spec.train_size
    traces = [np.trace(store.read_xtx(c)[:P, :P]) for c in (0, 1)]
    np.testing.assert_allclose(auto["lambdas"], [1.25 * t / min(n, P) for t in traces], rtol=1e-3)
    assert fixed["lambdas"] == [0.5, 0.5] and fixed["lambda_reg"] == 0.5
    text = to_markdown(summary)
    per = ", ".join(f"{x:.3g}" for x in auto["lambdas"])
    assert f"- λ: auto (1.25 × tr(K) / min(r, p)); per checkpoint: {per}" in text
    assert "- λ: 0.5 (fixed)" in text
    # what the features and K are, from the store's spec (synthetic_spec: rademacher, d = P)
    assert f"- method: rademacher projection of {P} gradient entries to p = {P} (float32); " in text
    assert text.count("- checkpoints combined: mean_abs (each K⁻¹ divided by") == 2
    assert "LDS: not measured; `trak-dist eval`" in text
    # agreement: share of each target's top-4 proponents with its label (independently here)
    top = store.score_set("t", auto["variant"]).read_topk()["proponents_idx"]
    agree = np.mean([(top[t] % CLASSES) == (t % CLASSES) for t in range(M)])
    assert auto["proponent_label_agreement"] == pytest.approx(agree, abs=1e-4)
    assert auto["label_agreement_chance"] == pytest.approx(1 / CLASSES, abs=1e-4)
    assert f"{100 * agree:.1f} % (random train examples: 33.3 %)" in text
    ex = auto["examples"][0]
    assert ex["proponent_labels"] == [int(i) % CLASSES for i in ex["proponents"]]


def test_report_gives_each_stage_s_bytes_and_rates(scored):
    """The bytes featurising wrote are the stored arrays' bytes of the rows computed (counted
    here from Zarr's own shapes and dtypes), the score step's FLOPs are 2·n·m·p per checkpoint
    per variant, and the rates are those over the phases' seconds."""
    store, result, _, _ = scored
    result = dataclasses.replace(result, phases={"featurize": 2.0, "score": 4.0, "total": 7.0})
    summary = summarize(result)
    pace = summary["pace"]
    per_row = {
        kind: sum(np.dtype(a.dtype).itemsize * int(np.prod(a.shape[1:])) for a in g.arrays())
        for kind, g in (("train", store.train_rows(0)), ("target", store.target_rows("t", 0)))
    }
    assert per_row["train"] == 4 * P + 8 + 4  # float32 X, uint64 hash, float32 Q
    written = 2 * N * per_row["train"] + 2 * M * per_row["target"]
    assert pace["featurize"]["bytes_written"] == written
    assert pace["featurize"]["rows_per_s"] == pytest.approx((2 * N + 2 * M) / 2.0, abs=0.1)
    flop = 2 * (2.0 * N * M * P * 2)  # two variants, two checkpoints each
    assert pace["score"]["gflop"] == pytest.approx(flop / 1e9, abs=1e-3)
    assert pace["score"]["gflop_per_s"] == pytest.approx(flop / 4.0 / 1e9, abs=0.01)
    read = sum(v.bytes_read for v in result.scores)
    assert read > 0 and pace["score"]["bytes_read"] == read
    text = to_markdown(summary)
    assert "| phase | seconds | read | written | rate |" in text
    assert f"{(2 * N + 2 * M) / 2.0:.4g} rows/s" in text
    assert "| total | 7.00 |" in text


def test_report_shows_the_lds_once_subset_models_exist(scored):
    store, result, train, targets = scored
    settings = {
        "recipe": "x:y",
        "recipe_kwargs": {},
        "num_models": 5,
        "alpha": 0.5,
        "seed": 0,
        "train_size": N,
        "num_targets": M,
        "train_fingerprint": "synthetic",
    }
    ev = store.ensure_eval("t", settings)
    rng = np.random.default_rng(1)
    for j in range(5):
        ev.write(j, rng.standard_normal(M).astype(np.float32))
    summary = summarize(result, train, targets)
    expected = {r.variant: r.result for r in store_lds(store, "t")}
    for v in summary["variants"]:
        assert v["lds"]["lds"] == pytest.approx(expected[v["variant"]].lds, abs=1e-4)
        assert v["lds"]["models"] == 5
    d = summary["variants"][0]["lds"]
    assert (
        f"what 5 retrained subset models output): {d['lds']:.3f}, 95 % interval "
        f"[{d['low']:.3f}, {d['high']:.3f}]" in to_markdown(summary)
    )


def _report(folder, lam, lds, job):
    folder.mkdir(parents=True)
    variant = {"proj_dim": 64, "lambda_reg": lam, "lambdas": [1.5, 2.5], "seconds": 0.1}
    if lds is not None:
        variant["lds"] = {"lds": lds, "low": lds - 0.05, "high": lds + 0.05}
    rep = {
        "overrides": [f"lambda_reg={lam}"],
        "phases_s": {"total": 2.0},
        "rows_computed": {"train": 0, "target": 0},
        "variants": [variant],
    }
    (folder / "trak_report.json").write_text(json.dumps(rep))


@pytest.mark.parametrize("with_lds", [True, False])
def test_sweep_summary_names_the_point_with_the_best_lds(tmp_path, with_lds):
    for job, (lam, lds) in enumerate([("auto", 0.41), (0.01, 0.35), (1.0, 0.44)]):
        _report(tmp_path / str(job), lam, lds if with_lds else None, job)
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "trak_report.json").write_text(
        json.dumps({"overrides": ["lambda_reg=0"], "error": "XᵀX + λI is singular"})
    )
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    with open(tmp_path / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["lambda_reg"] for r in rows[:3]] == ["auto", "0.01", "1.0"]
    assert rows[0]["lambdas"] == "1.5 2.5"
    summary = (tmp_path / "sweep_summary.md").read_text()
    if with_lds:
        assert [float(r["lds"]) for r in rows[:3]] == [0.41, 0.35, 0.44]
        assert "best point (highest LDS): job 2, proj_dim=64 lambda_reg=1.0: LDS 0.440" in summary
    else:
        assert "best point: no LDS measured (run `trak-dist eval`" in summary
    assert "XᵀX + λI is singular" in summary
    assert (tmp_path / "sweep_summary.png").is_file() == with_lds  # nothing to plot otherwise


def test_score_sets_expose_their_attributes(scored):
    store, *_ = scored
    sset = store.score_set("t", "p10_lambdaauto")
    assert isinstance(sset, ScoreSet) and sset.attrs["lambda_reg"] == "auto"
    assert store.score_variants("t") == ["p10_lambda0.5", "p10_lambdaauto"]


class Texts(TensorDataset):
    """Rows with ``decode`` (as ``data=text`` datasets): row i reads "row i | `x`"."""

    def decode(self, i):
        return f"row {i} | `x`   " + "word " * 30


def test_text_data_show_decoded_targets_proponents_and_opponents(scored):
    store, result, train, targets = scored
    summary = summarize(result, Texts(*train.tensors), Texts(*targets.tensors))
    ex = summary["variants"][0]["examples"][0]
    top = store.score_set("t", summary["variants"][0]["variant"]).read_topk()
    assert ex["target_text"].startswith("row 0 | `x` word")
    assert len(ex["target_text"]) == 80 and ex["target_text"].endswith("…")
    assert ex["proponent_texts"][0].startswith(f"row {top['proponents_idx'][0, 0]} |")
    assert ex["opponent_texts"][0].startswith(f"row {top['opponents_idx'][0, 0]} |")
    text = to_markdown(summary)
    first = int(top["proponents_idx"][0, 0])
    score = top["proponents_val"][0, 0]
    assert f"- + {first} {float(f'{score:.4g}'):+.4g}: `row {first} | 'x' word" in text
    assert f"- − {int(top['opponents_idx'][0, 0])} " in text
    assert "**target 0**: `row 0 | 'x' word" in text


def test_image_data_get_a_picture_of_targets_and_proponents(scored, tmp_path):
    from PIL import Image

    _store, result, train, targets = scored
    images = TensorDataset(torch.rand(N, 64), train.tensors[1])  # flat 8×8, like digits
    shown = TensorDataset(torch.rand(M, 64), targets.tensors[1])
    summary = summarize(result, images, shown, figure=tmp_path / "r.png")
    assert summary["figure"] == "r.png"
    assert "![targets (left), their top proponents" in to_markdown(summary)
    assert "](r.png)" in to_markdown(summary)
    with Image.open(tmp_path / "r.png") as png:
        width, height = png.size
    # 4 targets (rows) × (target + 3 proponents + 3 opponents) cells
    assert width > height > 0
    # not images (one feature per sample): no picture, and nothing said about one
    plain = summarize(result, train, targets, figure=tmp_path / "s.png")
    assert "figure" not in plain and not (tmp_path / "s.png").exists()
