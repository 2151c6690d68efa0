"""causal_lm against an independent computation: each sequence run alone, unpadded, in float64,
with log-softmax and Hugging Face's own loss."""

import pytest
import torch

from tests.fixtures.hf_models import gpt2_lm, padded_tokens
from trak_dist.errors import ConfigError
from trak_dist.gradients import GradientComputer, IterativeGradientComputer
from trak_dist.tasks import TASKS, CausalLM, margin, resolve_task


def params_of(model):
    return {k: v.detach() for k, v in model.named_parameters()}, {
        k: v.detach() for k, v in model.named_buffers()
    }


def reference(model, ids, mask, skip_first=0):
    """Per sequence: f = Σ log p/(1−p) and Q = mean(1 − p) over its predicted tokens, the first
    ``skip_first`` targets left out; from the sequence alone (no padding) in float64. Also
    checks that −mean log p is Hugging Face's loss for that sequence."""
    fs, qs = [], []
    for i in range(len(ids)):
        seq = ids[i, mask[i].bool()][None]
        labels = seq.clone()
        labels[:, : 1 + skip_first] = -100
        with torch.no_grad():
            out = model(input_ids=seq, labels=labels)
        logp = torch.log_softmax(out.logits[0, :-1], dim=-1).gather(-1, seq[0, 1:, None])[:, 0]
        logp = logp[skip_first:]
        if not len(logp):  # nothing to predict: f = Q = 0
            fs.append(logp.sum())
            qs.append(logp.sum())
            continue
        # Hugging Face computes its loss in float32 whatever the model's dtype
        torch.testing.assert_close(out.loss.double(), -logp.mean(), rtol=1e-6, atol=1e-6)
        p = logp.exp()
        fs.append((logp - torch.log1p(-p)).sum())
        qs.append((1 - p).mean())
    return torch.stack(fs), torch.stack(qs)


@pytest.fixture(scope="module")
def model64():
    return gpt2_lm(seed=1).double()


def test_registered_as_causal_lm():
    assert TASKS["causal_lm"] is CausalLM
    assert isinstance(resolve_task("causal_lm"), CausalLM)


@pytest.mark.parametrize("form", ["tuple", "dict"])
def test_outputs_and_q_match_each_sequence_alone(model64, form):
    ids, mask = padded_tokens(6)
    assert (mask == 0).any()  # padding is exercised
    batch = (ids, mask) if form == "tuple" else {"input_ids": ids, "attention_mask": mask}
    task = CausalLM(q="mean")
    f_ref, q_ref = reference(model64, ids, mask)
    weights, buffers = params_of(model64)
    torch.testing.assert_close(task.get_outputs(model64, batch), f_ref, rtol=1e-9, atol=1e-9)
    q = task.get_out_to_loss_grad(model64, weights, buffers, batch)
    torch.testing.assert_close(q, q_ref, rtol=1e-9, atol=1e-12)
    # the per-sample (vmap) entry, called without vmap on one sample
    sample = {k: v[2] for k, v in batch.items()} if form == "dict" else (ids[2], mask[2])
    args = (sample,) if form == "dict" else sample
    f2 = task.get_output(model64, weights, buffers, *args)
    torch.testing.assert_close(f2, f_ref[2], rtol=1e-9, atol=1e-9)


def test_hf_labels_leave_positions_out(model64):
    ids, mask = padded_tokens(4)
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :3] = -100  # a "prompt": its first two targets do not count
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    f_ref, q_ref = reference(model64, ids, mask, skip_first=2)
    weights, buffers = params_of(model64)
    task = CausalLM(q="mean")
    torch.testing.assert_close(task.get_outputs(model64, batch), f_ref, rtol=1e-9, atol=1e-9)
    q = task.get_out_to_loss_grad(model64, weights, buffers, (ids, mask, labels))
    torch.testing.assert_close(q, q_ref, rtol=1e-9, atol=1e-12)


def test_q_is_minus_dloss_df_along_uniform_token_shifts(model64):
    """Q = −dL/dε with L = Σ_t CE_t and every counted margin raised by ε/|𝒯| (the docstring's
    justification), CE_t taken from torch's cross_entropy and written as a function of the
    margin: CE_t = softplus(−margin_t)."""
    ids, mask = padded_tokens(3)
    weights, buffers = params_of(model64)
    q = CausalLM(q="mean").get_out_to_loss_grad(model64, weights, buffers, (ids, mask))
    for i in range(3):
        seq = ids[i, mask[i].bool()]
        with torch.no_grad():
            z = model64(input_ids=seq[None]).logits[0, :-1]
        ce = torch.nn.functional.cross_entropy(z, seq[1:], reduction="none")
        m = margin(z, seq[1:])
        torch.testing.assert_close(ce, torch.nn.functional.softplus(-m), rtol=1e-10, atol=1e-12)
        eps = torch.zeros((), dtype=torch.float64, requires_grad=True)
        loss = torch.nn.functional.softplus(-(m + eps / len(m))).sum()
        (dloss,) = torch.autograd.grad(loss, eps)
        torch.testing.assert_close(q[i], -dloss, rtol=1e-10, atol=1e-12)


