"""Per-token explanations: which tokens of a train example carried its score for a target.

A causal LM's output is a sum over its counted tokens, f_i = Σ_j margin_ij, so its gradient,
and its projection x_i = Pᵀ∇f_i/√d, are sums over tokens too: x_i = Σ_j x_ij. The score of
train example i for target t is S_it = mean_c(x_ic · y_tc) · Q̄_i, with y_tc = K_c⁻¹ x_tc
the target's preconditioned features that scoring stores (``Y`` of the score set), hence

    S_it = Σ_j s_ijt,   s_ijt = mean_c(x_ijc · y_tc) · Q̄_i

exactly (up to float rounding, and the float16 rounding of stored rows when
``featurize.half_precision``). This is Bergson's and kronfluence's per-token choice: token
gradients are recomputed on demand, for the few train examples asked about (a target's top
proponents), and dotted with the stored query; nothing per token is stored for the train set.
Each token's gradient is the example's with the labels of the other tokens set to -100, so it
goes through the job's own gradient engine and projection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from trak_dist.errors import ConfigError, StoreStateError
from trak_dist.featurize import build_featurizer
from trak_dist.gradients import make_computer
from trak_dist.scoring import resolve_best, resolve_kinv_scaling
from trak_dist.sources import build_model, checkpoint_paths, load_state_dict
from trak_dist.store import FeatureStore, variant_name
from trak_dist.tasks import resolve_task

IGNORE = -100


def job_score_set(cfg: Any, store: FeatureStore | None = None) -> Any:
    """The score set of the job ``cfg`` (its experiment and variant), or a StoreStateError."""
    store = store or FeatureStore.open(cfg.store.path, mode="r", options=cfg.store.options)
    exp = cfg.scoring.exp_name
    kinv_scaling = resolve_kinv_scaling(cfg.scoring.kinv_scaling, store.spec)
    lam, _ = resolve_best(store, exp, cfg.proj_dim, cfg.lambda_reg, kinv_scaling)
    sset = store.score_set(exp, variant_name(cfg.proj_dim, lam, kinv_scaling))
    if sset is None:
        raise StoreStateError(
            f"no scores {cfg.scoring.exp_name} for proj_dim={cfg.proj_dim}, lambda_reg="
            f"{cfg.lambda_reg} in {cfg.store.path}; run trak-dist with these overrides first "
            "(show and the token explanations take the run's own overrides)."
        )
    return sset


def token_batch(item: dict[str, Tensor]) -> tuple[dict[str, Tensor], Tensor]:
    """One copy of a causal LM item per counted token, each counting only that token, and the
    positions ``[J]`` of those tokens (the position of the token predicted)."""
    ids, mask = item["input_ids"], item.get("attention_mask", torch.ones_like(item["input_ids"]))
    labels = item.get("labels", ids.masked_fill(mask == 0, IGNORE))
    real = mask.bool()
    counted = torch.zeros_like(real)
    counted[1:] = (labels[1:] != IGNORE) & real[1:] & real[:-1]
    positions = counted.nonzero().flatten()
    rows = len(positions)
    out = {k: v.unsqueeze(0).repeat(rows, *([1] * v.dim())) for k, v in item.items()}
    single = torch.full((rows, ids.shape[0]), IGNORE, dtype=labels.dtype)
    single[torch.arange(rows), positions] = labels[positions]
    out["labels"] = single
    return out, positions


class TokenExplainer:
    """Per-token scores of train rows for targets of a finished job (``cfg``'s store, score
    variant, model, data and projection)."""

    def __init__(self, cfg: Any, train: Any, device: str = "cpu") -> None:
        if not isinstance(cfg.task.name, str) or cfg.task.name != "causal_lm":
            raise ConfigError(
                f"per-token explanations are for task=causal_lm; got task.name={cfg.task.name!r}."
            )
        self.cfg, self.train = cfg, train
        store = FeatureStore.open(cfg.store.path, mode="r", options=cfg.store.options)
        sset = job_score_set(cfg, store)
        attrs = sset.attrs
        self.model_ids = [int(c) for c in attrs["model_ids"]]
        self.p = int(attrs["proj_dim"])
        m = sset.shape[1]  # S is [n, m] (stored or not)
        # y_tc = x_tc K_c⁻¹ [m, p] per checkpoint, as scoring stored it
        self.ys = {c: sset.read_y(c, 0, m) for c in self.model_ids}
        self.rows = {c: store.train_rows(c) for c in self.model_ids}
        self.checkpoints = checkpoint_paths(cfg.model.checkpoints)
        model = build_model(cfg.model.factory, cfg.model.kwargs)
        task = resolve_task(cfg.task.name, **cfg.task.kwargs)
        computer = make_computer(
            model, task, cfg.task.grad_wrt, device, cfg.featurize.gradient_engine
        )
        self.featurizer = build_featurizer(
            computer,
            cfg.projection.kind,
            store.spec.proj_dim,
            cfg.projection.seed,
            cfg.projection.backend,
            cfg.featurize.micro_batch,
        )

    def explain(self, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], tuple[Tensor, Tensor]]:
        """``{(train row, target): (positions [J], token scores [J] float64)}``."""
        rows = sorted({i for i, _ in pairs})
        batches = {i: token_batch(dict(self.train[i])) for i in rows}
        xs: dict[int, list[Tensor]] = {i: [] for i in rows}  # per row, [J, p] per checkpoint
        for c in self.model_ids:
            state = load_state_dict(self.checkpoints[c], self.featurizer.computer.device)
            self.featurizer.computer.load_state_dict(state)
            for i in rows:
                xs[i].append(self.featurizer.project(batches[i][0], c)[:, : self.p])
        qbar = {
            i: float(np.mean([self.rows[c].read_q(i, i + 1)[0] for c in self.model_ids]))
            for i in rows
        }
        return {
            (i, t): (
                batches[i][1],
                token_scores(xs[i], [self.ys[c][t] for c in self.model_ids], qbar[i]),
            )
            for i, t in pairs
        }


def token_scores(xs: Sequence[Tensor], ys: Sequence[Any], qbar: float) -> Tensor:
    """``s_j = mean_c(x_jc · y_c) · Q̄`` ``[J]`` float64, from the token rows ``[J, p]`` and the
    target's preconditioned row ``[p]`` of each checkpoint, and the example's mean Q."""
    acc = sum(
        (x.double() @ torch.as_tensor(y, dtype=torch.float64) for x, y in zip(xs, ys, strict=True)),
        torch.zeros(xs[0].shape[0], dtype=torch.float64),
    )
    return acc / len(xs) * qbar
