"""Rows of X and Q for a batch: per-sample gradients, projected, scaled by 1/sqrt(d)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from trak_dist._padding import length_order, trim
from trak_dist.batches import Batch, batch_size, micro_batches, select
from trak_dist.errors import ConfigError, LabelError
from trak_dist.gradients import GradientComputer, HookGradientComputer, ParamLayout, kronecker_views
from trak_dist.projection import (
    FactorBlock,
    GradBlock,
    ProjectionKind,
    Projector,
    as_blocks,
    make_projector,
    spec_params,
    uniform_rows,
)
from trak_dist.tasks import SampledLabels, attach_uniforms


def normalize_factor(d: int, projector: Projector, micro_batch: int | None) -> Tensor:
    """sqrt(d) in float32 (as traker 0.3.2, for identical numbers), once ``projector`` and
    ``micro_batch`` are checked to fit d (else ConfigError)."""
    if projector.grad_dim != d:
        raise ConfigError(
            f"the projector was built for grad_dim={projector.grad_dim}, the model's "
            f"selected parameters have {d} entries; build both from the same grad_wrt."
        )
    if micro_batch is not None and micro_batch < 1:
        raise ConfigError(f"micro_batch={micro_batch}; expected a positive integer or None.")
    return torch.sqrt(torch.tensor(d, dtype=torch.float32))


class Featurizer:
    """Turns batches into projected gradients, ``micro_batch`` samples at a time.

    Peak memory is one micro-batch of per-sample gradients plus the projector's working set,
    whatever the batch size (docs/design.md, invariant 5): ``micro_batch × d`` with vmap,
    ``micro_batch ×`` the largest module with hooks, less with Kronecker factors.

    Args:
        projector: P (its ``grad_dim`` must equal the computer's).
        micro_batch: samples per call; None for the whole batch at once.
    """

    def __init__(
        self,
        computer: GradientComputer,
        projector: Projector,
        micro_batch: int | None = None,
        sampled: SampledLabels | None = None,
    ) -> None:
        self.computer = computer
        self.projector = projector
        self.micro_batch = micro_batch
        self.sampled = sampled
        self.normalize_factor = normalize_factor(computer.layout.grad_dim, projector, micro_batch)

    def fisher(self, batch: Batch, model_id: int, start: int | Tensor, draw: int = 0) -> Tensor:
        """``[B, p]`` float32 rows G of the sampled-label Fisher (``tasks/_sampled.py``) for
        rows ``[start, start + B)`` of their set (or, ``start`` a ``[B]`` tensor, for those
        rows: TRAKer's ``inds``): the same P and scaling as X, the gradients of the
        log-likelihood of labels drawn from the model with each row's own uniforms (those of
        label draw ``draw``)."""
        if self.sampled is None:
            raise ConfigError("this featurizer was built without a sampled-label task.")
        if isinstance(start, Tensor):
            rows = start.reshape(-1).to(torch.int64)
        else:
            rows = torch.arange(start, start + batch_size(batch))
        seed = int(getattr(self.projector, "seed", 0))
        noise = uniform_rows(seed, model_id, rows, self.sampled.width(batch), draw=draw)
        was = self.computer.task
        self.computer.task = self.sampled
        try:
            return self.project(attach_uniforms(batch, noise), model_id)
        finally:
            self.computer.task = was

    def project(self, batch: Batch, model_id: int) -> Tensor:
        """``[B, p]`` float32 projected, scaled gradients on the CPU (LabelError: a label
        outside the model's classes, at its batch position)."""
        out, rows = [], []
        for where, mb in self._pieces(batch):
            with _in_batch(where):
                out.append(self._micro_batch(mb, model_id, with_q=False)[0])
            rows.extend(where)
        return _in_order(torch.cat(out), rows)

    def featurize(self, batch: Batch, model_id: int) -> tuple[Tensor, Tensor]:
        """``([B, p], [B])``: projected gradients and Q, float32 on the CPU (LabelError as
        :meth:`project`)."""
        xs, qs, rows = [], [], []
        for where, mb in self._pieces(batch):
            with _in_batch(where):
                x, q = self._micro_batch(mb, model_id, with_q=True)
                # out_to_loss runs outside vmap: a label vmap could not read is named here
                qs.append(self.computer.out_to_loss(mb).cpu() if q is None else q)
            xs.append(x)
            rows.extend(where)
        return _in_order(torch.cat(xs), rows), _in_order(torch.cat(qs), rows)

    def _pieces(self, batch: Batch) -> Iterator[tuple[list[int], Batch]]:
        """Micro-batches and the batch positions of their rows. A right-padded token batch is
        grouped by length and each piece cut to its longest row (``_padding``: less padding
        in the passes, the same gradients up to float rounding)."""
        order = length_order(batch)
        if order is None:
            for start, mb in _offsets(micro_batches(batch, self.micro_batch)):
                yield list(range(start, start + batch_size(mb))), mb
            return
        for start, mb in _offsets(micro_batches(select(batch, order), self.micro_batch)):
            yield order[start : start + batch_size(mb)].tolist(), trim(mb)

    def _micro_batch(self, mb: Batch, model_id: int, with_q: bool) -> tuple[Tensor, Tensor | None]:
        """The scaled projection of one micro-batch (CPU) and, where the hook engine's task
        gives it from the same forward pass (``with_q``), its Q (CPU); else None."""
        q = None
        if isinstance(self.computer, HookGradientComputer):
            x, q = self._project_streamed(mb, model_id, with_q)
        else:
            x = self._project_dense(mb, model_id)
        x = (x / self.normalize_factor.to(x.device)).cpu()
        return x, None if q is None else q.cpu()

    def _project_dense(self, mb: Batch, model_id: int) -> Tensor:
        grads = self.computer.per_sample_grads(mb)
        blocks = [
            GradBlock(o, g.reshape(g.shape[0], -1))
            for o, g in zip(self.computer.layout.offsets, grads.values(), strict=True)
        ]
        return self.projector.project(blocks, model_id)

    def _project_streamed(
        self, mb: Batch, model_id: int, with_q: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Module by module, as the hook engine's backward pass reaches them: each module's
        blocks are projected and added, so no more than one module's per-sample gradients
        exist at a time (the projection is linear, and a tied weight's uses simply add)."""
        assert isinstance(self.computer, HookGradientComputer)
        factors = getattr(self.projector, "accepts_factors", False)
        acc: list[Tensor] = []

        def sink(blocks: list[GradBlock | FactorBlock]) -> None:
            # only a projector that says so gets factor blocks (traker's projectors, wrapped,
            # know nothing of them); the others get the formed gradients
            items: list[GradBlock | FactorBlock] = (
                blocks if factors else [gb for b in blocks for gb in as_blocks([b])]
            )
            x = self.projector.project(items, model_id)
            if acc:
                acc[0] += x
            else:
                acc.append(x)

        q = self.computer.stream(mb, sink, with_q)
        if acc:
            return acc[0], q
        # no output depends on θ
        return torch.zeros(batch_size(mb), self.projector.proj_dim), q


def _offsets(pieces: list[Batch]) -> Iterator[tuple[int, Batch]]:
    start = 0
    for mb in pieces:
        yield start, mb
        start += batch_size(mb)


def _in_order(rows_out: Tensor, rows: list[int]) -> Tensor:
    """``rows_out`` (row k is batch position ``rows[k]``) in batch order."""
    if rows == list(range(len(rows))):
        return rows_out
    out = torch.empty_like(rows_out)
    out[torch.as_tensor(rows)] = rows_out
    return out


@contextmanager
def _in_batch(rows: Sequence[int]) -> Iterator[None]:
    """Restate a LabelError's micro-batch positions as positions in the whole batch."""
    try:
        yield
    except LabelError as e:
        raise e.at(rows, "batch positions") from None


def build_featurizer(
    computer: GradientComputer,
    kind: ProjectionKind | str,
    proj_dim: int,
    seed: int = 0,
    backend: str = "auto",
    micro_batch: int | None = None,
    curvature: str = "xtx",
) -> Featurizer:
    """A featurizer with ``make_projector``'s projector for ``computer``'s model and layout
    (the Kronecker projector gets the parameters' matrix views from the model); with
    ``curvature="fisher"`` it also gives the rows G of the sampled-label Fisher (``fisher``)."""
    views = None
    if ProjectionKind(kind) is ProjectionKind.KRONECKER:
        views = kronecker_views(computer.model, computer.layout)
    projector = make_projector(
        kind, computer.layout.grad_dim, proj_dim, seed, computer.device, backend, views
    )
    sampled = SampledLabels(computer.task) if curvature == "fisher" else None
    return Featurizer(computer, projector, micro_batch, sampled)


def projection_params(
    kind: ProjectionKind | str, model: torch.nn.Module, layout: ParamLayout
) -> str:
    """``FeatureSpec.projection_params`` for a projection of ``model``'s selected parameters."""
    if ProjectionKind(kind) is not ProjectionKind.KRONECKER:
        return ""
    return spec_params(kronecker_views(model, layout))
