"""``featurize.curvature=fisher`` through the pipeline's plain classes on the in-process
executor (no Ray: what is checked is the worker, the reducer and the store, not where they run):
K = GᵀG of the stored Fisher rows G, whatever the split (invariant 2), resumed from committed
chunks (invariant 3), reduced from the committed rows as the reduce stage does for the SLURM
executor's array tasks and TRAKer (``Reducer.reduce_stored``), and recorded in the store
(invariant 4). Sizes are the smallest that still split: 16 rows, chunks of 8, p = 32."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fixtures.pipeline import run_in_process
from trak_dist.config import (
    ClusterConfig,
    DataConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    ProjectionConfig,
    StoreConfig,
    TaskConfig,
)
from trak_dist.errors import ConfigError, StoreMismatchError
from trak_dist.examples import tiny_lm
from trak_dist.pipeline import Reducer, Worker, prepare
from trak_dist.report import summarize, to_markdown
from trak_dist.scoring import AUTO_SCALE, gram
from trak_dist.store import FeatureStore, variant_name

N, P, CHUNK = 16, 32, 8


@pytest.fixture(scope="module")
def lm_checkpoints(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("lm_ckpts")
    out = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        path = root / f"s{seed}.pt"
        torch.save(tiny_lm.make_model(n_embd=16).state_dict(), path)
        out.append(path)
    return out


def lm_job(store: Path, ckpts: list[Path], **featurize: object) -> JobConfig:
    settings = {"micro_batch": 4, "shard_rows": CHUNK, "half_precision": False, **featurize}
    return JobConfig(
        proj_dim=P,
        lambda_reg="auto",
        model=ModelConfig(
            factory="trak_dist.examples.tiny_lm:make_model",
            kwargs={"n_embd": 16},
            checkpoints=[str(c) for c in ckpts],
        ),
        data=DataConfig(
            train="trak_dist.examples.tiny_lm:train_set",
            targets="trak_dist.examples.tiny_lm:target_set",
            kwargs={"limit": N},
        ),
        task=TaskConfig(name="causal_lm"),
        projection=ProjectionConfig(kind="kronecker"),
        featurize=FeaturizeConfig(**settings),  # type: ignore[arg-type]
        store=StoreConfig(path=str(store), chunk_rows=CHUNK),
        cluster=ClusterConfig(num_workers=2),
        progress=False,
        report=None,
    )


def stored(cfg: JobConfig) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per checkpoint: X, G and the stored K."""
    store = FeatureStore.open(cfg.store.path, mode="r")
    ids = store.checkpoint_ids()
    rows = [store.train_rows(c) for c in ids]
    ks = [store.read_xtx(c) for c in ids]
    assert all(k is not None for k in ks)
    return [r.read(0, N) for r in rows], [r.read_g(0, N) for r in rows], ks  # type: ignore[misc]


