"""Targets in, top proponents and opponents out: the batch job's featurisation and scores.

Target rows come from the workers' own ``Featurizer`` (built as the worker builds it, at the
store's width), rounded to the store's dtype as the store rounds them, then scored by the index
as ``compute_scores`` scores them: a reply equals the batch job's scores for the same targets,
exactly when they are featurised in the job's micro-batches, else up to the last float32 bit of
the gradients (which rounding to a float16 store can make ~1e-4 of the largest score). Targets
are featurised ``serve.featurize_batch`` at a time (default 1), so that a target's row never
depends on the requests batched with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from trak_dist.config import JobConfig
from trak_dist.errors import ConfigError, StoreMismatchError
from trak_dist.featurize import Featurizer, build_featurizer
from trak_dist.gradients import make_computer
from trak_dist.pipeline import pick_device
from trak_dist.scoring import TopK, resolve_best, resolve_kinv_scaling
from trak_dist.serve._ann import AnnIndex
from trak_dist.serve._explain import TokenScores
from trak_dist.serve._index import AttributionIndex
from trak_dist.serve._request import Item, RequestParser
from trak_dist.serve._text import TextTargets, train_text
from trak_dist.sources import (
    batch_of,
    build_dataset,
    build_model,
    checkpoint_paths,
    load_state_dict,
)
from trak_dist.store import FeatureStore, file_fingerprint
from trak_dist.tasks import resolve_task

logger = logging.getLogger(__name__)


class Attributor:
    """One model copy and featurizer per checkpoint, and the index of the stored train side.

    Args:
        cfg: the job whose store is served (store, model, task, data, projection, proj_dim,
            lambda_reg, scoring.kinv_scaling) and its ``serve`` section.
    """

    def __init__(self, cfg: JobConfig) -> None:
        sv = cfg.serve
        self.device = pick_device(sv.device)
        store = FeatureStore.open(cfg.store.path, mode="r", options=cfg.store.options)
        self.store_dtype = np.dtype(store.spec.dtype)
        paths = checkpoint_paths(cfg.model.checkpoints)
        self.model_ids = list(range(len(paths)))
        for c, path in enumerate(paths):
            # the rows served were featurised from this very file (or the answers are not theirs)
            store.train_rows(c).binding.check(file_fingerprint(path), f"model_id={c}", store.where)
        # best: the λ trak-dist eval recorded for the job's experiment and proj_dim
        scaling = resolve_kinv_scaling(cfg.scoring.kinv_scaling, store.spec)
        lam, _ = resolve_best(store, cfg.scoring.exp_name, cfg.proj_dim, cfg.lambda_reg, scaling)
        exact = AttributionIndex.from_store(
            store,
            self.model_ids,
            cfg.proj_dim,
            lam,
            scaling,
            sv.index_dtype,
            sv.index_mmap_dir,
            sv.block_rows,
            self.device,
            threads=max(1, int(sv.cpus_per_replica)),
        )
        self.index: AttributionIndex | AnnIndex = (
            exact if sv.ann is None else AnnIndex(exact, sv.ann, sv.ann_nprobe)
        )
        self.featurizers = [self._featurizer(cfg, store, c, p) for c, p in enumerate(paths)]
        self.train = build_dataset(cfg.data.train, cfg.data.kwargs, "data.train")
        try:
            targets = build_dataset(cfg.data.targets, cfg.data.kwargs, "data.targets")
            template = targets[0]
        except (ConfigError, IndexError):
            targets, template = self.train, self.train[0]
        # text jobs: the first target as text, the page's example
        self.example_text = str(targets.decode(0)) if hasattr(targets, "decode") else None
        self.text = _text_targets(cfg)
        self.text_chars = sv.text_chars
        self.parser = RequestParser(
            template, self.index.train_size, sv.max_targets, sv.max_k, self.text
        )
        # one gradient computation at a time on the model copies (/attribute's batches run in
        # the batcher's thread, /explain in another)
        self.lock = threading.Lock()
        self.tokens = None
        if self.text is not None and cfg.task.name == "causal_lm":
            qbar = exact.qsum / len(paths)
            self.tokens = TokenScores(
                self.featurizers, qbar, self.train, exact.proj_dim, cfg.featurize.micro_batch
            )
        logger.info(
            "serving %d train rows, %d checkpoint(s), proj_dim=%d, λ=%s",
            self.index.train_size,
            len(paths),
            self.index.proj_dim,
            self.index.lambdas,
        )

    def _featurizer(
        self, cfg: JobConfig, store: FeatureStore, model_id: int, path: Any
    ) -> Featurizer:
        model = build_model(cfg.model.factory, cfg.model.kwargs)
        task = resolve_task(cfg.task.name, **cfg.task.kwargs)
        computer = make_computer(
            model, task, cfg.task.grad_wrt, self.device, cfg.featurize.gradient_engine
        )
        spec = store.spec
        if computer.layout.grad_dim != spec.grad_dim:
            raise StoreMismatchError(
                f"the model's selected parameters have d={computer.layout.grad_dim} entries; the "
                f"store at {store.where} was featurised with d={spec.grad_dim}. Serve it with the "
                "job's model and task.grad_wrt."
            )
        if cfg.projection.kind != spec.projection or cfg.projection.seed != spec.seed:
            raise StoreMismatchError(
                f"projection {cfg.projection.kind!r} seed {cfg.projection.seed}; the store at "
                f"{store.where} holds {spec.projection!r} seed {spec.seed}. Serve it with the "
                "job's projection settings."
            )
        featurizer = build_featurizer(
            computer,
            cfg.projection.kind,
            spec.proj_dim,  # the stored width, as the workers project (then its prefix)
            cfg.projection.seed,
            cfg.projection.backend,
            cfg.serve.featurize_batch,
        )
        computer.load_state_dict(load_state_dict(path, self.device))
        return featurizer

    def target_rows(self, items: Sequence[Item]) -> torch.Tensor:
        """``[m, C·p]`` Y of ``items``: projected per checkpoint, rounded to the store's dtype,
        times K_c⁻¹. Items of different shapes (token sequences) are featurised in groups."""
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, item in enumerate(items):
            values = item.values() if isinstance(item, dict) else item
            groups.setdefault(tuple(tuple(v.shape) for v in values), []).append(i)
        out = torch.empty(len(items), self.index.num_checkpoints * self.index.proj_dim)
        for positions in groups.values():
            batch = batch_of([items[i] for i in positions], 0, len(positions))
            with self.lock:
                xs = [
                    f.project(batch, c).numpy().astype(self.store_dtype)
                    for c, f in enumerate(self.featurizers)
                ]
            out[positions] = self.index.target_side(xs).cpu()
        return out

    def attribute(self, items: Sequence[Item], k: int) -> TopK:
        """Top-``k`` proponents and opponents of each item, ``[m, k]`` each."""
        return self.index.topk(self.target_rows(items).to(self.device), k)

    def reply(self, items: Sequence[Item], k: int) -> list[dict[str, list[Any]]]:
        """``attribute`` as the JSON results: per item, ``[[index, score], ...]`` lists, and
        for text jobs the examples' texts in parallel lists (``proponents_text``, ...)."""
        top = self.attribute(items, k)
        out = []
        for t in range(len(items)):
            result: dict[str, list[Any]] = {}
            for side in ("proponents", "opponents"):
                pairs = _pairs(getattr(top, f"{side}_idx")[t], getattr(top, f"{side}_val")[t])
                result[side] = pairs
                if self.text is not None:
                    result[f"{side}_text"] = [
                        train_text(self.train, int(i), self.text_chars) for i, _ in pairs
                    ]
            out.append(result)
        return out

    def explain(self, item: Item, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Per-token scores of train examples ``indices`` for one target (causal LMs)."""
        if self.tokens is None:
            raise ConfigError("per-token explanations need a causal-LM text job (data=text).")
        y = self.target_rows([item])[0]
        with self.lock:
            return [self.tokens.explain(y, i) for i in indices]

    def train_item(self, index: int) -> Any:
        """Train example ``index`` as JSON-able nested lists (for the page)."""
        item = self.train[index]
        if isinstance(item, dict):
            return {k: torch.as_tensor(v).tolist() for k, v in item.items()}
        return [torch.as_tensor(v).tolist() for v in item]


def _text_targets(cfg: JobConfig) -> TextTargets | None:
    """Raw-text targets for a ``data=text`` job (tokenised as its target file was)."""
    if cfg.data.format != "text":
        return None
    from trak_dist.hf import TextSource

    for source in (cfg.data.targets, cfg.data.train):
        if isinstance(source, TextSource):
            return TextTargets(source)
    return None


def _pairs(idx: np.ndarray, val: np.ndarray) -> list[list[float]]:
    # an approximate index marks "fewer than k found" with index -1
    return [[int(i), float(v)] for i, v in zip(idx, val, strict=True) if i >= 0]
