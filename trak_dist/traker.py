"""``TRAKer``: traker 0.3.2's API on the trak_dist store; switch with one import.

    from trak_dist import TRAKer      # instead of: from trak import TRAKer

Differences, all deliberate: the projection is the same Rademacher matrix on CPU and GPU
(traker uses a normal one on CPU); XᵀX is accumulated in float64 and inverted through an
eigendecomposition; Q and scores are stored in float32 even with ``use_half_precision``; the
features Φ are never materialised (scores are computed as X (X_t K⁻¹)ᵀ).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from trak_dist.batches import Batch, select
from trak_dist.errors import ConfigError, StoreStateError
from trak_dist.featurize import Featurizer
from trak_dist.gradients import GradientComputer
from trak_dist.projection import IdentityProjector, ProjectionKind, Projector, make_projector
from trak_dist.scoring import compute_scores, ensure_factor, xtx_from_rows
from trak_dist.store import (
    DEFAULT_CODEC,
    FeatureSpec,
    FeatureStore,
    RowSet,
    checkpoint_fingerprint,
    row_hashes,
)
from trak_dist.store._hashes import check_unchanged
from trak_dist.tasks import describe, resolve_task

logger = logging.getLogger("trak_dist")


class _RowTracker:
    """Rows written by this process into partly done chunks; commits a chunk once it is full.

    Also the ``num_samples=`` cursor: consecutive calls fill consecutive rows, as in traker.
    """

    def __init__(self, rows: RowSet) -> None:
        self.rows = rows
        self.done = np.repeat(rows.done_chunks(), rows.chunk_rows)[: rows.n]
        self.committed = self.done.copy()
        self.cursor = 0

    def take(self, inds: Iterable[int] | None, num_samples: int | None) -> np.ndarray:
        """The rows of the next batch: ``inds``, or the next ``num_samples`` rows."""
        if (inds is None) == (num_samples is None):
            raise ConfigError("pass exactly one of inds= and num_samples=.")
        if inds is not None:
            return np.asarray(inds, dtype=np.int64).reshape(-1)
        rows = np.arange(self.cursor, self.cursor + int(num_samples), dtype=np.int64)  # type: ignore[arg-type]
        self.cursor += len(rows)
        return rows

    def pending(self, inds: np.ndarray) -> np.ndarray:
        return ~self.done[inds]

    def mark(self, inds: np.ndarray) -> None:
        self.done[inds] = True
        chunks = np.unique(inds // self.rows.chunk_rows)
        full = [
            c
            for c in chunks
            if self.done[c * self.rows.chunk_rows : (c + 1) * self.rows.chunk_rows].all()
        ]
        fresh = [c for c in full if not self.committed[c * self.rows.chunk_rows]]
        if fresh:
            self.rows.commit_chunks(np.asarray(fresh))
            for c in fresh:
                self.committed[c * self.rows.chunk_rows : (c + 1) * self.rows.chunk_rows] = True


class TRAKer:
    """TRAK scores for a model, its checkpoints, a train set and target sets (traker's API).

    Arguments are traker 0.3.2's; ``gradient_computer``, ``projector``, ``proj_max_batch_size``
    behave as there (the latter is ignored: our kernel takes any batch size). ``saver`` and
    ``score_computer`` are not supported (the Zarr store replaces them). Extra keywords:

    Args:
        micro_batch_size: samples per vmap call (bounds memory); None for the whole batch.
        projection: ``rademacher`` (default), ``normal`` or ``identity``.
        kinv_scaling: ``mean_abs`` (traker's: K⁻¹ divided by its mean |entry|) or ``none``.
        dataset_fingerprint: identifies the train set in the store's metadata. Rows are also
            hashed as they are featurised, and a batch whose rows were featurised before is
            checked against those hashes, so changed data is an error whatever this says.
        store_codec, chunk_rows: storage layout (see ``FeatureSpec``).
        topk: proponents/opponents kept per target.
    """

    def __init__(
        self,
        model: nn.Module,
        task: Any,
        train_set_size: int,
        save_dir: str | Path = "./trak_results",
        load_from_save_dir: bool = True,
        device: str | torch.device = "cuda",
        gradient_computer: type[GradientComputer] = GradientComputer,
        projector: Projector | Any | None = None,
        saver: Any = None,
        score_computer: Any = None,
        proj_dim: int = 2048,
        logging_level: int = logging.INFO,
        use_half_precision: bool = True,
        proj_max_batch_size: int = 32,
        projector_seed: int = 0,
        grad_wrt: Iterable[str] | None = None,
        lambda_reg: float = 0.0,
        *,
        micro_batch_size: int | None = None,
        projection: str = "rademacher",
        kinv_scaling: str = "mean_abs",
        dataset_fingerprint: str = "unspecified",
        store_codec: str = DEFAULT_CODEC,
        chunk_rows: int = 256,
        topk: int = 10,
    ) -> None:
        if saver is not None or score_computer is not None:
            raise ConfigError(
                "saver= and score_computer= are traker internals that trak_dist replaces with its "
                "Zarr store and block-wise scorer; leave them unset."
            )
        logger.setLevel(logging_level)
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.task = resolve_task(task)
        self.lambda_reg = float(lambda_reg)
        self.kinv_scaling = kinv_scaling
        self.topk = topk
        grad_wrt = None if grad_wrt is None else tuple(grad_wrt)
        self.computer = gradient_computer(self.model, self.task, grad_wrt, self.device)
        d = self.computer.layout.grad_dim
        if projector is not None and getattr(projector, "proj_dim", None) == 0:
            projector = IdentityProjector(d)  # traker's NoOpProjector
        if projector is None:
            projector = make_projector(projection, d, proj_dim, projector_seed, self.device)
        self.projector = projector
        kind = ProjectionKind(getattr(projector, "kind", projection))
        self.proj_dim = projector.proj_dim
        self.featurizer = Featurizer(self.computer, projector, micro_batch_size)
        spec = FeatureSpec(
            proj_dim=self.proj_dim,
            projection=kind.value,
            seed=int(projector_seed),
            grad_wrt=grad_wrt,
            model_output=describe(self.task),
            grad_dim=d,
            train_size=int(train_set_size),
            dataset_fingerprint=dataset_fingerprint,
            dtype="float16" if use_half_precision else "float32",
            chunk_rows=chunk_rows,
        )
        self.save_dir = Path(save_dir).resolve()
        self.store = FeatureStore.create_or_open(
            self.save_dir, spec, store_codec, overwrite=not load_from_save_dir
        )
        self._model_id: int | None = None
        self._fingerprint: str | None = None
        self._train: _RowTracker | None = None
        self._targets: _RowTracker | None = None

    def _load(self, checkpoint: Mapping[str, Tensor]) -> str:
        self.computer.load_state_dict(dict(checkpoint))
        return checkpoint_fingerprint(checkpoint)

    def load_checkpoint(
        self,
        checkpoint: Mapping[str, Tensor],
        model_id: int,
        _allow_featurizing_already_registered: bool = False,
    ) -> None:
        """Load a checkpoint's weights and make ``model_id`` the one ``featurize`` writes."""
        fingerprint = self._load(checkpoint)
        self._train = _RowTracker(self.store.ensure_checkpoint(model_id, fingerprint))
        self._model_id = int(model_id)
        self._fingerprint = fingerprint

    def featurize(
        self,
        batch: Batch,
        inds: Iterable[int] | None = None,
        num_samples: int | None = None,
    ) -> None:
        """Project the per-sample gradients of ``batch`` into rows ``inds`` of X (and Q)."""
        if self._train is None:
            raise StoreStateError("call load_checkpoint(checkpoint, model_id) before featurize.")
        self._write(self._train, batch, inds, num_samples, with_q=True)

    def _write(
        self,
        tracker: _RowTracker,
        batch: Batch,
        inds: Iterable[int] | None,
        num_samples: int | None,
        with_q: bool,
    ) -> None:
        """Featurise the rows of ``batch`` not yet committed (a rerun skips the others)."""
        assert self._model_id is not None  # set together with every tracker
        rows = tracker.take(inds, num_samples)
        hashes = row_hashes(batch)
        todo = tracker.pending(rows)
        what = f"{'train' if with_q else 'target'} (model_id={self._model_id})"
        if not todo.all():  # rows featurised before: were they these items?
            done = rows[~todo]
            stored = tracker.rows.read_hashes(done)
            check_unchanged(stored, hashes[~todo], done, what, self.store.where)
        if not todo.any():
            logger.debug("all %d samples of this batch are already featurised", len(rows))
            return
        sub = batch if todo.all() else select(batch, torch.as_tensor(todo))
        self.store.bind(tracker.rows, self._fingerprint, what)
        if with_q:
            x, q = self.featurizer.featurize(sub, self._model_id)
            tracker.rows.write_indices(rows[todo], x.numpy(), q.numpy(), hashes[todo])
        else:
            x = self.featurizer.project(sub, self._model_id)
            tracker.rows.write_indices(rows[todo], x.numpy(), None, hashes[todo])
        tracker.mark(rows[todo])

    def finalize_features(
        self, model_ids: Iterable[int] | None = None, del_grads: bool = False
    ) -> None:
        """Compute XᵀX (float64) and its eigendecomposition for each checkpoint, once."""
        for model_id in self.store.checkpoint_ids() if model_ids is None else model_ids:
            rows = self.store.train_rows(model_id)
            missing = int((~rows.done_chunks()).sum())
            if missing:
                raise StoreStateError(
                    f"model_id={model_id} is not fully featurised: {missing} of {rows.n_chunks} "
                    f"chunks of {rows.chunk_rows} rows are missing. Featurise all "
                    f"{rows.n} train examples first."
                )
            if self.store.read_xtx(model_id) is None:
                self.store.write_xtx(model_id, xtx_from_rows(rows, 0, rows.n, device=self.device))
            ensure_factor(self.store, model_id, self.proj_dim, self.device)

    def start_scoring_checkpoint(
        self, exp_name: str, checkpoint: Mapping[str, Tensor], model_id: int, num_targets: int
    ) -> None:
        """Load a checkpoint to featurise the targets of experiment ``exp_name`` with."""
        fingerprint = self._load(checkpoint)
        self.store.ensure_experiment(exp_name, num_targets, None)
        self._targets = _RowTracker(
            self.store.ensure_target_checkpoint(exp_name, model_id, fingerprint)
        )
        self._model_id = int(model_id)
        self._fingerprint = fingerprint

    def score(
        self,
        batch: Batch,
        inds: Iterable[int] | None = None,
        num_samples: int | None = None,
    ) -> None:
        """Featurise a batch of targets for the current scoring checkpoint."""
        if self._targets is None:
            raise StoreStateError("call start_scoring_checkpoint(...) before score.")
        self._write(self._targets, batch, inds, num_samples, with_q=False)

    def finalize_scores(
        self, exp_name: str, model_ids: Iterable[int] | None = None, allow_skip: bool = False
    ) -> np.ndarray:
        """``[n, m]`` float32 scores averaged over checkpoints (traker's formula)."""
        ids = self.store.checkpoint_ids() if model_ids is None else list(model_ids)
        if allow_skip:
            ready = []
            for c in ids:
                try:
                    ok = self.store.target_rows(exp_name, c).is_complete()
                except StoreStateError:
                    ok = False
                if not ok:
                    logger.warning("no target features for model_id=%s; skipping it", c)
                else:
                    ready.append(c)
            ids = ready
        if not ids:
            raise StoreStateError(f"no checkpoints to score experiment {exp_name!r} with.")
        self.finalize_features(ids)
        sset = compute_scores(
            self.store,
            exp_name,
            ids,
            self.proj_dim,
            self.lambda_reg,
            self.kinv_scaling,
            self.topk,
            device=self.device,
        )
        self.scores = sset.scores()
        return self.scores
