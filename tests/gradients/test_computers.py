import pytest
import torch
from torch import nn

from tests.fixtures.helpers import classification_data, mlp
from trak_dist.errors import ConfigError
from trak_dist.gradients import GradientComputer, IterativeGradientComputer, ParamLayout
from trak_dist.tasks import ImageClassification, margin


def plain_autograd(model, x, y, names):
    """Per-sample gradients from model(x) directly, one sample at a time."""
    params = dict(model.named_parameters())
    out = {n: [] for n in names}
    for i in range(len(x)):
        val = margin(model(x[i : i + 1]), y[i : i + 1]).sum()
        grads = torch.autograd.grad(val, [params[n] for n in names])
        for n, g in zip(names, grads, strict=True):
            out[n].append(g)
    return {n: torch.stack(v) for n, v in out.items()}


class BNDropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 10)
        self.bn = nn.BatchNorm1d(10)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(10, 4)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))


@pytest.mark.parametrize("grad_wrt", [None, ["2.weight", "0.bias"]])
def test_vmap_matches_autograd_loops(grad_wrt):
    model = mlp(seed=3)
    x, y = classification_data(9)
    vm = GradientComputer(model, ImageClassification(), grad_wrt).per_sample_grads((x, y))
    it = IterativeGradientComputer(model, ImageClassification(), grad_wrt).per_sample_grads((x, y))
    names = list(vm)
    assert names == (
        ["0.bias", "2.weight"] if grad_wrt else [n for n, _ in model.named_parameters()]
    )
    ref = plain_autograd(model, x, y, names)
    for n in names:
        torch.testing.assert_close(vm[n], ref[n], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(it[n], ref[n], rtol=1e-5, atol=1e-6)


def test_eval_mode_makes_gradients_independent_of_the_batch():
    torch.manual_seed(0)
    model = BNDropNet()
    model.train()
    with torch.no_grad():  # give BatchNorm non-trivial running statistics
        for _ in range(5):
            model(torch.randn(32, 6) * 3 + 1)
    x, y = torch.randn(8, 6), torch.randint(0, 4, (8,))
    comp = GradientComputer(model, ImageClassification())
    assert not model.training
    full = comp.per_sample_grads((x, y))
    alone = comp.per_sample_grads((x[3:4], y[3:4]))
    for n in full:
        torch.testing.assert_close(full[n][3:4], alone[n], rtol=1e-5, atol=1e-6)
    ref = plain_autograd(model, x, y, list(full))
    for n in full:
        torch.testing.assert_close(full[n], ref[n], rtol=1e-5, atol=1e-6)


def test_out_to_loss_is_one_minus_p():
    model = mlp()
    x, y = classification_data(5)
    q = GradientComputer(model, ImageClassification(temperature=2.0)).out_to_loss((x, y))
    with torch.no_grad():
        p = torch.softmax(model(x) / 2.0, -1)[torch.arange(5), y]
    torch.testing.assert_close(q, 1 - p)


def test_layout_offsets_and_errors():
    model = mlp()
    lay = ParamLayout.of(model, ["2.bias", "0.weight"])
    assert lay.names == ("0.weight", "2.bias")
    assert lay.offsets == (0, 64) and lay.grad_dim == 67
    with pytest.raises(ConfigError, match=r"\['fc9.weight'\] are not parameters"):
        ParamLayout.of(model, ["fc9.weight"])
