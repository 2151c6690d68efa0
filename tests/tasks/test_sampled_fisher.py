"""The sampled-label Fisher's rows G (``featurize.curvature=fisher``, trak_dist/tasks/_sampled.py)
against an independent reference: per document, labels drawn by ``torch.searchsorted`` in
float64 from the same uniforms, the gradient of their log-likelihood by plain autograd on the
unpadded document alone, projected with the dense Rademacher matrix."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.fixtures.hf_models import gpt2_lm, padded_tokens, text_batch
from trak_dist.errors import ConfigError
from trak_dist.featurize import build_featurizer
from trak_dist.gradients import ParamLayout, make_computer
from trak_dist.projection import rademacher_block, uniform_rows
from trak_dist.tasks import resolve_curvature, resolve_task

SEED, MODEL_ID, P = 7, 2, 48


def reference_rows(model, ids, mask, start: int) -> np.ndarray:
    """``[B, P]`` float64: autograd, one unpadded document at a time."""
    layout = ParamLayout.of(model, None)
    named = dict(model.named_parameters())
    proj = rademacher_block(SEED, MODEL_ID, 0, layout.grad_dim, 0, P, torch.float64)
    out = []
    for i in range(ids.shape[0]):
        length = int(mask[i].sum())
        u = uniform_rows(SEED, MODEL_ID, torch.tensor([start + i]), ids.shape[1])[0]
        z = model(input_ids=ids[i : i + 1, :length]).logits[0, :-1]
        with torch.no_grad():
            cdf = torch.softmax(z.double(), -1).cumsum(-1)
            # position t (predicting token t + 1) draws with the uniform of column t + 1
            draws = torch.searchsorted(cdf, (u[1:length] * cdf[:, -1]).double()[:, None])
            draws = draws.reshape(-1).clamp(max=z.shape[-1] - 1)
        loglik = torch.log_softmax(z, -1).gather(-1, draws[:, None]).sum()
        grads = torch.autograd.grad(loglik, [named[n] for n in layout.names])
        flat = torch.cat([g.reshape(-1).double() for g in grads])
        out.append((flat @ proj / math.sqrt(layout.grad_dim)).numpy())
    return np.stack(out)


@pytest.mark.parametrize("engine", ["hooks", "vmap"])
def test_fisher_rows_equal_an_autograd_loop_with_the_same_draws(engine):
    model = gpt2_lm("eager", seed=1)
    ids, mask = padded_tokens(6, length=9, seed=3)
    task = resolve_task("causal_lm")
    computer = make_computer(model, task, None, "cpu", engine)
    featurizer = build_featurizer(
        computer, "rademacher", P, SEED, micro_batch=4, curvature="fisher"
    )
    batch = {"input_ids": ids, "attention_mask": mask}
    g = featurizer.fisher(batch, MODEL_ID, start=5).double().numpy()
    ref = reference_rows(model, ids, mask, start=5)
    err = np.abs(g - ref).max() / np.abs(ref).max()
    assert err < 1e-4, err
    # the draws are not the data: G differs from the margin rows X
    x = featurizer.project(batch, MODEL_ID).double().numpy()
    assert np.abs(x - g).max() > 0.1 * np.abs(ref).max()


def test_rows_draw_alike_in_any_batch_split_order_or_padding():
    model = gpt2_lm(seed=2)
    ids, mask = padded_tokens(8, length=10, seed=4)
    computer = make_computer(model, resolve_task("causal_lm"), None, "cpu", "hooks")
    featurizer = build_featurizer(computer, "kronecker", P, SEED, micro_batch=3, curvature="fisher")
    whole = featurizer.fisher({"input_ids": ids, "attention_mask": mask}, MODEL_ID, 0)
    # rows 4..7 alone, padded wider: the same rows (their uniforms follow the row index)
    wide_ids = torch.nn.functional.pad(ids[4:], (0, 3))
    wide_mask = torch.nn.functional.pad(mask[4:], (0, 3))
    featurizer.micro_batch = 8
    part = featurizer.fisher({"input_ids": wide_ids, "attention_mask": wide_mask}, MODEL_ID, 4)
    torch.testing.assert_close(part, whole[4:], rtol=1e-4, atol=1e-5 * float(whole.abs().max()))
    # another checkpoint draws other labels
    other = featurizer.fisher({"input_ids": ids, "attention_mask": mask}, MODEL_ID + 1, 0)
    assert float((other - whole).abs().max()) > 1e-3 * float(whole.abs().max())


def test_uniforms_are_a_pure_function_of_seed_checkpoint_row_and_position():
    u = uniform_rows(SEED, MODEL_ID, torch.arange(100), 50)
    assert u.dtype == torch.float32 and bool(((u > 0) & (u < 1)).all())
    np.testing.assert_array_equal(uniform_rows(SEED, MODEL_ID, torch.tensor([7, 3]), 50), u[[7, 3]])
    np.testing.assert_array_equal(uniform_rows(SEED, MODEL_ID, torch.arange(100), 20), u[:, :20])
    assert not torch.equal(uniform_rows(SEED + 1, MODEL_ID, torch.arange(100), 50), u)
    assert not torch.equal(uniform_rows(SEED, MODEL_ID + 1, torch.arange(100), 50), u)
    # uniform: every decile holds about a tenth of 5000 draws (binomial sd ≈ 21)
    counts = np.histogram(u.numpy(), bins=10, range=(0, 1))[0]
    assert np.abs(counts - 500).max() < 100, counts


def test_classification_draws_one_label_per_example():
    model = torch.nn.Sequential(torch.nn.Linear(5, 4))
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    y = torch.zeros(6, dtype=torch.long)
    computer = make_computer(model, resolve_task("image_classification"), None, "cpu", "vmap")
    featurizer = build_featurizer(computer, "rademacher", 8, SEED, curvature="fisher")
    g = featurizer.fisher([x, y], MODEL_ID, 0).double()
    u = uniform_rows(SEED, MODEL_ID, torch.arange(6), 1)[:, 0]
    probs = torch.softmax(model(x).double(), -1)
    drawn = (probs.cumsum(-1) < u[:, None]).sum(-1)
    w, b = model[0].weight, model[0].bias
    proj = rademacher_block(SEED, MODEL_ID, 0, 24, 0, 8, torch.float64)
    for i in range(6):
        logp = torch.log_softmax(model(x[i : i + 1]), -1)[0, drawn[i]]
        gw, gb = torch.autograd.grad(logp, [w, b])
        ref = torch.cat([gw.reshape(-1), gb]).double() @ proj / math.sqrt(24)
        torch.testing.assert_close(g[i], ref, rtol=1e-4, atol=1e-6)


def test_curvature_auto_is_fisher_for_causal_lm_only_and_fisher_needs_a_sampler():
    assert resolve_curvature("auto", resolve_task("causal_lm")) == "fisher"
    assert resolve_curvature("auto", resolve_task("image_classification")) == "xtx"
    assert resolve_curvature("fisher", resolve_task("text_classification")) == "fisher"
    with pytest.raises(ConfigError, match="cannot draw labels"):
        resolve_curvature("fisher", resolve_task("clip"))
    with pytest.raises(ConfigError, match="expected one of"):
        resolve_curvature("hessian", resolve_task("causal_lm"))


def test_a_tuple_text_batch_carries_its_uniforms_as_its_last_tensor():
    model = gpt2_lm("eager", seed=3)
    ids, _, mask, _ = text_batch(4, length=7, seed=5)
    computer = make_computer(model, resolve_task("causal_lm"), None, "cpu", "hooks")
    featurizer = build_featurizer(computer, "rademacher", P, SEED, curvature="fisher")
    as_tuple = featurizer.fisher((ids, mask), MODEL_ID, 2)
    as_dict = featurizer.fisher({"input_ids": ids, "attention_mask": mask}, MODEL_ID, 2)
    torch.testing.assert_close(as_tuple, as_dict, rtol=1e-4, atol=1e-6)
    assert computer.task is not featurizer.sampled  # the task is restored after the pass
