"""The Kronecker projection: against the dense formula (A ⊗ B times the formed per-sample gradient,
factors from an independent Philox), hooks vs vmap vs the explicit matrix, prefix, statistics,
and the store's record of it."""

import numpy as np
import pytest
import torch
from torch import nn

from tests.fixtures.helpers import MASK, classification_data, philox_scalar
from trak_dist import TRAKer
from trak_dist.errors import StoreMismatchError
from trak_dist.featurize import build_featurizer
from trak_dist.gradients import GradientComputer, HookGradientComputer, kronecker_views
from trak_dist.projection import FactorBlock, KroneckerProjector
from trak_dist.projection._kron_views import shell_pairs
from trak_dist.projection._kronecker import LEFT_KEY_TWEAK, RIGHT_KEY_TWEAK
from trak_dist.tasks import ImageClassification, margin

SEED, MODEL_ID = 2**40 + 7, 5


def factor(offset: int, n: int, k: int, tweak: int) -> torch.Tensor:
    """``[n, k]`` ±1 straight from docs/projection.md, with Python-int Philox."""
    key = (SEED & MASK, (SEED >> 32) ^ tweak)
    out = torch.empty(n, k, dtype=torch.float64)
    for r in range(n):
        i = offset + r
        words = philox_scalar((i & MASK, i >> 32, 0, MODEL_ID), key)  # columns 0..127
        for u in range(k):
            out[r, u] = 1 - 2 * ((words[u >> 5] >> (u & 31)) & 1)
    return out


def pairs(p: int) -> list[tuple[int, int]]:
    """The docs' column order: shells s = 0, 1, …: (s, 0..s-1), (0..s-1, s), (s, s)."""
    out, s = [], 0
    while len(out) < p:
        out += [(s, r) for r in range(s)] + [(r, s) for r in range(s)] + [(s, s)]
        s += 1
    return out[:p]


def test_shell_pairs_follow_the_documented_order():
    u, v = shell_pairs(200)
    assert list(zip(u.tolist(), v.tolist(), strict=True)) == pairs(200)


class Conv1DModel(nn.Module):
    """transformers' Conv1D (weight [in, out]) between two tiny layers."""

    def __init__(self):
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.proj = Conv1D(72, 64)
        self.out = nn.Linear(72, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.proj(x)).mean(1))


def linear_case():
    model = nn.Sequential(nn.Linear(64, 72), nn.Tanh(), nn.Linear(72, 3))
    return model, "0.weight", torch.randn(4, 64)


def conv_case():
    model = nn.Sequential(nn.Conv2d(8, 64, 3), nn.Tanh(), nn.Flatten(), nn.Linear(64 * 9, 3))
    return model, "0.weight", torch.randn(4, 8, 5, 5)


def embedding_case():
    class Bag(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 64, padding_idx=0)
            self.out = nn.Linear(64, 3)

        def forward(self, ids):
            return self.out(torch.tanh(self.emb(ids)).mean(1))

    ids = torch.randint(0, 100, (4, 6))
    ids[0, :2] = 0  # padding positions contribute nothing
    return Bag(), "emb.weight", ids


def conv1d_hf_case():
    return Conv1DModel(), "proj.weight", torch.randn(4, 5, 64)


