"""``trak_dist.run``: the pipeline for your own model, from Python.

Example (runs the bundled digits example; swap in your own factory, files and datasets)::

    import trak_dist
    from trak_dist.examples import digits

    result = trak_dist.run(
        model=digits.make_model,              # () -> nn.Module, called on every worker
        checkpoints=digits.checkpoints(),     # state-dict files, one per model_id
        train=digits.train_set,               # () -> map-style dataset of tuples of tensors
        targets=digits.target_set,
        task="image_classification",
        store="my_store.zarr",
        proj_dim=512,
        lambda_reg="auto",                    # per checkpoint from XᵀX's spectrum; or a number
    )
    scores = result.scores()                  # [n_train, n_targets]
    best = result.topk()["proponents_idx"]    # [n_targets, k]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trak_dist.config import (
    ClusterConfig,
    DataConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    ProjectionConfig,
    ScoringConfig,
    StoreConfig,
    TaskConfig,
)
from trak_dist.errors import StoreStateError
from trak_dist.store import FeatureStore

if TYPE_CHECKING:
    from trak_dist.pipeline import JobResult


@dataclass(frozen=True)
class Attribution:
    """Where a run's scores are, with readers for them."""

    store: str
    exp: str
    variant: str
    job: JobResult  # the run's timings, reuse counts and per-variant results
    options: dict[str, Any] = field(default_factory=dict)  # an object store's store.options

    def _scores(self) -> Any:
        opened = FeatureStore.open(self.store, mode="r", options=self.options)
        sset = opened.score_set(self.exp, self.variant)
        if sset is None:
            raise StoreStateError(f"no scores {self.exp}/{self.variant} in {self.store}.")
        return sset

    def scores(self) -> np.ndarray:
        """``[n_train, n_targets]`` float32 (read whole: for huge n × m read ``.S`` of the
        store's score set in blocks instead)."""
        return self._scores().scores()

    def topk(self) -> dict[str, np.ndarray]:
        """``proponents_idx/val`` and ``opponents_idx/val``, each ``[n_targets, k]``."""
        return self._scores().read_topk()


def run(
    model: Callable[..., Any] | str,
    checkpoints: Sequence[str | Path] | Callable[[], Sequence[str | Path]] | str,
    train: Any,
    targets: Any,
    *,
    task: Any = "image_classification",
    store: str | Path | StoreConfig = "trak_store.zarr",
    proj_dim: int | str = "auto",
    lambda_reg: float | str = "auto",
    exp_name: str = "targets",
    num_workers: int | None = 2,
    address: str | None = None,
    grad_wrt: Sequence[str] | None = None,
    **sections: Any,
) -> Attribution:
    """Featurise (what the store lacks), reduce and score on Ray; returns where the scores are.

    Args:
        model: factory of the ``nn.Module`` (or ``"pkg.module:function"``).
        checkpoints: state-dict files (or a callable returning them); model_id = position.
        train, targets: datasets, or (preferred) callables each worker calls to build its own.
        task: ``image_classification``, ``text_classification``, ``causal_lm`` or a ModelOutput.
        store: the Zarr store path or a ``StoreConfig``; reruns resume from it.
        proj_dim, lambda_reg: projection width (``"auto"``: 2048 for causal LMs, else 512)
            and ridge term (``"auto"`` or traker's λ).
        exp_name: name of this target set in the store.
        num_workers: worker actors (None: as many as the cluster fits).
        address: a Ray cluster to join (None: start one in-process).
        grad_wrt: parameter names to differentiate (None: all).
        sections: replacements for whole config sections, e.g.
            ``featurize=FeaturizeConfig(micro_batch=16)``, ``scoring=ScoringConfig(topk=50)``.

    Raises:
        TrakDistError: a subclass saying what failed, also when raised in a Ray worker (never
            a Ray wrapper). OSErrors as they are.
    """
    cluster = ClusterConfig(
        kind="ray" if address else "local", address=address, num_workers=num_workers
    )
    base = JobConfig(
        proj_dim=proj_dim,
        lambda_reg=lambda_reg,
        model=ModelConfig(factory=model, checkpoints=checkpoints),
        data=DataConfig(train=train, targets=targets),
        task=TaskConfig(name=task, grad_wrt=None if grad_wrt is None else list(grad_wrt)),
        store=store if isinstance(store, StoreConfig) else StoreConfig(path=str(store)),
        scoring=ScoringConfig(exp_name=exp_name),
        cluster=cluster,
    )
    known = {
        "projection": ProjectionConfig,
        "featurize": FeaturizeConfig,
        "scoring": ScoringConfig,
        "cluster": ClusterConfig,
        "progress": bool,
        "report": str,
    }
    unknown = sorted(set(sections) - set(known))
    if unknown:
        raise TypeError(f"run() got unknown sections {unknown}; known: {sorted(known)}.")
    cfg = dataclasses.replace(base, **sections)
    result = run_config(cfg)
    return Attribution(
        cfg.store.path,
        cfg.scoring.exp_name,
        result.scores[0].variant,
        result,
        dict(cfg.store.options),
    )


def run_config(cfg: JobConfig, keep_alive: bool = False) -> JobResult:
    """Run the job ``cfg`` on the executor ``cluster.kind`` names: ``inprocess`` here, without
    Ray; ``local``, ``ray`` or ``slurm`` on Ray (``keep_alive``: keep Ray for the next job of a
    sweep). The one place the CLI and ``trak_dist.run`` choose an executor."""
    if cfg.cluster.kind == "inprocess":
        from trak_dist.pipeline import InProcessExecutor, run_pipeline

        return run_pipeline(cfg, InProcessExecutor())
    from trak_dist.distributed import run_job  # imports Ray: only when running

    return run_job(cfg, keep_alive=keep_alive)
