"""The hook engine against vmap (or the autograd loop where vmap cannot run the model): the same
dense features, module by module, on an MLP, a CNN, BERT and GPT-2 from tiny configs."""

import pytest
import torch
from torch import nn

from tests.fixtures.helpers import classification_data, mlp
from tests.fixtures.hf_models import bert_classifier, gpt2_classifier, gpt2_lm, text_batch
from trak_dist.errors import ConfigError
from trak_dist.featurize import Featurizer
from trak_dist.gradients import (
    GradientComputer,
    HookGradientComputer,
    IterativeGradientComputer,
    make_computer,
)
from trak_dist.projection import IdentityProjector, TorchProjector
from trak_dist.tasks import CausalLM, ImageClassification, TextClassification, margin


class CNN(nn.Module):
    """Every conv/norm rule: Conv2d (padding 1, and stride 2 'valid'), BatchNorm2d (eval, running
    statistics), GroupNorm, Conv1d ('same', circular), LayerNorm, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, stride=2, padding="valid")
        self.gn = nn.GroupNorm(2, 8)
        self.c3 = nn.Conv1d(8, 4, 3, padding="same", padding_mode="circular")
        self.ln = nn.LayerNorm(4)
        self.fc = nn.Linear(4 * 9, 5)

    def forward(self, x):
        x = self.gn(self.c2(torch.relu(self.bn(self.c1(x)))))
        x = self.c3(x.flatten(2))
        return self.fc(self.ln(x.transpose(1, 2)).flatten(1))


def cnn() -> nn.Module:
    torch.manual_seed(0)
    model = CNN().train()
    with torch.no_grad():  # non-trivial running statistics
        for _ in range(3):
            model(torch.randn(16, 3, 7, 7) * 2 + 0.5)
    return model.eval()


def image_batch(n: int = 6):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 3, 7, 7, generator=g), torch.randint(0, 5, (n,), generator=g)


def lm_batch():
    """``(input_ids, attention_mask)``, the causal_lm layout."""
    return text_batch()[::2]


# (model, task, batch, reference engine): vmap where torch.func can run the model, else the
# autograd loop (transformers' default sdpa/mask code does data-dependent control flow under
# vmap); the Hugging Face models use transformers' default attention unless marked eager
CASES = {
    "mlp": (mlp, ImageClassification, lambda: classification_data(7), GradientComputer),
    "cnn": (cnn, ImageClassification, image_batch, GradientComputer),
    "bert": (bert_classifier, TextClassification, text_batch, IterativeGradientComputer),
    "gpt2-classifier": (gpt2_classifier, TextClassification, text_batch, IterativeGradientComputer),
    "gpt2-classifier-eager": (
        lambda: gpt2_classifier("eager"),
        TextClassification,
        text_batch,
        GradientComputer,
    ),
    "gpt2-lm": (gpt2_lm, CausalLM, lm_batch, IterativeGradientComputer),
    "gpt2-lm-eager": (lambda: gpt2_lm("eager"), CausalLM, lm_batch, GradientComputer),
}


def features(computer, projector, batch, micro_batch=None):
    return Featurizer(computer, projector, micro_batch).project(batch, model_id=3)


@pytest.mark.parametrize("case", list(CASES))
def test_hook_features_equal_the_reference_engine(case):
    make_model, task_cls, make_batch, reference = CASES[case]
    model, batch = make_model(), make_batch()
    if task_cls is not ImageClassification:  # padding is exercised
        assert (batch[1 if task_cls is CausalLM else 2] == 0).any()
    hooks = HookGradientComputer(model, task_cls())
    ref = reference(model, task_cls())
    d = ref.layout.grad_dim
    assert hooks.layout == ref.layout
    for projector in (IdentityProjector(d), TorchProjector(d, 64, seed=11)):
        want = features(ref, projector, batch)
        # twice: the first micro-batch runs the sum check, later ones skip weight gradients
        for got in (features(hooks, projector, batch), features(hooks, projector, batch, 2)):
            # atol: entries whose true value is 0 (e.g. BERT's key biases, which softmax
            # ignores) are float noise in both engines
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max())


@pytest.mark.parametrize("case", ["mlp", "bert", "gpt2-lm"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "separate"])
def test_q_comes_from_the_same_forward_and_is_unchanged(case, fused):
    """With ``get_outputs_and_q`` the hook engine's featurize runs one forward per micro-batch
    and its Q equals ``get_out_to_loss_grad``'s (the reference engine's, a forward of its own);
    a task without it gets Q from that second forward."""
    make_model, task_cls, make_batch, reference = CASES[case]
    model, batch = make_model(), make_batch()
    task = task_cls() if fused else type("Separate", (task_cls,), {"get_outputs_and_q": None})()
    hooks = HookGradientComputer(model, task)
    projector = TorchProjector(hooks.layout.grad_dim, 16)
    forwards = []
    model.register_forward_hook(lambda *_: forwards.append(1))
    x, q = Featurizer(hooks, projector, micro_batch=2).featurize(batch, model_id=3)
    n = len(batch[0])
    assert len(forwards) == -(-n // 2) * (1 if fused else 2)
    want = reference(model, task_cls()).out_to_loss(batch)
    assert q.dtype == torch.float32 and q.shape == want.shape == (n,)
    torch.testing.assert_close(q, want, rtol=1e-5, atol=1e-7)
    # and X is what project() alone gives
    torch.testing.assert_close(x, features(hooks, projector, batch, 2), rtol=1e-6, atol=0.0)


def test_auto_picks_hooks_when_every_parameter_has_a_rule():
    model = mlp()
    assert isinstance(make_computer(model, ImageClassification()), HookGradientComputer)
    assert type(make_computer(model, ImageClassification(), engine="vmap")) is GradientComputer


class ScaledMLP(nn.Module):
    """A parameter of the top-level module itself, used in its forward: no hook rule."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 3)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        return self.fc(x * self.scale)


