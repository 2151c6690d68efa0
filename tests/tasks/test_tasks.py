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
    from helpers import classification_data, mlp
    from trak.modelout_functions import ImageClassificationModelOutput

    model = mlp()
    x, y = classification_data(4)
    ours = GradientComputer(model, ImageClassification()).per_sample_grads((x, y))
    theirs = GradientComputer(model, ImageClassificationModelOutput()).per_sample_grads((x, y))
    for n in ours:
        torch.testing.assert_close(ours[n], theirs[n])


def test_docstring_examples_run():
    result = doctest.testmod(trak_dist.tasks._base, raise_on_error=False)
    assert result.attempted > 0 and result.failed == 0