@pytest.mark.parametrize("case", [linear_case, conv_case, embedding_case, conv1d_hf_case])
def test_one_module_equals_the_kronecker_product_on_the_formed_gradient(case):
    torch.manual_seed(0)
    model, name, x = case()
    y = torch.randint(0, 3, (x.shape[0],))
    p = 60
    computer = HookGradientComputer(model, ImageClassification(), [name])
    featurizer = build_featurizer(computer, "kronecker", p, SEED)
    projector = featurizer.projector
    (view,) = projector.views
    got, kinds = [], []

    def sink(blocks):
        kinds.extend(type(b) for b in blocks)
        got.append(projector.project(blocks, MODEL_ID))

    computer.stream((x, y), sink)
    assert kinds == [FactorBlock]  # projected from the factors: the gradient was never formed
    # the dense formula: per-sample gradient by autograd, times (A ⊗ B) column by column
    param = dict(model.named_parameters())[name]
    g = torch.stack(
        [
            torch.autograd.grad(margin(model(x[i : i + 1]), y[i : i + 1]).sum(), param)[0]
            for i in range(x.shape[0])
        ]
    ).reshape(x.shape[0], -1)
    k = int(np.ceil(np.sqrt(p)))
    left = factor(view.offset, view.rows, k, LEFT_KEY_TWEAK)
    right = factor(view.offset, view.cols, k, RIGHT_KEY_TWEAK)
    dense = torch.stack([torch.kron(left[:, u], right[:, v]) for u, v in pairs(p)], dim=1)
    want = g.double() @ dense
    torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=1e-6 * want.abs().max())


class Mixed(nn.Module):
    """Factor views (64×72, 72×64), a narrow head (near-square view), norms and biases."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.fc1 = nn.Linear(8, 64)
        self.ln = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 72)
        self.fc3 = nn.Linear(72, 64)
        self.head = nn.Linear(64, 3)

    def forward(self, x):
        h = torch.tanh(self.ln(self.fc1(x)))
        return self.head(torch.tanh(self.fc3(torch.tanh(self.fc2(h)))))


@pytest.mark.parametrize("p", [50, 130])
def test_hooks_vmap_and_the_explicit_matrix_agree(p):
    model, task = Mixed(), ImageClassification()
    x, y = classification_data(6)
    hooks = build_featurizer(HookGradientComputer(model, task), "kronecker", p, SEED)
    vmap = build_featurizer(GradientComputer(model, task), "kronecker", p, SEED)
    cols = [v.cols for v in hooks.projector.views]
    assert cols[4] == 64 and cols[6] == 72  # fc2, fc3 weights: their modules' views
    got, via_vmap = hooks.project((x, y), MODEL_ID), vmap.project((x, y), MODEL_ID)
    grads = GradientComputer(model, task).per_sample_grads((x, y))
    g = torch.cat([t.reshape(6, -1) for t in grads.values()], 1)
    want = g @ hooks.projector.matrix(MODEL_ID) / hooks.normalize_factor
    for x_ in (got, via_vmap):
        torch.testing.assert_close(x_, want, rtol=1e-4, atol=1e-5 * want.abs().max())


def test_concatenated_blocks_equal_their_explicit_matrix():
    model, task = Mixed(), ImageClassification()
    x, y = classification_data(6)
    computer = GradientComputer(model, task)
    views = kronecker_views(model, computer.layout)
    projector = KroneckerProjector(computer.layout.grad_dim, 200, SEED, views, share="concat")
    g = torch.cat([t.reshape(6, -1) for t in computer.per_sample_grads((x, y)).values()], 1)
    want = g @ projector.matrix(MODEL_ID)
    torch.testing.assert_close(projector.project(g, MODEL_ID), want, rtol=1e-4, atol=1e-5)
    # each parameter owns its own columns
    first = projector.matrix(MODEL_ID, 0, views[0].numel)
    assert (first.abs().sum(0) > 0).sum() == 200 // len(views) + (200 % len(views) > 0)


def test_prefix_property_a_smaller_p_is_the_first_columns():
    model, task = Mixed(), ImageClassification()
    x, y = classification_data(6)
    computer = HookGradientComputer(model, task)
    wide = build_featurizer(computer, "kronecker", 130, SEED).project((x, y), MODEL_ID)
    for p in (1, 17, 49, 50):
        narrow = build_featurizer(computer, "kronecker", p, SEED).project((x, y), MODEL_ID)
        torch.testing.assert_close(wide[:, :p], narrow, rtol=1e-5, atol=1e-6)


def test_squared_norms_are_preserved_on_average():
    """E‖Pᵀg‖² = p‖g‖² for Kronecker P (its rows are orthogonal in expectation): over 300
    checkpoints' matrices, the mean ratio is 1 within 5 standard errors."""
    view_model = nn.Sequential(nn.Linear(72, 64, bias=False))
    computer = GradientComputer(view_model, ImageClassification())
    views = kronecker_views(view_model, computer.layout)
    projector = KroneckerProjector(computer.layout.grad_dim, 64, SEED, views)
    g = torch.randn(1, computer.layout.grad_dim, generator=torch.Generator().manual_seed(0))
    ratios = torch.tensor(
        [
            float(projector.project(g, mid).square().sum() / (64 * g.square().sum()))
            for mid in range(300)
        ]
    )
    assert abs(float(ratios.mean()) - 1) < 5 * float(ratios.std()) / np.sqrt(300)


