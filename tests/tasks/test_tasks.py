import doctest

import pytest
import torch
from torch import nn

import trak_dist.tasks._base
from trak_dist.errors import ConfigError
from trak_dist.gradients import GradientComputer, IterativeGradientComputer
from trak_dist.tasks import ImageClassification, TextClassification, margin, resolve_task


class TinyTextModel(nn.Module):
    """Called like a Hugging Face sequence classifier."""

    def __init__(self, vocab: int = 20, dim: int = 6, classes: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.seg = nn.Embedding(2, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids, token_type_ids, attention_mask):
        h = self.emb(input_ids) + self.seg(token_type_ids)
        m = attention_mask.unsqueeze(-1).float()
        return self.head((h * m).sum(1) / m.sum(1))


def test_margin_is_log_odds():
    logits = torch.randn(6, 4, dtype=torch.float64)
    labels = torch.randint(0, 4, (6,))
    p = torch.softmax(logits, -1)[torch.arange(6), labels]
    torch.testing.assert_close(margin(logits, labels), torch.log(p / (1 - p)))


def test_text_classification_gradients_and_q():
    torch.manual_seed(0)
    model = TinyTextModel()
    ids = torch.randint(0, 20, (5, 7))
    types = torch.randint(0, 2, (5, 7))
    mask = torch.ones(5, 7, dtype=torch.long)
    mask[:, 5:] = 0
    labels = torch.randint(0, 3, (5,))
    batch = (ids, types, mask, labels)
    task = TextClassification()
    vm = GradientComputer(model, task).per_sample_grads(batch)
    it = IterativeGradientComputer(model, task).per_sample_grads(batch)
    for n in vm:
        torch.testing.assert_close(vm[n], it[n], rtol=1e-5, atol=1e-6)
    q = GradientComputer(model, task).out_to_loss(batch)
    with torch.no_grad():
        p = torch.softmax(model(ids, types, mask), -1)[torch.arange(5), labels]
    torch.testing.assert_close(q, 1 - p)


def test_resolve_task_forms():
    assert isinstance(resolve_task("image_classification"), ImageClassification)
    assert isinstance(resolve_task("trak_dist.tasks:TextClassification"), TextClassification)
    assert isinstance(resolve_task(ImageClassification), ImageClassification)
    with pytest.raises(ConfigError, match="not a known task"):
        resolve_task("segmentation")
    with pytest.raises(ConfigError, match="could not be imported"):
        resolve_task("nowhere.module:Task")
    with pytest.raises(ConfigError, match="get_output"):
        resolve_task(object())


def test_traker_tasks_are_accepted_unchanged():
    from trak.modelout_functions import ImageClassificationModelOutput

    from tests.fixtures.helpers import classification_data, mlp

    model = mlp()
    x, y = classification_data(4)
    ours = GradientComputer(model, ImageClassification()).per_sample_grads((x, y))
    theirs = GradientComputer(model, ImageClassificationModelOutput()).per_sample_grads((x, y))
    for n in ours:
        torch.testing.assert_close(ours[n], theirs[n])


def test_docstring_examples_run():
    result = doctest.testmod(trak_dist.tasks._base, raise_on_error=False)
    assert result.attempted > 0 and result.failed == 0


def test_labels_outside_the_classes_are_named_not_wrapped():
    """−1 used to index the last class silently. Outside vmap it is a LabelError naming the
    positions; inside vmap (labels unreadable) only its own sample's output turns NaN."""
    from tests.fixtures.helpers import classification_data, mlp
    from trak_dist.errors import LabelError
    from trak_dist.featurize import Featurizer
    from trak_dist.projection import make_projector

    logits = torch.randn(5, 3)
    with pytest.raises(LabelError, match=r"\[-1, 3\] at batch positions \[1, 4\]") as e:
        margin(logits, torch.tensor([0, -1, 2, 1, 3]))
    assert e.value.classes == 3 and "[0, 3)" in str(e.value)
    moved = e.value.at([10, 11, 12, 13, 14], "train set rows")
    assert moved.positions == [11, 14] and "train set rows [11, 14]" in str(moved)

    model = mlp()
    x, y = classification_data(10)
    bad = y.clone()
    bad[6] = -1
    clean = GradientComputer(model, ImageClassification()).per_sample_grads((x, y))
    grads = GradientComputer(model, ImageClassification()).per_sample_grads((x, bad))
    for name, g in grads.items():
        rows = torch.isfinite(g.reshape(10, -1)).all(1)
        assert rows.tolist() == [i != 6 for i in range(10)]
        keep = torch.arange(10) != 6
        torch.testing.assert_close(g[keep], clean[name][keep], rtol=0, atol=0)
    with pytest.raises(LabelError, match=r"batch positions \[6\]"):
        IterativeGradientComputer(model, ImageClassification()).per_sample_grads((x, bad))
    # Q sees the labels outside vmap: the Featurizer names the position in the whole batch,
    # across micro-batches, before computing any gradient
    computer = GradientComputer(model, ImageClassification())
    projector = make_projector("rademacher", computer.layout.grad_dim, 8, 0, "cpu")
    with pytest.raises(LabelError, match=r"\[-1\] at batch positions \[6\]"):
        Featurizer(computer, projector, micro_batch=4).featurize((x, bad), model_id=0)
    high = y.clone()
    high[2] = 3
    ids = torch.zeros(10, 4, dtype=torch.long)
    with pytest.raises(LabelError, match=r"\[3\] at batch positions \[2\]"):
        TextClassification().get_outputs(TinyTextModel(), (ids, ids, torch.ones_like(ids), high))


def test_causal_lm_labels_outside_the_vocabulary_name_the_sample():
    """The tokens' margins are taken over the flattened [B·(T-1)] positions; a label id ≥ V is
    a LabelError at the position of its sample, for the output and for Q."""
    from tests.fixtures.hf_models import gpt2_lm, padded_tokens
    from trak_dist.errors import LabelError
    from trak_dist.tasks import CausalLM

    model = gpt2_lm(seed=1)
    ids, mask = padded_tokens(4)
    vocab = model.config.vocab_size
    labels = ids.clone()
    labels[2, 3] = vocab + 5
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    task = CausalLM()
    with pytest.raises(LabelError, match=rf"\[{vocab + 5}\] at batch positions \[2\]"):
        task.get_outputs(model, batch)
    params = {k: v.detach() for k, v in model.named_parameters()}
    with pytest.raises(LabelError, match=r"at batch positions \[2\]"):
        task.get_out_to_loss_grad(model, params, {}, batch)


def test_hook_engine_names_a_target_label_outside_the_classes():
    """The hook engine runs the plain forward pass: even a target row (no Q) is named."""
    from tests.fixtures.helpers import classification_data, mlp
    from trak_dist.errors import LabelError
    from trak_dist.featurize import Featurizer
    from trak_dist.gradients import HookGradientComputer
    from trak_dist.projection import make_projector

    model = mlp()
    x, y = classification_data(10)
    y[7] = 3  # C = 3
    computer = HookGradientComputer(model, ImageClassification())
    projector = make_projector("rademacher", computer.layout.grad_dim, 8, 0, "cpu")
    with pytest.raises(LabelError, match=r"\[3\] at batch positions \[7\]"):
        Featurizer(computer, projector, micro_batch=4).project((x, y), model_id=0)
