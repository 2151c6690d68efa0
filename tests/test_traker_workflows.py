"""traker 0.3.2's documented workflows, replayed on trak_dist.TRAKer and on traker itself.

Where both use the same projection (traker's NoOpProjector, its BasicProjector, or a user's
projector passed to both), the scores must agree at rtol 1e-4 with an absolute floor of
1e-4·max|S|: the remaining difference is traker's float32 inverse of XᵀX against our float64
eigendecomposition (``test_traker.py`` shows ours is the closer one to an exact solve). Where
the projection is our own, the scores cannot be equal; their quality is compared instead.

Data: 300 training and 40 target digits from scikit-learn, a 64-8-10 MLP (d = 610), three
checkpoints trained from different seeds in well under a second.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from torch import nn
from trak.projectors import AbstractProjector

from tests.fixtures.helpers import one_thread
from tests.fixtures.traker_jobs import (
    LAMBDA,
    TARGET_SHARDS,
    TRAIN_SHARDS,
    M,
    N,
    digits,
    make_model,
    noop_kwargs,
)
from tests.fixtures.traker_jobs import train_states as _train_states
from trak_dist import TRAKer
from trak_dist.gradients import GradientComputer
from trak_dist.store import FeatureStore, row_hashes
from trak_dist.store.verify import verify

JOBS = Path(__file__).parent / "fixtures" / "traker_jobs.py"


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Two intra-op threads on this shared 2-core machine turn milliseconds into seconds (they
    spin while other processes hold the cores); these models are far too small to gain."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def states():
    return _train_states()


@pytest.fixture(scope="module")
def ckpt_dir(states, tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    for i, st in enumerate(states):
        torch.save(st, root / f"ckpt_{i}.pt")
    return root


def quickstart(cls, save_dir, states, task="image_classification", batch=50, **kw):
    """traker's quickstart: featurize every checkpoint, finalize, score every checkpoint."""
    (x, y), (xt, yt) = digits()
    traker = cls(model=make_model(), task=task, train_set_size=N, save_dir=str(save_dir), **kw)
    for model_id, ckpt in enumerate(states):
        traker.load_checkpoint(ckpt, model_id=model_id)
        for b in range(0, N, batch):
            traker.featurize(batch=(x[b : b + batch], y[b : b + batch]), num_samples=batch)
    traker.finalize_features()
    for model_id, ckpt in enumerate(states):
        traker.start_scoring_checkpoint("exp", ckpt, model_id=model_id, num_targets=M)
        traker.score(batch=(xt, yt), num_samples=M)
    return traker, np.asarray(traker.finalize_scores(exp_name="exp"), dtype=np.float64)