def traker(model, save_dir, **kw):
    return TRAKer(
        model=model,
        task="image_classification",
        train_set_size=40,
        save_dir=save_dir,
        device="cpu",
        proj_dim=32,
        use_half_precision=False,
        **kw,
    )


def test_the_store_records_the_kronecker_projection(tmp_path):
    store = tmp_path / "k"
    model = nn.Sequential(nn.Linear(96, 64, bias=False))
    first = traker(model, store, projection="kronecker")
    assert first.store.spec.projection == "kronecker"
    assert first.store.spec.projection_params.startswith("share=sum pairs=shell views=")
    with pytest.raises(StoreMismatchError, match="projection: store has 'kronecker'"):
        traker(model, store, projection="rademacher")
    # same d, differently shaped layer: another matrix
    other = nn.Sequential(nn.Linear(64, 96, bias=False))
    with pytest.raises(StoreMismatchError, match="projection_params"):
        traker(other, store, projection="kronecker")
    traker(model, store, projection="kronecker")  # same settings reopen fine


@pytest.mark.parametrize("engine", ["hooks", "vmap"])
def test_traker_scores_equal_a_dense_solve_with_the_kronecker_matrix(tmp_path, engine):
    model, task = Mixed(), ImageClassification()
    (x, y), (xt, yt) = classification_data(40, seed=2), classification_data(7, seed=3)
    states = [Mixed().state_dict(), {k: v * 1.1 for k, v in Mixed().state_dict().items()}]
    lam, p = 1e-2, 32
    t = traker(model, tmp_path / engine, projection="kronecker", gradient_engine=engine,
               lambda_reg=lam, projector_seed=SEED)  # fmt: skip
    assert type(t.computer) is (HookGradientComputer if engine == "hooks" else GradientComputer)
    for i, st in enumerate(states):
        t.load_checkpoint(st, model_id=i)
        t.featurize((x, y), num_samples=40)
    t.finalize_features()
    for i, st in enumerate(states):
        t.start_scoring_checkpoint("exp", st, model_id=i, num_targets=7)
        t.score((xt, yt), num_samples=7)
    ours = np.asarray(t.finalize_scores("exp"), dtype=np.float64)
    s, q = 0, 0
    for c, st in enumerate(states):
        model.load_state_dict(st)
        comp = GradientComputer(model, task)
        proj = build_featurizer(comp, "kronecker", p, SEED).projector.matrix(c).double()
        d = comp.layout.grad_dim

        def feats(a, b, comp=comp, proj=proj, d=d):
            g = comp.per_sample_grads((a, b))
            return (
                torch.cat([v.reshape(len(a), -1) for v in g.values()], 1).double() @ proj / d**0.5
            )

        g, gt = feats(x, y), feats(xt, yt)
        kinv = torch.linalg.inv(g.T @ g + lam * torch.eye(p, dtype=torch.float64))
        s = s + g @ (kinv / kinv.abs().mean()) @ gt.T
        q = q + comp.out_to_loss((x, y)).double()
    exact = (s / 2 * (q / 2)[:, None]).numpy()
    np.testing.assert_allclose(ours, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())
