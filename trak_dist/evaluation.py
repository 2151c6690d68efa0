"""``trak_dist.evaluate``: the LDS of a store's scores against subset models it trains.

The eval driver (``trak_dist.distributed.eval_driver``) trains M models on random α-subsets
with your recipe as Ray tasks; ``trak_dist.lds`` measures (docs/design.md, "Import rules").

Example (after ``trak_dist.run``'s example, on its store)::

    import trak_dist
    from trak_dist.examples import digits

    ev = trak_dist.evaluate(
        recipe=digits.train_subset,           # train(indices, seed) -> state_dict
        model=digits.make_model,
        targets=digits.target_set,
        store="my_store.zarr",
        num_models=20,                        # default 100: the more, the tighter the interval
    )
    print(ev.to_markdown())                  # LDS and interval of every scored variant
    lds = ev.best.result.lds

With ``eval=EvalConfig(lambdas=["grid"], ...)`` it first scores a λ grid from the stored
features (no refeaturisation), and records the best λ per proj_dim in the store:
``lambda_reg="best"`` then uses it (``ev.recorded``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trak_dist.config import (
    ClusterConfig,
    DataConfig,
    EvalConfig,
    JobConfig,
    ModelConfig,
    ScoringConfig,
    StoreConfig,
    TaskConfig,
)
from trak_dist.lds import (
    VariantLDS,
    best,
    record_best_lambdas,
    score_lambdas,
    store_lds,
    to_markdown,
    write,
)
from trak_dist.store import FeatureStore

if TYPE_CHECKING:  # the driver imports Ray: only when running
    from trak_dist.distributed import EvalRun

__all__ = ["Evaluation", "evaluate", "evaluate_config"]


@dataclass(frozen=True)
class Evaluation:
    """An evaluation's result: the LDS per score variant, what was (re)trained, the variants
    scored for ``eval.lambdas`` and the best λ recorded per proj_dim (``lambda_reg=best``)."""

    exp: str
    variants: list[VariantLDS]
    run: EvalRun  # models trained, reused, seconds
    files: dict[str, Path]
    scored: list[str] = field(default_factory=list)
    recorded: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def best(self) -> VariantLDS | None:
        return best(self.variants)

    def to_markdown(self) -> str:
        return to_markdown(self.variants, self.exp)


def evaluate_config(
    cfg: JobConfig,
    output_dir: str | Path | None = None,
    on_model: Callable[[int], None] | None = None,
) -> Evaluation:
    """Score ``eval.lambdas`` the experiment lacks (from the stored features), train what
    ``eval/<exp>`` lacks, then the LDS of every score set of the experiment, and record the
    best λ per proj_dim in the store; with ``output_dir``, the table and plot are written
    there."""
    # imports Ray: only when running
    from trak_dist.distributed import run_eval
    from trak_dist.pipeline import reducer_device, resolve_inputs

    cfg = resolve_inputs(cfg)
    # before training: a λ the store cannot score fails in seconds, not after M models
    scored = score_lambdas(cfg, reducer_device(cfg))
    run = run_eval(cfg, on_model)
    store = FeatureStore.open(run.store, mode="r", options=cfg.store.options)
    rows = store_lds(store, run.exp, None, cfg.eval.num_models, cfg.eval.bootstrap, cfg.eval.seed)
    recorded = record_best_lambdas(cfg, rows)
    files = write(rows, run.exp, Path(output_dir), recorded) if output_dir is not None else {}
    return Evaluation(run.exp, rows, run, files, scored, recorded)


def evaluate(
    recipe: Callable[..., Any] | str,
    model: Callable[..., Any] | str,
    targets: Any,
    *,
    task: Any = "image_classification",
    store: str | Path = "trak_store.zarr",
    exp_name: str = "targets",
    num_models: int = 100,
    alpha: float = 0.5,
    seed: int = 0,
    recipe_kwargs: dict[str, Any] | None = None,
    model_kwargs: dict[str, Any] | None = None,
    address: str | None = None,
    output_dir: str | Path | None = None,
    **sections: Any,
) -> Evaluation:
    """The LDS of every score set of ``exp_name`` in ``store``, against ``num_models`` models
    trained by ``recipe`` on random ``alpha``-subsets of the train set (Ray tasks).

    Args:
        recipe: ``train(indices, seed, **recipe_kwargs) -> state_dict`` (or its import path),
            ``indices`` ``[k]`` int64 into the store's train set.
        model: factory of the ``nn.Module`` the recipe's state dicts load into.
        targets: the experiment's target set (or a callable returning it).
        task: the model output the scores attribute.
        store, exp_name: where the scores are; subset models go to ``eval/<exp_name>``.
        num_models, alpha, seed: M, the subset fraction, the seed of subsets and recipes.
        address: a Ray cluster to join (None: start one in-process).
        output_dir: write ``lds.{md,csv,json,png}`` there.
        sections: whole config sections (``eval=EvalConfig(...)`` overrides the arguments).
    """
    ev = EvalConfig(
        recipe=recipe,
        recipe_kwargs=dict(recipe_kwargs or {}),
        num_models=num_models,
        alpha=alpha,
        seed=seed,
    )
    base = JobConfig(
        model=ModelConfig(factory=model, kwargs=dict(model_kwargs or {})),
        data=DataConfig(targets=targets),
        task=TaskConfig(name=task),
        store=StoreConfig(path=str(store)),
        scoring=ScoringConfig(exp_name=exp_name),
        cluster=ClusterConfig(kind="ray" if address else "local", address=address),
        eval=ev,
    )
    known = {"eval", "cluster", "featurize", "progress"}
    unknown = sorted(set(sections) - known)
    if unknown:
        raise TypeError(f"evaluate() got unknown sections {unknown}; known: {sorted(known)}.")
    return evaluate_config(dataclasses.replace(base, **sections), output_dir)