def test_a_parameter_without_a_rule_is_a_clear_error_never_dropped():
    model, task = ScaledMLP(), ImageClassification()
    with pytest.raises(
        ConfigError, match=r"'scale'.*no hook rule for ScaledMLP(?s:.*)grad_wrt.*vmap"
    ):
        HookGradientComputer(model, task)
    with pytest.raises(ConfigError, match="'scale'"):
        make_computer(model, task, engine="hooks")
    assert type(make_computer(model, task, engine="auto")) is GradientComputer
    # leaving it out with grad_wrt works, and equals vmap on what is left
    x, y = classification_data(4)
    wrt = ["fc.weight", "fc.bias"]
    hooks = HookGradientComputer(model, task, wrt).per_sample_grads((x, y))
    vmap = GradientComputer(model, task, wrt).per_sample_grads((x, y))
    for name in wrt:
        torch.testing.assert_close(hooks[name], vmap[name], rtol=1e-5, atol=1e-6)


def test_unsupported_module_settings_are_named():
    model = nn.Sequential(nn.Conv2d(4, 4, 3, groups=2), nn.Flatten(), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match=r"'0.weight'.*groups=2"):
        HookGradientComputer(model, ImageClassification())
    emb = nn.Sequential(nn.Embedding(10, 4, scale_grad_by_freq=True))
    with pytest.raises(ConfigError, match="scale_grad_by_freq"):
        HookGradientComputer(emb, ImageClassification())


class TiedLM(nn.Module):
    """An embedding whose weight is also the output layer's (as GPT-2's lm_head = wte)."""

    def __init__(self, vocab: int = 12, dim: int = 6) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.emb = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.emb(ids))).mean(1))


def test_a_tied_weight_gets_the_sum_of_both_uses():
    model, task = TiedLM(), ImageClassification()
    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(0, 12, (5, 4), generator=g), torch.randint(0, 12, (5,), generator=g)
    assert [n for n, _ in model.named_parameters()] == ["emb.weight", "mix.weight", "mix.bias"]
    got = HookGradientComputer(model, task).per_sample_grads((ids, labels))["emb.weight"]
    # independent reference: autograd through the model, one sample at a time
    want = torch.stack(
        [
            torch.autograd.grad(
                margin(model(ids[i : i + 1]), labels[i : i + 1]).sum(), model.emb.weight
            )[0]
            for i in range(5)
        ]
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    # and both uses matter: the embedding use alone is far from it
    untied = TiedLM()
    untied.head.weight = nn.Parameter(model.emb.weight.detach().clone())
    emb_only = HookGradientComputer(untied, task, ["emb.weight"]).per_sample_grads((ids, labels))
    assert (emb_only["emb.weight"] - want).abs().max() > 0.1 * want.abs().max()


class ReadsWeightDirectly(nn.Module):
    """The output layer multiplies by the embedding's weight without calling a module."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(12, 6)

    def forward(self, ids):
        return nn.functional.linear(self.emb(ids).mean(1), self.emb.weight)


def test_a_weight_used_outside_its_module_fails_the_sum_check():
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 12, (5, 4), generator=g), torch.randint(0, 12, (5,), generator=g)
    computer = HookGradientComputer(ReadsWeightDirectly(), ImageClassification())
    with pytest.raises(ConfigError, match=r"do not add up.*emb\.weight(?s:.*)gradient_engine=vmap"):
        computer.per_sample_grads(batch)


class LlamaStyleRMSNorm(nn.Module):
    """The shape of transformers' LlamaRMSNorm (matched by name and its one 1-D weight)."""

    def __init__(self, dim: int, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))
        self.offset, self.variance_epsilon = offset, 1e-6

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.offset + self.weight) * x