def assert_same_scores(ours, ref):
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def run_jobs(job: str, count: int, save_dir: Path, ckpt_dir: Path) -> None:
    """Start ``count`` real processes at once and wait for all of them."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(JOBS), job, str(k), str(save_dir), str(ckpt_dir)],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for k in range(count)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]


def test_featurize_before_load_checkpoint_is_an_assertion_error(tmp_path):
    from trak import TRAKer as Traker

    (x, y), _ = digits()
    for cls in (Traker, TRAKer):
        traker = cls(
            model=make_model(), task="image_classification", train_set_size=N,
            save_dir=str(tmp_path / cls.__module__), **noop_kwargs(),
        )  # fmt: skip
        with pytest.raises(AssertionError, match="load_checkpoint before featurizing"):
            traker.featurize(batch=(x[:5], y[:5]), num_samples=5)


@pytest.mark.slow
def test_quickstart_with_our_projection_is_as_good_as_traker_s(states, tmp_path):
    """The quickstart as written (default projector, half precision). traker's CPU default is
    a normal projection, ours a Rademacher one, so the scores differ; what both approximate is
    TRAK without projection, and their quality is how well they do: the mean correlation, per
    target, with the unprojected scores (an LDS measured on retrained models has the same
    projection error plus retraining noise). Four seeds of each; the means must agree within
    three standard errors of their difference."""
    from trak import TRAKer as Traker

    _, exact = quickstart(TRAKer, tmp_path / "exact", states, **noop_kwargs())

    def quality(scores):
        return np.mean([np.corrcoef(scores[:, j], exact[:, j])[0, 1] for j in range(M)])

    kw = dict(proj_dim=64, lambda_reg=LAMBDA, device="cpu", logging_level=logging.ERROR)
    q = {
        cls.__module__: [
            quality(quickstart(cls, tmp_path / f"{cls.__module__}{s}", states, **kw,
                               projector_seed=s)[1])
            for s in range(4)
        ]
        for cls in (Traker, TRAKer)
    }  # fmt: skip
    ours, theirs = np.array(q["trak_dist.traker"]), np.array(q["trak.traker"])
    assert theirs.min() > 0.4, theirs  # a projection worth comparing with
    se = np.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    assert abs(ours.mean() - theirs.mean()) < 3 * se + 1e-3, (ours, theirs)


@pytest.mark.slow
def test_slurm_tutorial_three_processes_then_gather(states, ckpt_dir, tmp_path):
    """traker's SLURM tutorial: one process per checkpoint, all started together, each with
    load_from_save_dir=(model_id == 0), then gather.py calls finalize_scores. traker runs the
    same jobs one after the other (its own test_parallel does so: its jobs race on
    experiments.json when started together)."""
    from trak import TRAKer as Traker

    run_jobs("slurm", 3, tmp_path / "ours", ckpt_dir)
    gather = TRAKer(
        model=make_model(), task="image_classification", train_set_size=N,
        save_dir=str(tmp_path / "ours"), **noop_kwargs(),
    )  # fmt: skip
    ours = np.asarray(gather.finalize_scores(exp_name="exp"), dtype=np.float64)

    (x, y), (xt, yt) = digits()
    for model_id, ckpt in enumerate(states):
        job = Traker(
            model=make_model(), task="image_classification", train_set_size=N,
            save_dir=str(tmp_path / "ref"), load_from_save_dir=model_id == 0, **noop_kwargs(),
        )  # fmt: skip
        job.load_checkpoint(ckpt, model_id=model_id)
        for b in range(0, N, 50):
            job.featurize(batch=(x[b : b + 50], y[b : b + 50]), num_samples=50)
        job.finalize_features(model_ids=[model_id])
        job.start_scoring_checkpoint("exp", ckpt, model_id=model_id, num_targets=M)
        job.score(batch=(xt, yt), num_samples=M)
    ref_gather = Traker(
        model=make_model(), task="image_classification", train_set_size=N,
        save_dir=str(tmp_path / "ref"), **noop_kwargs(),
    )  # fmt: skip
    ref = np.asarray(ref_gather.finalize_scores(exp_name="exp"), dtype=np.float64)
    assert_same_scores(ours, ref)
    # the read-only saver view says what traker's saver says
    assert gather.saver.model_ids == ref_gather.saver.model_ids
    exp = gather.saver.experiments["exp"]
    assert exp["num_targets"] == ref_gather.saver.experiments["exp"]["num_targets"] == M
    assert exp["scores_finalized"] == 1
    np.testing.assert_array_equal(zarr.open_array(exp["scores_path"], mode="r")[:], ours)
    assert gather.saver.metadata["train set size"] == ref_gather.saver.metadata["train set size"]


@pytest.mark.slow
def test_shards_across_processes_with_unaligned_boundaries(states, ckpt_dir, tmp_path):
    """Three processes at once, each featurising and scoring a slice of the rows (boundaries
    97 and 211 in 64-row chunks, batches in shuffled order, ``inds=``) for every checkpoint;
    then one finalize. traker does the same slices one process after the other."""
    from trak import TRAKer as Traker

    run_jobs("shard", 3, tmp_path / "ours", ckpt_dir)
    # what the processes left (rows committed or staged, not all folded yet) checks clean
    report = verify(tmp_path / "ours")
    assert report.problems == [] and report.chunks_checked > 0
    gather = TRAKer(
        model=make_model(), task="image_classification", train_set_size=N,
        save_dir=str(tmp_path / "ours"), chunk_rows=64, **noop_kwargs(),
    )  # fmt: skip
    ours = np.asarray(gather.finalize_scores(exp_name="exp"), dtype=np.float64)

    (x, y), (xt, yt) = digits()
    # every row folded into X with the hash of its own item, and the store checks clean
    store = FeatureStore.open(tmp_path / "ours", mode="r")
    for model_id in range(len(states)):
        for rows, items in (
            (store.train_rows(model_id), (x, y)),
            (store.target_rows("exp", model_id), (xt, yt)),
        ):
            assert rows.is_complete() and "staged" not in rows.group
            got = rows.read_hashes(slice(0, rows.n), checked=True)
            np.testing.assert_array_equal(got, row_hashes(list(items)))
    assert verify(tmp_path / "ours").problems == []

    def ref_traker():
        return Traker(
            model=make_model(), task="image_classification", train_set_size=N,
            save_dir=str(tmp_path / "ref"), **noop_kwargs(),
        )  # fmt: skip

    for k in range(3):
        for model_id, ckpt in enumerate(states):
            job = ref_traker()
            job.load_checkpoint(ckpt, model_id=model_id)
            inds = np.arange(TRAIN_SHARDS[k], TRAIN_SHARDS[k + 1])
            job.featurize(batch=(x[inds], y[inds]), inds=inds)
    ref_traker().finalize_features()  # traker scores only finalized checkpoints
    for k in range(3):
        for model_id, ckpt in enumerate(states):
            job = ref_traker()
            job.start_scoring_checkpoint("exp", ckpt, model_id=model_id, num_targets=M)
            inds = np.arange(TARGET_SHARDS[k], TARGET_SHARDS[k + 1])
            job.score(batch=(xt[inds], yt[inds]), inds=inds)
    ref = np.asarray(ref_traker().finalize_scores(exp_name="exp"), dtype=np.float64)
    assert_same_scores(ours, ref)
    # and the same as our own single process, to float rounding of the per-sample gradients
    _, single = quickstart(TRAKer, tmp_path / "single", states, chunk_rows=64, **noop_kwargs())
    np.testing.assert_allclose(ours, single, rtol=1e-6, atol=1e-6 * np.abs(single).max())


class PerLayerProjector(AbstractProjector):
    """A user's own projector in traker's protocol: it reads the per-parameter gradients by name
    (so it must receive traker's dict, not a flat tensor) and ignores model_id."""

    def __init__(self, model: nn.Module, proj_dim: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.mats = {
            name: torch.randn(p.numel(), proj_dim, generator=g) / np.sqrt(proj_dim)
            for name, p in model.named_parameters()
        }
        d = sum(m.shape[0] for m in self.mats.values())
        super().__init__(d, proj_dim, seed, "normal", "cpu")

    def project(self, grads, model_id):
        assert isinstance(grads, dict) and list(grads) == list(self.mats)
        return sum(grads[name].flatten(1) @ mat for name, mat in self.mats.items())

    def free_memory(self):
        pass


@pytest.mark.parametrize("which", ["BasicProjector", "user subclass"])
def test_custom_projector(which, states, tmp_path):
    """traker's tutorial pattern ``TRAKer(..., projector=...)`` with traker's BasicProjector and
    with a user's projector: each TRAKer gets its own, identically built instance."""
    from trak import TRAKer as Traker
    from trak.projectors import BasicProjector

    def projector():
        if which == "BasicProjector":
            return BasicProjector(
                grad_dim=610, proj_dim=64, seed=0, proj_type="rademacher", device="cpu"
            )
        return PerLayerProjector(make_model(), proj_dim=64, seed=0)

    kw = {**noop_kwargs(), "lambda_reg": 1e-3}
    _, ref = quickstart(Traker, tmp_path / "ref", states[:2], **{**kw, "projector": projector()})
    ours_t, ours = quickstart(
        TRAKer, tmp_path / "ours", states[:2], **{**kw, "projector": projector()}
    )
    assert_same_scores(ours, ref)
    assert ours_t.store.spec.projection.startswith("traker:")  # never mixed with our own P


def test_custom_model_output_in_a_directory_traker_already_uses(states, tmp_path):
    """A user's AbstractModelOutput subclass (log-probability of the label, Q = 1), given to
    both as an instance; ours writes its store into the save_dir traker already filled, which
    must work without zarr warnings (pytest turns warnings into errors here)."""
    from trak import TRAKer as Traker
    from trak.modelout_functions import AbstractModelOutput

    class LogProb(AbstractModelOutput):
        def __init__(self):
            super().__init__()

        @staticmethod
        def get_output(model, weights, buffers, image, label):
            logits = torch.func.functional_call(model, (weights, buffers), image.unsqueeze(0))
            return torch.log_softmax(logits, -1).gather(1, label.view(1, 1)).sum()

        def get_out_to_loss_grad(self, model, weights, buffers, batch):
            return torch.ones(batch[0].shape[0], 1)

    save_dir = tmp_path / "shared"
    (save_dir / "checkpoints").mkdir(parents=True)
    _, ref = quickstart(Traker, save_dir, states[:2], task=LogProb(), **noop_kwargs())
    assert (save_dir / "metadata.json").exists()
    _, ours = quickstart(TRAKer, save_dir, states[:2], task=LogProb(), **noop_kwargs())
    assert_same_scores(ours, ref)


def test_iterative_gradient_computer(states, tmp_path):
    """``gradient_computer=IterativeGradientComputer`` with
    ``task='iterative_image_classification'``, as traker documents it; then the same computer
    with our own projection equals our default vmap engine with it (the [B, d] tensor it
    returns reaches our projector correctly)."""
    from trak import TRAKer as Traker
    from trak.gradient_computers import IterativeGradientComputer

    kw = dict(task="iterative_image_classification", gradient_computer=IterativeGradientComputer)
    _, ref = quickstart(Traker, tmp_path / "ref", states[:2], **kw, **noop_kwargs())
    _, ours = quickstart(TRAKer, tmp_path / "ours", states[:2], **kw, **noop_kwargs())
    assert_same_scores(ours, ref)

    ours_kw = dict(proj_dim=64, use_half_precision=False, lambda_reg=LAMBDA, device="cpu")
    _, loop = quickstart(TRAKer, tmp_path / "loop", states[:2], **kw, **ours_kw)
    _, vmap = quickstart(
        TRAKer, tmp_path / "vmap", states[:2], gradient_computer=GradientComputer, **ours_kw
    )
    np.testing.assert_allclose(loop, vmap, rtol=1e-5, atol=1e-5 * np.abs(vmap).max())


class TinyCLIP(nn.Module):
    """open_clip's calling convention: ``model(image, text) -> (image_emb, text_emb, scale)``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.visual = nn.Linear(16, 8)
        self.tokens = nn.Embedding(20, 8)
        self.logit_scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, image, text):
        image_emb = nn.functional.normalize(self.visual(image), dim=-1)
        text_emb = nn.functional.normalize(self.tokens(text).mean(-2), dim=-1)
        return image_emb, text_emb, self.logit_scale.exp()


def test_clip(tmp_path, monkeypatch):
    """``task='clip'`` after ``traker.task.get_embeddings(...)``. With a simulated batch of
    n − 1 pairs, traker's draw (weights ∝ index, without replacement) always picks rows 1..n−1,
    so the output is deterministic and both must agree. traker's get_embeddings only runs on
    CUDA, so its class gets the embeddings ours computed on the CPU. traker 0.3.2's own
    ``task='clip'`` fails on any batch of more than one pair (its CLIPModelOutput returns Q as
    [B], its store wants [B, 1]; with batches of one, Q = 1 − 1 = 0), so traker gets the same
    class with Q reshaped, the only change; ours takes the string.
    """
    from trak import TRAKer as Traker
    from trak.modelout_functions import CLIPModelOutput

    n, m = 60, 10
    g = torch.Generator().manual_seed(0)
    images = torch.randn(n + m, 16, generator=g)
    texts = torch.randint(0, 20, (n + m, 5), generator=g)
    train, targets = (images[:n], texts[:n]), (images[n:], texts[n:])
    loader = [(images[b : b + 20], texts[b : b + 20]) for b in range(0, n, 20)]
    model = TinyCLIP()
    ckpt = {k: v.clone() for k, v in model.state_dict().items()}

    class CLIPWithQ2D(CLIPModelOutput):
        def get_out_to_loss_grad(self, model, weights, buffers, batch):
            return super().get_out_to_loss_grad(model, weights, buffers, batch).unsqueeze(-1)

    def run(cls, save_dir, prepare, task):
        traker = cls(model=model, task=task, train_set_size=n, save_dir=str(save_dir),
                     **noop_kwargs())  # fmt: skip
        traker.task.sim_batch_size = n - 1
        prepare(traker)
        traker.load_checkpoint(ckpt, model_id=0)
        traker.featurize(batch=train, num_samples=n)
        traker.finalize_features()
        traker.start_scoring_checkpoint("exp", ckpt, model_id=0, num_targets=m)
        traker.score(batch=targets, num_samples=m)
        return np.asarray(traker.finalize_scores(exp_name="exp"), dtype=np.float64)

    def ours_embeddings(traker):
        traker.load_checkpoint(ckpt, model_id=0)
        with pytest.raises(AssertionError, match="get_embeddings"):  # traker's error type
            traker.featurize(batch=train, num_samples=n)
        traker.task.get_embeddings(model, loader, batch_size=20, embedding_dim=8, size=n)
        embeddings.update(img=traker.task.image_embeddings, txt=traker.task.text_embeddings)

    def traker_embeddings(traker):
        for name, value in (("image_embeddings", embeddings["img"]),
                            ("text_embeddings", embeddings["txt"]),
                            ("num_computed_embeddings", n), ("sim_batch_size", n - 1)):  # fmt: skip
            monkeypatch.setattr(CLIPModelOutput, name, value)

    embeddings: dict = {}
    ours = run(TRAKer, tmp_path / "ours", ours_embeddings, "clip")
    ref = run(Traker, tmp_path / "ref", traker_embeddings, CLIPWithQ2D())
    assert_same_scores(ours, ref)
    assert np.abs(ours).max() > 0
