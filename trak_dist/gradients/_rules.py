"""Per-module-type rules of the hook engine: per-sample parameter gradients from a module's
inputs ``a`` and its output gradient ``δ``.

Matrix weights come out as :class:`FactorBlock` s (Σ_t left_t ⊗ right_t), the rest as
:class:`GradBlock` s. Supported: ``nn.Linear``, HF ``Conv1D``, ``nn.Conv1d/2d`` with
``groups=1`` (Linear on the unfolded input), ``nn.Embedding`` without ``max_norm`` /
``scale_grad_by_freq``, and the normalisation layers of ``_norms.py``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from trak_dist.errors import ConfigError
from trak_dist.projection import FactorBlock, GradBlock

Blocks = list[GradBlock | FactorBlock]


class Rule(ABC):
    """Per-sample gradients of one module type's own parameters (``params``: local names
    covered; ``keeps_output``: ``blocks`` needs the module's output)."""

    params: tuple[str, ...] = ("weight", "bias")
    keeps_output = False

    def unsupported(self, module: Any) -> str | None:
        """Why this module instance cannot be handled (a configuration the rule lacks), or None."""
        return None

    def view_cols(self, module: Any, local: str) -> int | None:
        """Columns of the parameter's natural matrix view (the one its factors use), or None."""
        return None

    @abstractmethod
    def blocks(
        self,
        module: Any,
        inputs: tuple[Any, ...],
        output: Tensor | None,
        grad: Tensor,
        offsets: dict[str, int],
    ) -> Blocks:
        """The selected parameters' per-sample gradients of one call of ``module``, from its
        detached ``inputs`` (batch first), ``output`` (when ``keeps_output``), ``grad`` δ and
        the global ``offsets`` of its selected local parameters."""


def first_input(module: nn.Module, inputs: tuple[Any, ...]) -> Tensor:
    if not inputs or not isinstance(inputs[0], Tensor):
        raise ConfigError(
            f"the hook engine reads a {type(module).__name__}'s input from its first positional "
            "argument, but it was called without one (keyword-only call?). Use "
            "gradient_engine=vmap for this model."
        )
    return inputs[0]


def tokens(x: Tensor, batch: int, features: int) -> Tensor:
    """``[B, *, features]`` → ``[B, T, features]`` (T: all positions between the two)."""
    if x.dim() < 2 or x.shape[0] != batch:
        raise ConfigError(
            f"a module input/output of shape {tuple(x.shape)} has no leading batch dimension of "
            f"size {batch}; the hook engine needs samples on dim 0 of every module's tensors. Use "
            "gradient_engine=vmap for this model."
        )
    return x.reshape(batch, -1, features)


class LinearRule(Rule):
    transposed = False  # True: the weight is stored [in, out] (transformers' Conv1D)

    def view_cols(self, module: Any, local: str) -> int | None:
        return int(module.weight.shape[1]) if local == "weight" else None

    def blocks(
        self,
        module: Any,
        inputs: tuple[Any, ...],
        output: Tensor | None,
        grad: Tensor,
        offsets: dict[str, int],
    ) -> Blocks:
        b = grad.shape[0]
        rows, cols = module.weight.shape
        out_f, in_f = (cols, rows) if self.transposed else (rows, cols)
        delta = tokens(grad, b, out_f)
        found: Blocks = []
        if "weight" in offsets:
            a = tokens(first_input(module, inputs), b, in_f)
            if self.transposed:
                found.append(FactorBlock(offsets["weight"], in_f, a, delta))
            else:
                found.append(FactorBlock(offsets["weight"], out_f, delta, a))
        if "bias" in offsets:
            found.append(GradBlock(offsets["bias"], delta.sum(1)))
        return found


class HFConv1DRule(LinearRule):
    """transformers' ``Conv1D``: a Linear layer with the weight stored ``[in, out]``."""

    transposed = True