def test_one_predicted_token_is_classification_over_the_vocabulary(model64):
    ids, mask = padded_tokens(5, length=2)
    weights, buffers = params_of(model64)
    with torch.no_grad():
        z = model64(input_ids=ids, attention_mask=mask).logits[:, 0]
    task = CausalLM(q="mean")
    torch.testing.assert_close(task.get_outputs(model64, (ids, mask)), margin(z, ids[:, 1]))
    p = torch.softmax(z, -1)[torch.arange(5), ids[:, 1]]
    q = task.get_out_to_loss_grad(model64, weights, buffers, (ids, mask))
    torch.testing.assert_close(q, 1 - p)


def test_default_q_is_one_for_every_document(model64):
    """q="one" (the default): every document weighs alike, however well the model predicts it;
    the output f is the same as q="mean"'s."""
    ids, mask = padded_tokens(4)
    weights, buffers = params_of(model64)
    task = CausalLM()
    q = task.get_out_to_loss_grad(model64, weights, buffers, (ids, mask))
    assert q.tolist() == [1.0] * 4
    f, q2 = task.get_outputs_and_q(model64, (ids, mask))
    assert q2.tolist() == [1.0] * 4
    f_ref, _ = reference(model64, ids, mask)
    torch.testing.assert_close(f, f_ref, rtol=1e-9, atol=1e-9)


def test_unknown_q_is_a_config_error():
    with pytest.raises(ConfigError, match="q='median'"):
        CausalLM(q="median")


def test_no_counted_position_gives_zero_output_and_q(model64):
    ids, mask = padded_tokens(2)
    labels = torch.full_like(ids, -100)
    weights, buffers = params_of(model64)
    task = CausalLM(q="mean")
    assert task.get_outputs(model64, (ids, mask, labels)).eq(0).all()
    assert task.get_out_to_loss_grad(model64, weights, buffers, (ids, mask, labels)).eq(0).all()


def plain_grads(model, task, batch, names):
    """Per-sample gradients of get_outputs from the model's own parameters (no functional_call,
    no vmap): GPT-2's tied lm_head/wte gets the sum of both uses, as autograd gives."""
    params = dict(model.named_parameters())
    n = len(batch[0])
    rows = [
        torch.autograd.grad(
            task.get_outputs(model, [t[i : i + 1] for t in batch])[0], [params[k] for k in names]
        )
        for i in range(n)
    ]
    return {k: torch.stack([r[j] for r in rows]) for j, k in enumerate(names)}


def test_vmap_gradients_with_eager_attention_match_autograd():
    """GPT-2 built with attn_implementation='eager' runs under torch.func.vmap (transformers
    5.x); its per-sample gradients equal a plain autograd loop's, tied weights included."""
    model = gpt2_lm("eager", seed=2).double()
    assert model.lm_head.weight is model.transformer.wte.weight
    ids, mask = padded_tokens(4)
    task = CausalLM(q="mean")
    vm = GradientComputer(model, task).per_sample_grads((ids, mask))
    names = list(vm)
    ref = plain_grads(model, task, (ids, mask), names)
    it = IterativeGradientComputer(model, task).per_sample_grads((ids, mask))
    for k in names:
        torch.testing.assert_close(vm[k], ref[k], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(it[k], ref[k], rtol=1e-9, atol=1e-12)
    # samples are independent: the summed batch output's gradient is the sum of the rows
    # (what the module-hook engine relies on)
    params = dict(model.named_parameters())
    total = torch.autograd.grad(task.get_outputs(model, (ids, mask)).sum(), list(params.values()))
    for k, g in zip(params, total, strict=True):
        torch.testing.assert_close(g, ref[k].sum(0), rtol=1e-9, atol=1e-12)


def test_vmap_with_default_attention_is_one_clear_error():
    """transformers 5.x's SDPA mask code reads the mask's values (``padding_mask.all()``), which
    vmap refuses: a ConfigError that names the hooks engine, not a torch.func traceback."""
    model = gpt2_lm()
    assert model.config._attn_implementation == "sdpa"
    ids, mask = padded_tokens(2)
    with pytest.raises(ConfigError, match="gradient_engine=hooks") as info:
        GradientComputer(model, CausalLM()).per_sample_grads((ids, mask))
    assert "GPT2LMHeadModel cannot run under torch.func.vmap" in str(info.value)
    assert "masking_utils.py" in str(info.value)


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ((torch.ones(2, 4, dtype=torch.long),), "a tuple batch is"),
        ({"attention_mask": torch.ones(2, 4, dtype=torch.long)}, "needs 'input_ids'"),
        ((torch.ones(2, 1, dtype=torch.long), torch.ones(2, 1)), "at least 2 tokens"),
    ],
)
def test_bad_batches_are_config_errors(batch, message):
    with pytest.raises(ConfigError, match=message):
        CausalLM().get_outputs(torch.nn.Identity(), batch)
