"""``TRAKer``: traker 0.3.2's API on the trak_dist store (``from trak_dist import TRAKer``).

Deliberate differences are listed in docs/traker.md (same Rademacher matrix on
CPU and GPU, float64 XᵀX, float32 Q and scores, Φ never materialised, no implicit deletion)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from trak_dist.batches import Batch
from trak_dist.compat import (
    RowTracker,
    SaverView,
    TrakerGradients,
    adapt_gradient_computer,
    adapt_projector,
    fold_all,
    fold_targets,
    make_featurizer,
    own_projector,
    projection_name,
    traker_classes,
    write_batch,
    writer_name,
)
from trak_dist.errors import ConfigError, StoreMismatchError, StoreStateError, TrakerUsageError
from trak_dist.gradients import GradientComputer, make_computer
from trak_dist.pipeline import Reducer
from trak_dist.projection import Projector
from trak_dist.remote import is_url, local_path
from trak_dist.scoring import ScoreRequest, ScoringConfig, parse_lambda, resolve_kinv_scaling
from trak_dist.store import (
    DEFAULT_CODEC,
    FeatureSpec,
    FeatureStore,
    RowSet,
    checkpoint_fingerprint,
    store_lock,
    variant_name,
)
from trak_dist.tasks import (
    FISHER_DRAWS,
    SampledLabels,
    describe,
    resolve_curvature,
    resolve_task,
    task_defaults,
)

logger = logging.getLogger("trak_dist")


class TRAKer:
    """TRAK scores for a model, its checkpoints, a train set and target sets (traker's API).

    Arguments are traker 0.3.2's, except: ``lambda_reg`` defaults to ``"auto"`` (λ per
    checkpoint from the spectrum of XᵀX; ``0.0`` is traker's default); ``proj_dim``, the
    projection and the curvature default per task (``tasks.task_defaults``, as for
    ``trak-dist`` and ``trak_dist.run``: a causal LM gets the Kronecker projection at p = 2048
    and the sampled-label Fisher as K; other tasks keep traker's dense p = 2048 with XᵀX);
    ``proj_max_batch_size`` is ignored; ``saver`` and ``score_computer`` are not supported
    (``traker.saver`` is a read-only view of the store). ``gradient_computer`` and
    ``projector`` accept ours or traker's classes. ``load_from_save_dir=False`` ignores other
    processes' checkpoints but deletes nothing; ``overwrite=True`` deletes the whole store.

    Args (the extra keywords):
        overwrite: delete the store at ``save_dir`` first.
        micro_batch_size: samples per gradient call (bounds memory); None for the whole batch.
        gradient_engine: ``auto``, ``vmap`` or ``hooks`` (see ``make_computer``), when no
            ``gradient_computer`` class is given.
        projection: ``rademacher``, ``normal``, ``identity`` or ``kronecker``; None: the
            task's default (``kronecker`` for causal LMs, else ``rademacher``).
        curvature: K's Gram: ``xtx`` (traker's XᵀX), ``fisher`` (the sampled-label Fisher's
            GᵀG, a second backward per train row) or ``auto``: the task's default (``fisher``
            for causal LMs, else ``xtx``; ``xtx`` when a traker gradient computer or projector
            is passed, which cannot give the Fisher's rows).
        fisher_draws: label draws per train row with ``fisher``; K is the mean of their Grams.
        kinv_scaling: ``mean_abs`` (traker's: K⁻¹ divided by its mean |entry|), ``none``,
            ``per_target`` or ``auto`` (the default: ``per_target`` with a causal LM's Fisher,
            else ``mean_abs``; docs/design.md, "Checkpoint weights").
        dataset_fingerprint: names the train set in the store (rows are hashed regardless).
        store_codec, chunk_rows: storage layout (see ``FeatureSpec``).
        topk: proponents/opponents kept per target.
        storage_options: ``save_dir`` on object storage (``s3://bucket/run.zarr``): its
            ``store.options`` (endpoint, region, …; credentials from the environment).
    """

    def __init__(
        self,
        model: nn.Module,
        task: Any,
        train_set_size: int,
        save_dir: str | Path = "./trak_results",
        load_from_save_dir: bool = True,
        device: str | torch.device = "cuda",
        gradient_computer: type | None = None,
        projector: Projector | Any | None = None,
        saver: Any = None,
        score_computer: Any = None,
        proj_dim: int | None = None,
        logging_level: int = logging.INFO,
        use_half_precision: bool = True,
        proj_max_batch_size: int = 32,
        projector_seed: int = 0,
        grad_wrt: Iterable[str] | None = None,
        lambda_reg: float | str = "auto",
        *,
        overwrite: bool = False,
        micro_batch_size: int | None = None,
        gradient_engine: str = "auto",
        projection: str | None = None,
        curvature: str = "auto",
        fisher_draws: int = FISHER_DRAWS,
        kinv_scaling: str = "auto",
        dataset_fingerprint: str = "unspecified",
        store_codec: str = DEFAULT_CODEC,
        chunk_rows: int = 256,
        topk: int = 10,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if saver is not None or score_computer is not None:
            raise ConfigError(
                "saver= and score_computer= are traker internals that trak_dist replaces with its "
                "Zarr store and block-wise scorer; leave them unset (traker.saver is a read-only "
                "view of the store)."
            )
        logger.setLevel(logging_level)
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.task = resolve_task(task)
        defaults = task_defaults(self.task, traker=True)
        self.lambda_reg = parse_lambda(lambda_reg)
        self.topk = topk
        grad_wrt = None if grad_wrt is None else tuple(grad_wrt)
        dtype = torch.float16 if use_half_precision else torch.float32
        self.computer: GradientComputer | TrakerGradients
        if gradient_computer is None:
            self.computer = make_computer(
                self.model, self.task, grad_wrt, self.device, gradient_engine
            )
        elif gradient_engine == "hooks":
            raise ConfigError(
                f"gradient_engine='hooks' and gradient_computer={gradient_computer!r} both "
                "choose how gradients are computed; pass one of them."
            )
        else:
            self.computer = adapt_gradient_computer(
                gradient_computer, self.model, self.task, grad_wrt, device, dtype
            )
        d = self.computer.layout.grad_dim
        self.projector = adapt_projector(projector, d) or own_projector(
            self.model,
            self.computer.layout,
            projection or defaults.projection,
            defaults.proj_dim if proj_dim is None else proj_dim,
            projector_seed,
            self.device,
        )
        self.proj_dim = self.projector.proj_dim
        if curvature == "auto" and traker_classes(self.computer, self.projector):
            curvature = "xtx"  # traker's featurize step has no Fisher rows to give
        curvature = resolve_curvature(curvature, self.task)
        sampled = SampledLabels(self.task) if curvature == "fisher" else None
        self.featurizer = make_featurizer(self.computer, self.projector, micro_batch_size, sampled)
        spec = FeatureSpec(
            proj_dim=self.proj_dim,
            projection=projection_name(self.projector),
            seed=self.projector.seed,
            grad_wrt=grad_wrt,
            model_output=describe(self.task),
            grad_dim=d,
            train_size=int(train_set_size),
            dataset_fingerprint=dataset_fingerprint,
            dtype="float16" if use_half_precision else "float32",
            chunk_rows=chunk_rows,
            projection_params=getattr(self.projector, "spec_params", ""),
            curvature=curvature,
            fisher_draws=fisher_draws,
        )
        self.save_dir = save_dir if is_url(save_dir) else Path(local_path(save_dir)).resolve()
        self.store = FeatureStore.create_or_open(
            self.save_dir, spec, store_codec, overwrite, options=storage_options
        )
        # auto from the store's spec, as wherever scores are made (scoring.resolve_kinv_scaling)
        self.kinv_scaling = resolve_kinv_scaling(kinv_scaling, self.store.spec)
        self.reducer = Reducer(self.store, self.device)
        self.load_from_save_dir = bool(load_from_save_dir)
        self._mine: set[int] = set()  # checkpoints this instance loaded (load_from_save_dir=False)
        self._writer = writer_name()  # the keys this instance stages rows under (store/_fold.py)
        self._model_id: int | None = None
        self._train: RowTracker | None = None
        self._targets: RowTracker | None = None
        # row set path -> fingerprint of the checkpoint this instance featurised it with: its
        # finalize folds only rows staged from that checkpoint (store/_fold.py)
        self._fingerprints: dict[str, str] = {}

    @property
    def saver(self) -> SaverView:
        """A read-only view of the store in the shape of traker's ``saver`` (``experiments``,
        ``model_ids``, ``metadata``, ``save_dir``)."""
        variant = variant_name(self.proj_dim, self.lambda_reg, self.kinv_scaling)
        return SaverView(self.store, variant, self._model_id)

    @property
    def gradient_computer(self) -> Any:
        """The gradient computer instance (traker's attribute name)."""
        if isinstance(self.computer, TrakerGradients):
            return self.computer.inner
        return self.computer

    def _ids(self, model_ids: Iterable[int] | None) -> list[int]:
        """``model_ids``, or the default set: every checkpoint in the store, or (with
        ``load_from_save_dir=False``, as traker) only the ones this instance loaded."""
        if model_ids is not None:
            return [int(m) for m in model_ids]
        if self.load_from_save_dir:
            return self.store.checkpoint_ids()
        return sorted(self._mine)

    def _track(self, rows: RowSet, fingerprint: str, model_id: int) -> RowTracker:
        self._fingerprints[rows.group.path] = fingerprint
        self._model_id = int(model_id)
        self._mine.add(int(model_id))
        return RowTracker(rows, self.store.where, self._writer, fingerprint, self.store.options)

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
        with store_lock(
            self.store.where, options=self.store.options
        ):  # processes sharding one checkpoint create it once
            try:
                rows = self.store.ensure_checkpoint(model_id, fingerprint)
            except StoreMismatchError as e:
                raise StoreMismatchError(
                    f"{e} To discard the whole store instead, pass overwrite=True."
                ) from e
        self._train = self._track(rows, fingerprint, model_id)

    def featurize(
        self, batch: Batch, inds: Iterable[int] | None = None, num_samples: int | None = None
    ) -> None:
        """Project the per-sample gradients of ``batch`` into rows ``inds`` of X (and Q)."""
        if self._train is None:
            raise TrakerUsageError(
                "Load a checkpoint using traker.load_checkpoint before featurizing "
                "(load_checkpoint(checkpoint, model_id))."
            )
        write_batch(
            self.store, self.featurizer, self._train, self._model_id, batch, inds, num_samples
        )

    def finalize_features(
        self, model_ids: Iterable[int] | None = None, del_grads: bool = False
    ) -> None:
        """Compute XᵀX (float64) and its eigendecomposition for each checkpoint, once."""
        for model_id in self._ids(model_ids):
            with store_lock(self.store.where, options=self.store.options):
                rows = self.store.train_rows(model_id)
                fold_all(
                    rows,
                    f"model_id={model_id} is not fully featurised",
                    "train examples",
                    self._fingerprints.get(rows.group.path),
                )
                # the pipeline's reduce stage, in this process
                self.reducer.reduce([model_id], [self.proj_dim])
        if self._train is not None:
            self._train.cursor = 0  # as traker

    def start_scoring_checkpoint(
        self, exp_name: str, checkpoint: Mapping[str, Tensor], model_id: int, num_targets: int
    ) -> None:
        """Load a checkpoint to featurise the targets of experiment ``exp_name`` with."""
        fingerprint = self._load(checkpoint)
        with store_lock(self.store.where, options=self.store.options):
            self.store.ensure_experiment(exp_name, num_targets, None)
            rows = self.store.ensure_target_checkpoint(exp_name, model_id, fingerprint)
        self._targets = self._track(rows, fingerprint, model_id)

    def score(
        self, batch: Batch, inds: Iterable[int] | None = None, num_samples: int | None = None
    ) -> None:
        """Featurise a batch of targets for the current scoring checkpoint."""
        if self._targets is None:
            raise TrakerUsageError(
                "call start_scoring_checkpoint(exp_name, checkpoint, model_id, num_targets) "
                "before score."
            )
        targets, model_id = self._targets, self._model_id
        write_batch(self.store, self.featurizer, targets, model_id, batch, inds, num_samples, False)

    def finalize_scores(
        self, exp_name: str, model_ids: Iterable[int] | None = None, allow_skip: bool = False
    ) -> np.ndarray:
        """``[n, m]`` float32 scores averaged over checkpoints (traker's formula)."""
        ids = self._ids(model_ids)
        if not ids:
            raise TrakerUsageError(
                f"No model IDs to finalize scores for: {self.save_dir} holds no featurised "
                "checkpoint (or, with load_from_save_dir=False, this instance loaded none)."
            )
        ready = fold_targets(self.store, exp_name, ids, self._fingerprints, allow_skip)
        self.finalize_features(ready)
        # traker returns the whole [n, m] matrix, whatever its size
        scoring = ScoringConfig(
            exp_name=exp_name, kinv_scaling=self.kinv_scaling, topk=self.topk, write_scores="full"
        )
        request = ScoreRequest(scoring, tuple(ready), self.proj_dim, self.lambda_reg)
        sset = self.store.score_set(exp_name, self.reducer.score(request).variant)
        if sset is None:  # just written: only a concurrent overwrite removes it
            raise StoreStateError(f"the scores of {exp_name!r} vanished from {self.save_dir}.")
        if self._targets is not None:
            self._targets.cursor = 0  # as traker
        self.scores = sset.scores()
        return self.scores