def test_fisher_k_is_the_gram_of_stored_g_in_any_split_and_scores(tmp_path, lm_checkpoints):
    # one checkpoint: the split is what varies here (the draws' model_id is covered by
    # tests/tasks/test_sampled_fisher.py, two checkpoints' K by the tests below)
    ckpts = lm_checkpoints[:1]
    a = lm_job(tmp_path / "a.zarr", ckpts)  # curvature auto: fisher for causal_lm
    result = run_in_process(a)
    store = FeatureStore.open(a.store.path, mode="r")
    assert store.spec.curvature == "fisher"
    xa, ga, ka = stored(a)
    for x, g, k in zip(xa, ga, ka, strict=True):
        np.testing.assert_allclose(k, gram(g), rtol=1e-12, atol=1e-12 * np.abs(k).max())
        assert np.abs(g - x).max() > 0.1 * np.abs(x).max()  # G is not X
    assert result.scores is not None
    # λ auto: 1.25 · tr(GᵀG) / p, the token-level Fisher's rank bound (here p = 32 > n = 16
    # documents of many tokens each), not / min(n, p) as for XᵀX
    # kinv_scaling auto: per_target for a causal LM's Fisher
    assert [r.variant for r in result.scores] == [variant_name(P, "auto", "per_target")]
    sset = store.score_set("targets", variant_name(P, "auto", "per_target"))
    assert sset is not None and P > N
    want = [AUTO_SCALE * float((g.astype(np.float64) ** 2).sum()) / P for g in ga]
    np.testing.assert_allclose(sset.attrs["lambdas"], want, rtol=1e-6)
    # per_target: target t's column of X (K + λ)⁻¹ t divided by √(yᵀ K y), y = (K + λ)⁻¹ t,
    # up to one factor for the whole matrix (traker's 1/√d and Q = 1); mean_abs would scale
    # all columns alike, and the norms differ here
    ts = store.target_rows("targets", 0)
    t = ts.read(0, ts.n).astype(np.float64)
    y = np.linalg.solve(ka[0] + want[0] * np.eye(P), t.T).T
    norms = np.sqrt(np.einsum("tp,pq,tq->t", y, ka[0], y))
    assert norms.max() > 1.5 * norms.min()
    ref = xa[0].astype(np.float64) @ (y / norms[:, None]).T
    got = sset.scores().astype(np.float64)
    factor = float((got * ref).sum() / (ref * ref).sum())
    assert factor > 0
    np.testing.assert_allclose(got, factor * ref, rtol=1e-3, atol=1e-4 * np.abs(got).max())
    # one train shard of two chunks instead of two shards, micro-batches of 3 rows (3, 3, 2 a
    # chunk) instead of 4, the shards in reverse (targets first): the same X, G and K
    b = lm_job(tmp_path / "b.zarr", ckpts, shard_rows=N, micro_batch=3)
    run_in_process(b, reverse=True)
    xb, gb, kb = stored(b)
    assert len(ka) == len(kb) == 1
    for one, two in zip([*xa, *ga, *ka], [*xb, *gb, *kb], strict=True):
        np.testing.assert_allclose(one, two, rtol=1e-4, atol=1e-5 * np.abs(one).max())


def test_a_resumed_run_and_the_stored_rows_reduce_to_the_same_k(tmp_path, lm_checkpoints):
    full = lm_job(tmp_path / "full.zarr", lm_checkpoints)
    run_in_process(full)
    _, _, k_full = stored(full)
    cfg = lm_job(tmp_path / "resume.zarr", lm_checkpoints)
    prep = prepare(cfg)
    worker = Worker(cfg, prep.checkpoints, prep.width)
    first, _ = worker.run(prep.train_tasks[1])  # rows [8, 16) of checkpoint 0, then "killed"
    assert first.rows_computed == CHUNK
    run_in_process(cfg)  # reuses the committed chunk: its G is read back, not recomputed
    _, _, k_resumed = stored(cfg)
    for one, two in zip(k_full, k_resumed, strict=True):
        np.testing.assert_allclose(one, two, rtol=1e-10, atol=1e-12 * np.abs(one).max())
    # the array mode's reduce: K from the committed rows, not from streamed partials
    store = FeatureStore.open(cfg.store.path)
    del store.root["train/0/xtx"]
    Reducer(store).reduce_stored(0)
    k_rows = store.read_xtx(0)
    assert k_rows is not None
    np.testing.assert_allclose(k_rows, k_full[0], rtol=1e-10, atol=1e-12 * np.abs(k_rows).max())


def test_the_store_records_the_curvature(tmp_path, lm_checkpoints):
    cfg = lm_job(tmp_path / "c.zarr", lm_checkpoints, curvature="xtx")
    run_in_process(cfg)
    store = FeatureStore.open(cfg.store.path, mode="r")
    assert store.spec.curvature == "xtx" and store.train_rows(0).G is None
    x, k = store.train_rows(0).read(0, N), store.read_xtx(0)
    np.testing.assert_allclose(k, gram(x), rtol=1e-12, atol=1e-12 * np.abs(x).max() ** 2)
    fisher = dataclasses.replace(
        cfg, featurize=dataclasses.replace(cfg.featurize, curvature="auto")
    )
    with pytest.raises(StoreMismatchError, match="curvature: store has 'xtx', requested 'fisher'"):
        prepare(fisher)