class ConvRule(Rule):
    """``nn.Conv1d`` / ``nn.Conv2d``: the input is padded as the module pads it, then unfolded
    into ``[B, in·k, L]`` patches whose column order is the weight's (in, kh, kw) order."""

    def unsupported(self, module: Any) -> str | None:
        if module.groups != 1:
            return f"groups={module.groups} (grouped/depthwise convolutions are not supported)"
        return None

    def view_cols(self, module: Any, local: str) -> int | None:
        return int(module.weight[0].numel()) if local == "weight" else None

    def blocks(
        self,
        module: Any,
        inputs: tuple[Any, ...],
        output: Tensor | None,
        grad: Tensor,
        offsets: dict[str, int],
    ) -> Blocks:
        b = grad.shape[0]
        out_c = module.out_channels
        delta = grad.reshape(b, out_c, -1)  # [B, out, L]
        found: Blocks = []
        if "weight" in offsets:
            patches = self._patches(module, first_input(module, inputs))  # [B, in·k, L]
            if patches.shape[0] != b or patches.shape[2] != delta.shape[2]:
                raise ConfigError(
                    f"unfolding the input of {module} gave {tuple(patches.shape)} patches for an "
                    f"output gradient of {tuple(grad.shape)}; use gradient_engine=vmap."
                )
            weight = FactorBlock(
                offsets["weight"], out_c, delta.transpose(1, 2), patches.transpose(1, 2)
            )
            found.append(weight)
        if "bias" in offsets:
            found.append(GradBlock(offsets["bias"], delta.sum(2)))
        return found

    @staticmethod
    def _patches(module: Any, x: Tensor) -> Tensor:
        # the module's own padding (any padding_mode, string paddings included), then none in unfold
        pad = tuple(module._reversed_padding_repeated_twice)
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        x = F.pad(x, pad, mode=mode) if any(pad) else x
        kernel, stride, dilation = module.kernel_size, module.stride, module.dilation
        if isinstance(module, nn.Conv1d):
            x = x.unsqueeze(2)
            kernel, stride, dilation = (1, *kernel), (1, *stride), (1, *dilation)
        return F.unfold(x, kernel, dilation=dilation, stride=stride)


class EmbeddingRule(Rule):
    params = ("weight",)

    def unsupported(self, module: Any) -> str | None:
        if module.max_norm is not None:
            return f"max_norm={module.max_norm} (the forward renormalises the weight in place)"
        if module.scale_grad_by_freq:
            return "scale_grad_by_freq=True (a sample's gradient would depend on its batch)"
        return None

    def view_cols(self, module: Any, local: str) -> int | None:
        return int(module.embedding_dim)

    def blocks(
        self,
        module: Any,
        inputs: tuple[Any, ...],
        output: Tensor | None,
        grad: Tensor,
        offsets: dict[str, int],
    ) -> Blocks:
        b, dim = grad.shape[0], module.embedding_dim
        ids = first_input(module, inputs)
        if ids.shape[0] != b:
            raise ConfigError(
                f"{type(module).__name__} got ids of shape {tuple(ids.shape)} for a batch of {b}; "
                "the hook engine needs samples on dim 0. Use gradient_engine=vmap."
            )
        ids = ids.reshape(b, -1)
        delta = tokens(grad, b, dim)
        if module.padding_idx is not None:
            delta = delta * (ids != module.padding_idx).unsqueeze(-1).to(delta.dtype)
        return [FactorBlock(offsets["weight"], module.num_embeddings, ids.long(), delta)]


def is_hf_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D``, recognised without importing transformers."""
    cls = type(module)
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers.")


def matrix_rule(module: nn.Module) -> Rule | None:
    if isinstance(module, nn.Linear):
        return LinearRule()
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return ConvRule()
    if isinstance(module, nn.Embedding):
        return EmbeddingRule()
    if is_hf_conv1d(module):
        return HFConv1DRule()
    return None
