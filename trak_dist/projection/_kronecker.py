"""The Kronecker projection: each parameter's block of P is ``L ⊗ R`` (docs/projection.md).

A parameter seen as a ``[rows, cols]`` matrix G gets the ``[k, k]`` sketch ``Lᵀ G R`` with
hash-defined ±1 factors L ``[rows, k]`` and R ``[cols, k]``, ``k = ⌈√p⌉``; output column j reads
the sketch at the pair ``(u_j, v_j)`` of a fixed enumeration, so column j does not depend on p
(prefix property). When G = Σ_t x_t y_tᵀ arrives as factors (module hooks), the sketch is
Σ_t (Lᵀ x_t)(Rᵀ y_t)ᵀ and G is never formed: O(T·(rows + cols)·k) instead of O(rows·cols·p)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from trak_dist.errors import ConfigError
from trak_dist.projection._base import (
    FactorBlock,
    GradBlock,
    GradInput,
    ProjectionKind,
    Projector,
    as_blocks,
    check_model_id,
)
from trak_dist.projection._generate import rademacher_block
from trak_dist.projection._kron_views import (
    ParamView,
    check_views,
    factor_size,
    shell_pairs,
    spec_params,
)

LEFT_KEY_TWEAK = 0x6B726F4C  # ASCII "kroL"
RIGHT_KEY_TWEAK = 0x6B726F52  # ASCII "kroR"
SHARES = ("sum", "concat")
# explicit rows of P kept between micro-batches, in all (pieces of parameters: ``_piece``)
PIECE_CACHE_BYTES = 64 << 20


class KroneckerProjector(Projector):
    """``Pᵀ g`` with P's rows for each parameter the Kronecker product of two ±1 factors.

    ``L_m[r, u]`` is Rademacher entry ``(offset_m + r, u)`` under key tweak "kroL", ``R_m`` the
    same under "kroR": independent of p and of every other parameter.

    Args:
        views: every parameter's matrix view, covering ``[0, grad_dim)`` in order.
        share: ``sum`` (every parameter sketches into all p columns; the measured default) or
            ``concat`` (parameter m owns ~p/M columns; see docs/projection.md).
    """

    kind = ProjectionKind.KRONECKER
    accepts_factors = True

    def __init__(
        self,
        grad_dim: int,
        proj_dim: int,
        seed: int,
        views: Sequence[ParamView],
        device: torch.device | str = "cpu",
        share: str = "sum",
    ) -> None:
        super().__init__(grad_dim, proj_dim, seed)
        if share not in SHARES:
            raise ConfigError(f"share={share!r}; expected one of {SHARES}.")
        self.views = tuple(ParamView(*v) for v in views)
        check_views(self.views, grad_dim)
        if share == "concat" and proj_dim < len(self.views):
            raise ConfigError(
                f"share='concat' gives each of the {len(self.views)} parameters its own columns; "
                f"proj_dim={proj_dim} is too small."
            )
        self.share = share
        self.device = torch.device(device)
        self._starts = [v.offset for v in self.views]
        self._columns = [self._columns_of(i) for i in range(len(self.views))]
        self._pairs: dict[int, torch.Tensor] = {}
        self._factors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._pieces: dict[tuple[int, int, int], torch.Tensor] = {}
        self._model_id: int | None = None

    @property
    def spec_params(self) -> str:
        """What else defines this P, for the store's FeatureSpec (see :func:`spec_params`)."""
        return spec_params(self.views, self.share)

    def _columns_of(self, index: int) -> tuple[int, int]:
        if self.share == "sum":
            return 0, self.proj_dim
        m = len(self.views)
        width, extra = divmod(self.proj_dim, m)
        start = index * width + min(index, extra)
        return start, start + width + (index < extra)

    def _flat_pairs(self, width: int) -> torch.Tensor:
        """``[width]`` positions ``u·k + v`` in the flattened ``[k, k]`` sketch."""
        if width not in self._pairs:
            u, v = shell_pairs(width)
            self._pairs[width] = (u * factor_size(width) + v).to(self.device)
        return self._pairs[width]

    def factors(self, model_id: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L [rows, k], R [cols, k])`` float32 of parameter ``index``, cached per checkpoint
        (their size is Σ (rows + cols)·k, far below d·p)."""
        if self._model_id != model_id:
            self._factors.clear()
            self._pieces.clear()
            self._model_id = model_id
        if index not in self._factors:
            view = self.views[index]
            c0, c1 = self._columns[index]
            k = factor_size(c1 - c0)
            self._factors[index] = (
                self._factor(model_id, view.offset, view.rows, k, LEFT_KEY_TWEAK),
                self._factor(model_id, view.offset, view.cols, k, RIGHT_KEY_TWEAK),
            )
        return self._factors[index]

    def _factor(self, model_id: int, offset: int, n: int, k: int, tweak: int) -> torch.Tensor:
        return rademacher_block(
            self.seed, model_id, offset, offset + n, 0, k, torch.float32, self.device, tweak
        )

    def project(self, grads: GradInput, model_id: int) -> torch.Tensor:
        """``[B, p]`` float32: dense gradient blocks and factor blocks, in any mix."""
        model_id = check_model_id(model_id)
        items: list[GradBlock | FactorBlock] = (
            list(grads) if isinstance(grads, (list, tuple)) else list(as_blocks(grads))
        )
        if not items:
            raise ConfigError("project() got no gradient blocks.")
        factor_items = [b for b in items if isinstance(b, FactorBlock)]
        dense = as_blocks([b for b in items if not isinstance(b, FactorBlock)])
        self._check_blocks(dense)
        for fb in factor_items:
            if fb.offset < 0 or fb.offset + fb.rows * fb.cols > self.grad_dim:
                raise ConfigError(
                    f"a factor block at rows [{fb.offset}, {fb.offset + fb.rows * fb.cols}) "
                    f"falls outside the projector's grad_dim={self.grad_dim} (check grad_wrt)."
                )
        first = items[0]
        batch = (first.right if isinstance(first, FactorBlock) else first.grad).shape[0]
        out = torch.zeros(batch, self.proj_dim, dtype=torch.float32, device=self.device)
        for fb in factor_items:
            self._add_factors(out, fb, model_id)
        for gb in dense:
            self._add_dense(out, gb, model_id)
        return out

    def _index_of(self, offset: int) -> int:
        return bisect.bisect_right(self._starts, offset) - 1

    def _add_sketch(self, out: torch.Tensor, sketch: torch.Tensor, index: int) -> None:
        """``out[:, c0:c1] += sketch`` read at the column pairs; sketch is ``[B, k, k]``."""
        c0, c1 = self._columns[index]
        flat = sketch.reshape(sketch.shape[0], -1)
        out[:, c0:c1] += flat[:, self._flat_pairs(c1 - c0)]

    def _add_factors(self, out: torch.Tensor, fb: FactorBlock, model_id: int) -> None:
        index = self._index_of(fb.offset)
        view = self.views[index] if index >= 0 else None
        if view is None or (view.offset, view.rows, view.cols) != (fb.offset, fb.rows, fb.cols):
            # the parameter's view is not the module's (e.g. a narrow head, seen near-square):
            # form its gradient, which is small, and project that
            for gb in fb.grad_blocks():
                self._add_dense(out, gb, model_id)
            return
        left, right = self.factors(model_id, index)
        y = fb.right.to(device=self.device, dtype=torch.float32) @ right  # [B, T, k]
        if fb.one_hot:
            x = left[fb.left.to(self.device)]  # [B, T, k]
        else:
            x = fb.left.to(device=self.device, dtype=torch.float32) @ left
        self._add_sketch(out, x.transpose(1, 2) @ y, index)

    def _add_dense(self, out: torch.Tensor, gb: GradBlock, model_id: int) -> None:
        g = gb.grad.to(device=self.device, dtype=torch.float32)
        lo, hi = gb.offset, gb.offset + g.shape[1]
        index = self._index_of(lo)
        while index < len(self.views) and self.views[index].offset < hi:
            view = self.views[index]
            a, b = max(lo, view.offset), min(hi, view.offset + view.numel)
            part = g[:, a - lo : b - lo]
            if (a, b) == (view.offset, view.offset + view.numel):
                pad = view.rows * view.cols - view.numel
                mat = torch.nn.functional.pad(part, (0, pad)).reshape(-1, view.rows, view.cols)
                left, right = self.factors(model_id, index)
                self._add_sketch(out, left.T @ (mat @ right), index)
            else:  # a piece of a parameter: multiply with its explicit rows of P
                c0, c1 = self._columns[index]
                out[:, c0:c1] += part @ self._piece(model_id, index, a, b)
            index += 1

    def _piece(self, model_id: int, index: int, start: int, end: int) -> torch.Tensor:
        """``_rows``, kept for the next micro-batch while small (an embedding's gradient block
        without its padding row comes as the same piece every time)."""
        key = (index, start, end)
        if key in self._pieces and self._model_id == model_id:
            return self._pieces[key]
        rows = self._rows(model_id, index, start, end)
        held = sum(t.numel() * t.element_size() for t in self._pieces.values())
        if held + rows.numel() * rows.element_size() <= PIECE_CACHE_BYTES:
            self._pieces[key] = rows
        return rows

    def _rows(self, model_id: int, index: int, start: int, end: int) -> torch.Tensor:
        """``[end - start, c1 - c0]``: ``P[start:end, c0:c1]`` of parameter ``index``'s columns."""
        view = self.views[index]
        c0, c1 = self._columns[index]
        left, right = self.factors(model_id, index)
        u, v = shell_pairs(c1 - c0)
        i = torch.arange(start - view.offset, end - view.offset, device=self.device)
        r, c = i // view.cols, i % view.cols
        return left[r][:, u.to(self.device)] * right[c][:, v.to(self.device)]

    def matrix(self, model_id: int, row_start: int = 0, row_end: int | None = None) -> torch.Tensor:
        """``P[row_start:row_end, :]`` as float32 ``[rows, p]`` (tests; small ranges only)."""
        model_id = check_model_id(model_id)
        row_end = self.grad_dim if row_end is None else row_end
        out = torch.zeros(row_end - row_start, self.proj_dim, device=self.device)
        index = max(self._index_of(row_start), 0)
        while index < len(self.views) and self.views[index].offset < row_end:
            view = self.views[index]
            a, b = max(row_start, view.offset), min(row_end, view.offset + view.numel)
            c0, c1 = self._columns[index]
            out[a - row_start : b - row_start, c0:c1] = self._rows(model_id, index, a, b)
            index += 1
        return out

    def free_memory(self) -> None:
        self._factors.clear()
        self._pieces.clear()
        self._model_id = None
