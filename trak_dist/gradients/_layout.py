"""The parameters a gradient is taken with respect to, and where each sits in the flat vector."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from trak_dist.errors import ConfigError


@dataclass(frozen=True)
class ParamLayout:
    """The selected parameters in ``named_parameters()`` order with their flat offsets: the rows
    of P, the same in every worker (it depends only on the model class and ``grad_wrt``)."""

    names: tuple[str, ...]
    numels: tuple[int, ...]
    offsets: tuple[int, ...]

    @property
    def grad_dim(self) -> int:
        return self.offsets[-1] + self.numels[-1] if self.names else 0

    @classmethod
    def of(cls, model: nn.Module, grad_wrt: Iterable[str] | None = None) -> ParamLayout:
        params = dict(model.named_parameters())
        if grad_wrt is None:
            chosen = list(params)
        else:
            wanted = list(grad_wrt)
            unknown = [w for w in wanted if w not in params]
            if unknown:
                raise ConfigError(
                    f"grad_wrt names {unknown} are not parameters of {type(model).__name__}; "
                    f"its parameters are {list(params)[:12]}{' …' if len(params) > 12 else ''}. "
                    "Use names as they appear in model.named_parameters()."
                )
            chosen = [n for n in params if n in set(wanted)]
        if not chosen:
            raise ConfigError("grad_wrt selects no parameters; pass None for all of them.")
        numels = [params[n].numel() for n in chosen]
        offsets = [sum(numels[:k]) for k in range(len(numels))]
        return cls(tuple(chosen), tuple(numels), tuple(offsets))
