"""The hook engine leaves the user's model as it found it (docs/design.md, invariant 9): no
module, parameter or global hook of trak_dist's survives featurize, score or finalize through
TRAKer, nor a pass that raised in the forward or the backward, and the user's own hooks stay."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn
from torch.nn.modules import module as torch_module

from tests.fixtures.helpers import classification_data
from trak_dist import TRAKer
from trak_dist.gradients import HookGradientComputer

# every per-module hook dictionary torch keeps (full-backward hooks are in _backward_hooks;
# those a torch version lacks are skipped)
MODULE_HOOKS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)
GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def hooks_on(model: nn.Module) -> dict[str, int]:
    """How many hooks of each kind the model (every module, every parameter) and torch's global
    module registry hold; only non-zero counts are listed."""
    counts: dict[str, int] = {}
    for name, m in model.named_modules():
        for attr in MODULE_HOOKS:
            n = len(getattr(m, attr, {}))
            if n:
                counts[f"{name or '<root>'}.{attr}"] = n
    for name, p in model.named_parameters():
        for attr in ("_backward_hooks", "_post_accumulate_grad_hooks"):
            n = len(getattr(p, attr, None) or {})
            if n:
                counts[f"{name}.{attr}"] = n
    for attr in GLOBAL_HOOKS:
        n = len(getattr(torch_module, attr, {}))
        if n:
            counts[f"torch.nn.modules.module.{attr}"] = n
    return counts


class Fail(torch.autograd.Function):
    """Identity forward; a backward that raises (a failure in the middle of a backward pass)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        raise RuntimeError("backward failed on purpose")


class Trap(nn.Module):
    """Between the two Linear layers: passes through, or raises in the forward or the backward,
    as ``mode`` says (``None``, ``"forward"``, ``"backward"``)."""

    def __init__(self) -> None:
        super().__init__()
        self.mode: str | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.mode == "forward":
            raise RuntimeError("forward failed on purpose")
        return Fail.apply(x) if self.mode == "backward" else torch.tanh(x)


def model_with_trap() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), Trap(), nn.Linear(8, 3)).eval()


def traker(model: nn.Module, save_dir) -> TRAKer:
    t = TRAKer(model=model, task="image_classification", train_set_size=6, save_dir=save_dir,
               device="cpu", proj_dim=4, lambda_reg=1e-2, use_half_precision=False,
               gradient_engine="hooks")  # fmt: skip
    assert isinstance(t.computer, HookGradientComputer)
    return t


def test_no_hook_is_left_after_featurize_score_and_finalize(tmp_path):
    model = model_with_trap()
    assert hooks_on(model) == {}
    t = traker(model, tmp_path / "store")
    assert hooks_on(model) == {}, "building the engine registers nothing"
    t.load_checkpoint(model.state_dict(), model_id=0)
    t.featurize(classification_data(6), num_samples=6)
    assert hooks_on(model) == {}, "featurize"
    t.finalize_features()
    assert hooks_on(model) == {}, "finalize_features"
    t.start_scoring_checkpoint("exp", model.state_dict(), model_id=0, num_targets=2)
    t.score(classification_data(2, seed=1), num_samples=2)
    assert hooks_on(model) == {}, "score"
    scores = np.asarray(t.finalize_scores("exp"))
    assert hooks_on(model) == {}, "finalize_scores"
    assert scores.shape == (6, 2) and np.isfinite(scores).all()


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_no_hook_is_left_after_an_exception_mid_featurize(tmp_path, where):
    """The pass fails between the two hooked Linear layers (the first one's forward hook has
    run and hooked its output); the user's own hook survives; the engine still works after."""
    model = model_with_trap()
    seen: list[int] = []
    mine = model[0].register_forward_hook(lambda *_: seen.append(1))
    t = traker(model, tmp_path / "store")
    t.load_checkpoint(model.state_dict(), model_id=0)
    model[1].mode = where
    with pytest.raises(RuntimeError, match=f"{where} failed on purpose"):
        t.featurize(classification_data(6), num_samples=6)
    assert seen, "the forward reached the first Linear before failing"
    assert hooks_on(model) == {"0._forward_hooks": 1}, "only the user's own hook is left"
    model[1].mode = None
    t.featurize(classification_data(6), inds=np.arange(6))  # the failed call moved the cursor
    assert hooks_on(model) == {"0._forward_hooks": 1}
    mine.remove()
    assert hooks_on(model) == {}
