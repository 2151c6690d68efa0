"""Hook rules for normalisation layers ``y = w ⊙ x̂ + b``: per-sample ``Σ δ ⊙ x̂`` and ``Σ δ``.

Supported: ``nn.LayerNorm``, ``nn.RMSNorm`` (trailing dims); ``nn.GroupNorm``,
``nn.BatchNorm1d/2d/3d`` with running statistics (per channel); Hugging Face ``*RMSNorm`` with
one 1-D ``weight``, where x̂ is the module's output with unit weight and every call checks
``y = w ⊙ x̂`` (so Gemma's ``(1 + w) ⊙ x̂`` is an error, not wrong gradients)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trak_dist.errors import ConfigError
from trak_dist.gradients._rules import Blocks, Rule, first_input
from trak_dist.projection import GradBlock


class AffineNormRule(Rule):
    """``y = w ⊙ x̂ + b``; subclasses say how x̂ is computed and which dims w spans."""

    channel_dim = False  # True: w spans dim 1 (GroupNorm, BatchNorm); False: the trailing dims

    def normalized(self, module: Any, x: Tensor) -> Tensor:
        raise NotImplementedError

    def blocks(
        self,
        module: Any,
        inputs: tuple[Any, ...],
        output: Tensor | None,
        grad: Tensor,
        offsets: dict[str, int],
    ) -> Blocks:
        b = grad.shape[0]
        n = module.weight.numel() if module.weight is not None else module.bias.numel()
        delta = self._per_feature(grad, b, n)
        found: Blocks = []
        if "weight" in offsets:
            xhat = self.normalized(module, first_input(module, inputs).detach())
            self.check(module, xhat, output)
            found.append(
                GradBlock(offsets["weight"], (delta * self._per_feature(xhat, b, n)).sum(1))
            )
        if "bias" in offsets:
            found.append(GradBlock(offsets["bias"], delta.sum(1)))
        return found

    def check(self, module: Any, xhat: Tensor, output: Tensor | None) -> None:
        """Hook for rules that verify ``y = w ⊙ x̂`` (only the generic RMS norm needs it)."""

    def _per_feature(self, x: Tensor, batch: int, n: int) -> Tensor:
        """``[B, T, n]``: the feature axis last, every other position in T."""
        if x.shape[0] != batch:
            raise ConfigError(
                f"a normalisation layer's tensor has shape {tuple(x.shape)}, not batch {batch} "
                "first; use gradient_engine=vmap for this model."
            )
        if self.channel_dim:
            return x.reshape(batch, n, -1).transpose(1, 2)
        return x.reshape(batch, -1, n)


class LayerNormRule(AffineNormRule):
    def normalized(self, module: Any, x: Tensor) -> Tensor:
        return F.layer_norm(x, module.normalized_shape, None, None, module.eps)


class TorchRMSNormRule(AffineNormRule):
    params = ("weight",)

    def normalized(self, module: Any, x: Tensor) -> Tensor:
        return F.rms_norm(x, module.normalized_shape, None, module.eps)


class GroupNormRule(AffineNormRule):
    channel_dim = True

    def normalized(self, module: Any, x: Tensor) -> Tensor:
        return F.group_norm(x, module.num_groups, None, None, module.eps)


class BatchNormRule(AffineNormRule):
    channel_dim = True

    def unsupported(self, module: Any) -> str | None:
        if module.running_mean is None or module.running_var is None:
            return (
                "track_running_stats=False (it normalises with the batch's statistics even in "
                "eval mode, so a sample's gradient depends on its batch)"
            )
        return None

    def normalized(self, module: Any, x: Tensor) -> Tensor:
        return F.batch_norm(
            x, module.running_mean, module.running_var, None, None, False, 0.0, module.eps
        )


class ScaledRMSNormRule(AffineNormRule):
    """A Hugging Face style ``*RMSNorm`` (see the module docstring)."""

    params = ("weight",)
    keeps_output = True

    def normalized(self, module: Any, x: Tensor) -> Tensor:
        ones = {"weight": torch.ones_like(module.weight)}
        with torch.no_grad():
            return torch.func.functional_call(module, ones, (x,))

    def check(self, module: Any, xhat: Tensor, output: Tensor | None) -> None:
        assert output is not None  # keeps_output
        expected = module.weight.detach() * xhat
        scale = float(output.abs().max()) if output.numel() else 0.0
        if not torch.allclose(expected, output, rtol=1e-4, atol=1e-5 * scale):
            raise ConfigError(
                f"{type(module).__name__} looks like an RMS norm (y = w ⊙ x̂) but its output is "
                f"not its weight times its output at weight 1 (max deviation "
                f"{float((expected - output).abs().max()):.3g}); the hook engine has no rule for "
                "this variant. Use gradient_engine=vmap, or leave its weight out with grad_wrt."
            )


def is_scaled_rms_norm(module: nn.Module) -> bool:
    params = dict(module.named_parameters(recurse=False))
    return (
        type(module).__name__.endswith("RMSNorm")
        and list(params) == ["weight"]
        and params["weight"].dim() == 1
    )


def norm_rule(module: nn.Module) -> Rule | None:
    if isinstance(module, nn.LayerNorm):
        return LayerNormRule()
    if isinstance(module, nn.RMSNorm):
        return TorchRMSNormRule()
    if isinstance(module, nn.GroupNorm):
        return GroupNormRule()
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return BatchNormRule()
    if is_scaled_rms_norm(module):
        return ScaledRMSNormRule()
    return None