def test_label_draws_average_their_grams_in_any_split(tmp_path, lm_checkpoints):
    """``featurize.fisher_draws=2``: G holds both draws, draw 0 is the one-draw job's G (the
    same uniforms), draw 1 another, and K is the mean of their Grams: streamed by the workers
    in any split, and reduced again from the committed rows alike."""
    ckpts = lm_checkpoints[:1]
    one = lm_job(tmp_path / "one.zarr", ckpts)
    two = lm_job(tmp_path / "two.zarr", ckpts, fisher_draws=2)
    run_in_process(one)
    run_in_process(two)
    store = FeatureStore.open(two.store.path)
    assert (store.spec.curvature, store.spec.fisher_draws) == ("fisher", 2)
    gs = store.train_rows(0).read_gs(0, N).astype(np.float64)
    assert gs.shape == (N, 2, P)
    np.testing.assert_array_equal(gs[:, 0], stored(one)[1][0])
    assert np.abs(gs[:, 1] - gs[:, 0]).max() > 0.1 * np.abs(gs[:, 0]).max()
    want = (gs[:, 0].T @ gs[:, 0] + gs[:, 1].T @ gs[:, 1]) / 2
    k = store.read_xtx(0)
    assert k is not None
    np.testing.assert_allclose(k, want, rtol=1e-10, atol=1e-12 * np.abs(want).max())
    # one shard, micro-batches of 3: the same K
    split = lm_job(tmp_path / "split.zarr", ckpts, fisher_draws=2, shard_rows=N, micro_batch=3)
    run_in_process(split)
    k_split = FeatureStore.open(split.store.path, mode="r").read_xtx(0)
    np.testing.assert_allclose(k_split, k, rtol=1e-4, atol=1e-5 * np.abs(k).max())
    # the array mode's reduce, from the committed rows of both draws
    del store.root["train/0/xtx"]
    Reducer(store).reduce_stored(0)
    np.testing.assert_allclose(store.read_xtx(0), k, rtol=1e-10, atol=1e-12 * np.abs(k).max())


def test_label_draws_need_the_fisher_and_must_match_the_store(tmp_path, lm_checkpoints):
    xtx = lm_job(tmp_path / "x.zarr", lm_checkpoints, curvature="xtx", fisher_draws=3)
    with pytest.raises(ConfigError, match="fisher_draws=3 draws labels for the sampled-label"):
        prepare(xtx)
    assert not Path(xtx.store.path).exists()  # refused before the store is created
    cfg = lm_job(tmp_path / "d.zarr", lm_checkpoints[:1], fisher_draws=2)
    run_in_process(cfg)
    again = dataclasses.replace(cfg, featurize=dataclasses.replace(cfg.featurize, fisher_draws=1))
    with pytest.raises(StoreMismatchError, match="fisher_draws: store has 2, requested 1"):
        prepare(again)


def test_the_run_report_names_what_auto_resolved_to(tmp_path, lm_checkpoints):
    """``featurize.curvature=auto`` and ``scoring.kinv_scaling=auto`` on a causal LM: the
    report says the Fisher with its draws and the per-target weights (read from the store and
    the score set), where the config only said ``auto``; an XᵀX job says XᵀX and traker's
    weights."""
    cfg = lm_job(tmp_path / "r.zarr", lm_checkpoints, fisher_draws=2)
    summary = summarize(run_in_process(cfg))
    assert summary["method"] == {
        "projection": "kronecker",
        "grad_dim": sum(p.numel() for p in tiny_lm.make_model(n_embd=16).parameters()),
        "proj_dim": P,
        "dtype": "float32",
        "curvature": "fisher",
        "fisher_draws": 2,
    }
    (variant,) = summary["variants"]
    assert variant["kinv_scaling"] == "per_target"
    text = to_markdown(summary)
    d = summary["method"]["grad_dim"]
    assert (
        f"- method: kronecker projection of {d:,} gradient entries to p = {P} (float32); "
        "K = GᵀG of the sampled-label Fisher (2 label draws per train example)"
    ) in text
    assert "- checkpoints combined: per_target (each checkpoint weighs the same" in text
    xtx = lm_job(tmp_path / "x.zarr", lm_checkpoints[:1], curvature="xtx")
    text = to_markdown(summarize(run_in_process(xtx)))
    assert f"to p = {P} (float32); K = XᵀX of the train features" in text
    assert "- checkpoints combined: mean_abs (each K⁻¹ divided by its mean |entry|" in text
