"""A worker: featurises shards into the shared store. A plain class; Ray only wraps it."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trak_dist.config import JobConfig
from trak_dist.errors import LabelError, StoreDamagedError
from trak_dist.featurize import build_featurizer
from trak_dist.gradients import make_computer
from trak_dist.pipeline._shards import ShardResult, ShardTask
from trak_dist.scoring import gram
from trak_dist.sources import (
    batch_of,
    build_dataset,
    build_model,
    load_state_dict,
    node_checkpoints,
)
from trak_dist.store import (
    FeatureStore,
    RowSet,
    as_stored,
    check_unchanged,
    curvature_rows,
    file_fingerprint,
    row_hashes,
)
from trak_dist.tasks import resolve_task

logger = logging.getLogger(__name__)


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


class Worker:
    """Runs ShardTasks for one job.

    Per chunk: a committed chunk is read back into the partial K (no gradients) if its items
    hash as before (else StoreMismatchError); a damaged one is featurised again in place (this
    worker owns it, nothing derived from it exists yet, featurising is deterministic); any other
    is featurised by micro-batch, written whole, then committed. K's partial Gram is XᵀX, or
    with ``featurize.curvature=fisher`` GᵀG of the sampled-label Fisher's rows G (a second
    backward per micro-batch, labels drawn per row: ``tasks/_sampled.py``), which train chunks
    store and commit with X so that a resumed or array-mode run reduces them from the store.
    Memory: one micro-batch of gradients plus one chunk of rows (two with G).

    Args:
        checkpoints: checkpoint file per model_id.
        feature_width: p of the stored features.
    """

    def __init__(self, cfg: JobConfig, checkpoints: list[Path | str], feature_width: int) -> None:
        self.cfg = cfg
        # the driver's paths; on a cluster without shared storage, this node's own copies
        self.checkpoints = node_checkpoints(cfg.model.checkpoints, checkpoints)
        self.device = pick_device(cfg.featurize.device)
        self.store = FeatureStore.open(cfg.store.path, options=cfg.store.options)
        model = build_model(cfg.model.factory, cfg.model.kwargs)
        task = resolve_task(cfg.task.name, **cfg.task.kwargs)
        computer = make_computer(
            model, task, cfg.task.grad_wrt, self.device, cfg.featurize.gradient_engine
        )
        self.featurizer = build_featurizer(
            computer,
            cfg.projection.kind,
            feature_width,
            cfg.projection.seed,
            cfg.projection.backend,
            cfg.featurize.micro_batch,
            self.store.spec.curvature,
        )
        self._datasets: dict[str, Any] = {}
        self._loaded: int | None = None
        self._fingerprint: str | None = None
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def _dataset(self, task: ShardTask) -> Any:
        key = task.kind
        if key not in self._datasets:
            ref = self.cfg.data.train if key == "train" else self.cfg.data.targets
            self._datasets[key] = build_dataset(ref, self.cfg.data.kwargs, f"data.{key}")
        return self._datasets[key]

    def _load(self, model_id: int) -> None:
        if self._loaded != model_id:
            path = self.checkpoints[model_id]
            state = load_state_dict(path, self.device)
            self.featurizer.computer.load_state_dict(state)
            # what this worker loaded, which the rows it commits are bound to
            self._fingerprint = file_fingerprint(path)
            self._loaded = model_id

    def run(self, task: ShardTask) -> tuple[ShardResult, np.ndarray | None]:
        """Featurise ``task``; returns its report and, for train shards, its partial K (XᵀX,
        or GᵀG: see the class docstring)."""
        t0, c0_cpu = time.perf_counter(), time.process_time()
        if task.kind == "train":
            rows = self.store.train_rows(task.model_id)
        else:
            rows = self.store.target_rows(task.exp, task.model_id)
        done = rows.done_chunks()
        partial = np.zeros((rows.proj_dim, rows.proj_dim)) if task.kind == "train" else None
        computed = reused = 0
        for c0 in range(task.start, task.end, rows.chunk_rows):
            c1 = min(task.end, c0 + rows.chunk_rows)
            if done[c0 // rows.chunk_rows]:
                if partial is None:
                    reused += c1 - c0
                    continue
                k_stored = self._reuse_chunk(rows, task, c0, c1)
                if k_stored is not None:
                    partial += gram(k_stored)
                    reused += c1 - c0
                    continue
            x = self._featurize_chunk(rows, task, c0, c1)
            if partial is not None:
                partial += gram(x)
            computed += c1 - c0
        result = ShardResult(
            task,
            computed,
            reused,
            time.perf_counter() - t0,
            self.name,
            time.process_time() - c0_cpu,
        )
        return result, partial

    def _reuse_chunk(self, rows: RowSet, task: ShardTask, c0: int, c1: int) -> np.ndarray | None:
        """The committed train rows ``[c0, c1)`` checked (G's where the set holds them, else
        X's), or None when they must be featurised again (see the class docstring)."""
        try:
            x = rows.read(c0, c1)
            if rows.G is not None:
                x = rows.read_curvature(c0, c1)
            rows.read_q(c0, c1)
            stored = rows.read_hashes(slice(c0, c1), checked=True)
        except StoreDamagedError as e:
            logger.warning("featurising again: %s", "; ".join(str(d) for d in e.damage))
            return None
        fresh = row_hashes(batch_of(self._dataset(task), c0, c1))
        what = f"train (model_id={task.model_id})"
        check_unchanged(stored, fresh, np.arange(c0, c1), what, self.store.where)
        return x

    def _featurize_chunk(self, rows: RowSet, task: ShardTask, c0: int, c1: int) -> np.ndarray:
        self._load(task.model_id)
        data = self._dataset(task)
        step = self.cfg.featurize.micro_batch
        fisher = task.kind == "train" and rows.G is not None
        xs, qs, hs, gs = [], [], [], []
        for b0 in range(c0, c1, step):
            b1 = min(c1, b0 + step)
            batch = batch_of(data, b0, b1)
            hs.append(row_hashes(batch))
            try:
                if task.kind == "train":
                    x, q = self.featurizer.featurize(batch, task.model_id)
                    qs.append(q.numpy())
                    if fisher:
                        draws = [
                            self.featurizer.fisher(batch, task.model_id, b0, d).numpy()
                            for d in range(len(rows.g_draws))
                        ]
                        gs.append(np.stack(draws, axis=1))
                else:
                    x = self.featurizer.project(batch, task.model_id)
            except LabelError as e:
                kind = "train set" if task.kind == "train" else f"target set {task.exp!r}"
                raise e.at(range(b0, b1), f"{kind} rows") from None
            xs.append(x.numpy())
        chunk = np.concatenate(xs)
        # refuses non-finite rows before writing anything (RowSet)
        g = np.concatenate(gs) if fisher else None
        rows.write(c0, chunk, np.concatenate(qs) if qs else None, np.concatenate(hs), g)
        self.store.bind(rows, self._fingerprint, f"{task}")
        rows.commit(c0, c1)
        # rounded to the stored dtype, so the partial K equals one recomputed from the store
        dtype = rows.X.dtype
        return as_stored(chunk, dtype) if g is None else curvature_rows(as_stored(g, dtype))