def test_hf_style_rms_norms_are_checked_not_assumed():
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 8), LlamaStyleRMSNorm(8), nn.Linear(8, 3))
    x, y = classification_data(6)
    hooks = HookGradientComputer(model, ImageClassification()).per_sample_grads((x, y))
    vmap = GradientComputer(model, ImageClassification()).per_sample_grads((x, y))
    for name in vmap:
        torch.testing.assert_close(hooks[name], vmap[name], rtol=1e-5, atol=1e-6)
    # Gemma's (1 + w) ⊙ x̂ is not w ⊙ x̂: an error, not wrong gradients
    gemma = nn.Sequential(nn.Linear(8, 8), LlamaStyleRMSNorm(8, offset=1.0), nn.Linear(8, 3))
    with pytest.raises(ConfigError, match=r"LlamaStyleRMSNorm.*not its weight times"):
        HookGradientComputer(gemma, ImageClassification()).per_sample_grads((x, y))


def test_a_task_without_batched_outputs_uses_vmap():
    class PerSampleOnly(ImageClassification):
        get_outputs = None

    assert type(make_computer(mlp(), PerSampleOnly())) is GradientComputer
    with pytest.raises(ConfigError, match="get_outputs"):
        make_computer(mlp(), PerSampleOnly(), engine="hooks")


class RecordingProjector(TorchProjector):
    """A real projector that notes how many gradient entries each call receives."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[int] = []

    def project(self, grads, model_id):
        self.calls.append(sum(b.grad.numel() for b in grads))
        return super().project(grads, model_id)


def test_the_featurizer_streams_one_module_at_a_time():
    model, batch = gpt2_lm(), lm_batch()
    computer = HookGradientComputer(model, CausalLM())
    projector = RecordingProjector(computer.layout.grad_dim, 32)
    features(computer, projector, batch)
    b = batch[0].shape[0]
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    # one call per module call: wte, wpe, 2 blocks × (ln_1, c_attn, c_proj, ln_2, c_fc, c_proj),
    # ln_f, lm_head (wte's second use); never more than a micro-batch of the largest module's
    # (weight + bias) gradients
    assert len(projector.calls) == 2 + 2 * 6 + 2
    assert max(projector.calls) <= b * largest < b * computer.layout.grad_dim / 4


def test_traker_attributes_a_stock_bert_with_default_settings(tmp_path):
    """No engine given: auto picks hooks for BERT (vmap cannot run it) and the scores equal
    those from traker's path with the autograd-loop computer."""
    import numpy as np

    from trak_dist import TRAKer

    def scores(save_dir, **kw):
        model, batch, targets = bert_classifier(), text_batch(seed=0), text_batch(seed=1)
        t = TRAKer(model=model, task="text_classification", train_set_size=5, save_dir=save_dir,
                   device="cpu", proj_dim=4, lambda_reg=1e-2, use_half_precision=False,
                   **kw)  # fmt: skip
        t.load_checkpoint(model.state_dict(), model_id=0)
        t.featurize(batch, num_samples=5)
        t.finalize_features()
        t.start_scoring_checkpoint("exp", model.state_dict(), model_id=0, num_targets=5)
        t.score(targets, num_samples=5)
        return t, np.asarray(t.finalize_scores("exp"))

    auto, ours = scores(tmp_path / "auto")
    assert isinstance(auto.computer, HookGradientComputer)
    _, ref = scores(tmp_path / "loop", gradient_computer=IterativeGradientComputer)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
