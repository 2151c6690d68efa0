"""The evaluation driver: trains the LDS's subset models as Ray tasks, stores each as it finishes.

One task per model (``eval.cpus_per_model`` / ``gpus_per_model``); only the driver writes the
store (margins, then done flag), so a rerun trains only what a killed evaluation left."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayError, RayTaskError
from tqdm.auto import tqdm

from trak_dist import failures
from trak_dist.config import EvalConfig, JobConfig, ModelConfig
from trak_dist.distributed import _ray
from trak_dist.distributed._interrupt import CtrlC
from trak_dist.errors import ConfigError, StoreStateError, TrakDistError, WorkerFailedError
from trak_dist.lds import SubsetTrainer
from trak_dist.pipeline import absolute_store
from trak_dist.store import EvalSet, FeatureStore, store_lock

logger = logging.getLogger(__name__)
POLL_S = 1.0


@dataclass(frozen=True)
class EvalRun:
    """What an evaluation did."""

    store: str
    exp: str
    num_models: int
    trained: int
    reused: int
    seconds: float


def recipe_seed(seed: int, index: int) -> int:
    """The seed subset model ``index`` is trained from (32 bits, from ``(seed, index)``)."""
    return int(np.random.SeedSequence([seed, index, 1]).generate_state(1)[0])


def _train_one(cfg: JobConfig, indices: np.ndarray, seed: int) -> np.ndarray:
    threads = max(1, int(cfg.eval.cpus_per_model))
    return SubsetTrainer(cfg, threads).margins(indices, seed)


def _settings(cfg: JobConfig, store: FeatureStore) -> dict[str, Any]:
    exp = cfg.scoring.exp_name
    m = store.num_targets(exp)
    recipe = cfg.eval.recipe
    if not isinstance(recipe, str):  # a callable from Python: record its import path
        recipe = f"{getattr(recipe, '__module__', '?')}:{getattr(recipe, '__qualname__', recipe)}"
    return {
        "recipe": recipe,
        "recipe_kwargs": dict(cfg.eval.recipe_kwargs),
        "num_models": cfg.eval.num_models,
        "alpha": float(cfg.eval.alpha),
        "seed": int(cfg.eval.seed),
        "train_size": store.spec.train_size,
        "num_targets": m,
        "train_fingerprint": store.spec.dataset_fingerprint,
    }


def open_eval(cfg: JobConfig) -> tuple[FeatureStore, EvalSet]:
    """The store and its ground-truth group for ``cfg`` (created here, under the store lock)."""
    store = FeatureStore.open(cfg.store.path, options=cfg.store.options)
    exp = cfg.scoring.exp_name
    if exp not in store.experiments():
        raise StoreStateError(
            f"the store at {cfg.store.path} has no experiment {exp!r} (it has "
            f"{store.experiments()}): run `trak-dist` with the same settings first, then "
            "`trak-dist eval`."
        )
    with store_lock(cfg.store.path, options=cfg.store.options):
        ev = store.ensure_eval(exp, _settings(cfg, store), cfg.eval.overwrite)
    return store, ev


def run_eval(cfg: JobConfig, on_model: Callable[[int], None] | None = None) -> EvalRun:
    """Train the subset models ``eval/<exp>`` lacks and store their target margins;
    ``on_model(j)`` runs after model j is stored (progress, fault injection)."""
    t0 = time.perf_counter()
    if cfg.eval.recipe == EvalConfig.recipe and cfg.model.factory != ModelConfig.factory:
        raise ConfigError(
            f"eval.recipe is the digits example's ({EvalConfig.recipe}) but model.factory="
            f"{cfg.model.factory!r}: set eval.recipe=pkg.module:train to the function that "
            "trains your model, train(indices, seed) -> state_dict."
        )
    cfg = absolute_store(cfg)
    _, ev = open_eval(cfg)
    todo = [j for j in np.flatnonzero(~ev.done()) if j < cfg.eval.num_models]
    reused = cfg.eval.num_models - len(todo)
    if todo:
        started = _ray.connect(cfg.cluster)
        try:
            _train_all(cfg, ev, [int(j) for j in todo], on_model, joined=not started)
        finally:
            if started:
                _ray.shutdown()
    return EvalRun(
        cfg.store.path,
        cfg.scoring.exp_name,
        cfg.eval.num_models,
        len(todo),
        reused,
        time.perf_counter() - t0,
    )


def _window(cfg: JobConfig) -> int:
    """Tasks in flight at once: twice what the cluster runs in parallel, so that workers never
    wait, while the subsets' indices (n·α each) of queued tasks stay few."""
    cpus = ray.cluster_resources().get("CPU", 1.0)
    return max(2, min(256, 2 * int(cpus / max(cfg.eval.cpus_per_model, 1e-3))))


def _train_all(
    cfg: JobConfig,
    ev: EvalSet,
    todo: list[int],
    on_model: Callable[[int], None] | None,
    joined: bool = True,
) -> None:
    """Train ``todo`` as Ray tasks, storing each as it finishes. Running tasks are never
    cancelled (``ray.cancel`` racing a reply aborts the driver, ray-project/ray#54846): a Ray
    started here is shut down, which stops them; on a joined cluster they finish unused."""
    task = ray.remote(_train_one).options(
        num_cpus=cfg.eval.cpus_per_model,
        num_gpus=cfg.eval.gpus_per_model,
        max_retries=cfg.featurize.max_task_retries,  # a dead worker process, not an exception
    )
    cfg_ref = ray.put(cfg)
    queue = list(reversed(todo))
    refs: dict[Any, int] = {}
    window = _window(cfg)

    def submit() -> None:
        while queue and len(refs) < window:
            j = queue.pop()
            indices = np.flatnonzero(ev.mask(j))
            refs[task.remote(cfg_ref, indices, recipe_seed(cfg.eval.seed, j))] = j

    bar = tqdm(total=len(todo), desc="subset models", unit="model", disable=not cfg.progress)
    # Ctrl-C noted even while Ray blocks (see _interrupt.py), raised at the next poll
    with CtrlC() as ctrl_c:
        try:
            submit()
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=POLL_S)
                ctrl_c.check()
                for ref in ready:
                    j = refs.pop(ref)
                    ev.write(j, _result(ref, j, ev))
                    bar.update()
                    submit()
                    if on_model is not None:
                        on_model(j)
        finally:
            bar.close()
            if refs and joined:
                logger.warning(
                    "%d subset-model tasks still running on the joined cluster are left to "
                    "finish; their results are not used (they stop when this process exits).",
                    len(refs),
                )


def _result(ref: Any, j: int, ev: EvalSet) -> np.ndarray:
    try:
        return np.asarray(ray.get(ref))
    except RayTaskError as e:
        cause: Any = failures.unwrap(e)
        if isinstance(cause, TrakDistError):
            raise cause from None  # the recipe's or config's own clear message
    except RayError as e:  # the task's worker died more often than max_retries allows
        cause = e
    raise WorkerFailedError(
        f"training subset model {j} failed: {failures.gist(cause)}. The "
        f"{int(ev.done().sum())} finished models are kept; fix the cause and rerun "
        f"`trak-dist eval` ({failures.DEBUG_ENV}=1 shows the traceback)."
    ) from cause
