"""The task names traker ships beyond classification: iterative_image_classification, clip."""

import logging

import pytest
import torch
from torch import nn

from trak_dist.errors import TrakerUsageError
from trak_dist.gradients import GradientComputer
from trak_dist.tasks import (
    CLIPOutput,
    ImageClassification,
    IterativeImageClassification,
    margin,
    resolve_task,
)


def test_names_resolve():
    assert isinstance(resolve_task("iterative_image_classification"), IterativeImageClassification)
    assert isinstance(resolve_task("clip"), CLIPOutput)


def test_iterative_output_in_both_calling_conventions():
    """traker's IterativeGradientComputer calls get_output(model, None, None, *batch) on a batch;
    our engines call it per sample: the same margins, the same gradients as image_classification."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    task = IterativeImageClassification()
    torch.testing.assert_close(task.get_output(model, None, None, x, y), margin(model(x), y))
    with torch.no_grad():
        p = torch.softmax(model(x), -1)[torch.arange(6), y]
    torch.testing.assert_close(task.get_out_to_loss_grad(model, None, None, (x, y)), 1 - p)
    ours = GradientComputer(model, task).per_sample_grads((x, y))
    plain = GradientComputer(model, ImageClassification()).per_sample_grads((x, y))
    for name in ours:
        torch.testing.assert_close(ours[name], plain[name])


class TinyCLIP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.visual = nn.Linear(4, 3)
        self.tokens = nn.Embedding(10, 3)
        self.logit_scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, image, text):
        image_emb = nn.functional.normalize(self.visual(image), dim=-1)
        text_emb = nn.functional.normalize(self.tokens(text).mean(-2), dim=-1)
        return image_emb, text_emb, self.logit_scale.exp()


def test_clip_embeddings_on_the_cpu_and_the_missing_embeddings_error(caplog):
    model = TinyCLIP()
    images, texts = torch.randn(7, 4), torch.randint(0, 10, (7, 2))
    task = CLIPOutput(simulated_batch_size=3)
    weights = dict(model.named_parameters())
    with pytest.raises(AssertionError, match="get_embeddings") as e:
        task.get_output(model, weights, {}, images[0], texts[0])
    assert isinstance(e.value, TrakerUsageError)
    loader = [(images[:4], texts[:4]), (images[4:], texts[4:])]  # a short last batch
    with caplog.at_level(logging.WARNING, logger="trak_dist"):
        task.get_embeddings(model, loader, batch_size=4, embedding_dim=3, size=9)
    assert "size=7" in caplog.text  # 2 rows stay zero, as traker leaves them
    with torch.no_grad():
        image_emb, text_emb, _ = model(images, texts)
    torch.testing.assert_close(task.image_embeddings[:7], image_emb)
    torch.testing.assert_close(task.text_embeddings[:7], text_emb)
    assert task.image_embeddings[7:].abs().sum() == 0 and task.num_computed_embeddings == 9
    # the output, with every nonzero-weight row drawn (8 of rows 1..8), is the formula's
    task.sim_batch_size = 8
    out = task.get_output(model, weights, {}, images[0], texts[0])
    others = torch.arange(1, 9)
    phi, psi = image_emb[:1], text_emb[:1]
    expected = -torch.logsumexp(-phi @ (psi - task.text_embeddings[others]).T, 1) - torch.logsumexp(
        -psi @ (phi - task.image_embeddings[others]).T, 1
    )
    torch.testing.assert_close(out, expected.sum())
