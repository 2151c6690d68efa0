"""TRAKer's per-batch steps: featurise the rows of a batch nobody has yet, and fold the target
rows of the checkpoints about to be scored."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import torch

from trak_dist.batches import Batch, batch_size, select
from trak_dist.compat._featurizer import DirectFeaturizer
from trak_dist.compat._tracker import RowTracker, fold_all
from trak_dist.errors import ConfigError, LabelError, StoreStateError
from trak_dist.featurize import Featurizer
from trak_dist.store import FeatureStore, check_unchanged, row_hashes, store_lock

logger = logging.getLogger("trak_dist")


def write_batch(
    store: FeatureStore,
    featurizer: Featurizer | DirectFeaturizer,
    tracker: RowTracker,
    model_id: int | None,
    batch: Batch,
    inds: Iterable[int] | None,
    num_samples: int | None,
    with_q: bool = True,
) -> None:
    """Featurise the rows of ``batch`` nobody has featurised yet (a rerun skips the rest)."""
    assert model_id is not None  # the current checkpoint, set together with every tracker
    rows = tracker.take(inds, num_samples)
    if len(rows) != batch_size(batch):
        raise ConfigError(
            f"the batch holds {batch_size(batch)} samples but {len(rows)} rows were given "
            "(inds= or num_samples=); they must match."
        )
    hashes = row_hashes(batch)
    todo = tracker.pending(rows)
    what = f"{'train' if with_q else 'target'} (model_id={model_id})"
    if not todo.all():  # rows featurised before: were they these items?
        done = rows[~todo]
        stored = tracker.recorded_hashes(done)  # committed, or staged by any process
        check_unchanged(stored, hashes[~todo], done, what, store.where)
    if not todo.any():
        logger.debug("all %d samples of this batch are already featurised", len(rows))
        return
    sub = batch if todo.all() else select(batch, torch.as_tensor(todo))
    store.bind(tracker.rows, tracker.checkpoint, what)
    try:
        if with_q:
            x, q = featurizer.featurize(sub, model_id)
            g = None
            if tracker.rows.G is not None:  # curvature=fisher: the train rows' G, every draw
                assert isinstance(featurizer, Featurizer)  # make_featurizer refuses the other
                where = torch.as_tensor(rows[todo])
                draws = range(len(tracker.rows.g_draws))
                g = np.stack([featurizer.fisher(sub, model_id, where, d).numpy() for d in draws], 1)
            tracker.write(rows[todo], x.numpy(), q.numpy(), hashes[todo], g)
        else:
            x = featurizer.project(sub, model_id)
            tracker.write(rows[todo], x.numpy(), None, hashes[todo])
    except LabelError as e:
        raise e.at(rows[todo], "train rows" if with_q else "target rows") from None


def fold_targets(
    store: FeatureStore,
    exp_name: str,
    ids: list[int],
    fingerprints: dict[str, str],
    allow_skip: bool,
) -> list[int]:
    """Fold the staged target rows of each checkpoint in ``ids``; the ones complete (the others
    are skipped with a warning under ``allow_skip``, else an error)."""
    ready = []
    for c in ids:
        with store_lock(store.where, options=store.options):
            try:
                rows = store.target_rows(exp_name, c)
                fold_all(
                    rows,
                    f"targets of {exp_name!r}, model_id={c}",
                    "targets",
                    fingerprints.get(rows.group.path),
                )
            except StoreStateError as e:
                if not allow_skip:
                    raise
                logger.warning("skipping model_id=%s: %s", c, e)
                continue
        ready.append(c)
    if not ready:
        raise StoreStateError(f"no checkpoints to score experiment {exp_name!r} with.")
    return ready
