"""A block-wise scoring: ``prepare_scoring`` (checks, λ, Y_c = X_tc K_c⁻¹ once per checkpoint,
the plan, the unfinished score set and the blocks it still lacks), the blocks (``score_block``,
anywhere), then ``ScoreJob.finish`` (the exact top-k merge, in range order, and publish)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from trak_dist.errors import StoreStateError, TrakDistError
from trak_dist.scoring._best import resolve_best
from trak_dist.scoring._ensure import ensure_factor
from trak_dist.scoring._factor import Factorization
from trak_dist.scoring._lambda import AUTO, LambdaReg, auto_rule, parse_lambda
from trak_dist.scoring._plan import FULL_MAX_BYTES, BlockResult, BlockTask, ScorePlan
from trak_dist.scoring._topk import TopList, merge
from trak_dist.store import FeatureStore, ScoreSet, ScoringLease, scoring_lease, variant_name
from trak_dist.store import _layout as layout
from trak_dist.store._zarr import group


@dataclass
class ScoreJob:
    """One scoring in progress: its plan, its unfinished set and the blocks still to run
    (``pending``, super-block by super-block, ranges in order)."""

    store: FeatureStore
    exp: str
    variant: str
    plan: ScorePlan
    sset: ScoreSet
    pending: list[BlockTask]
    resumed: bool
    lambdas: list[float]
    bytes_read: int = 0
    bytes_written: int = 0
    blocks_computed: int = 0
    block_seconds: float = field(default=0.0)
    lease: ScoringLease | None = field(default=None, repr=False)

    @property
    def blocks(self) -> int:
        return len(self.plan.row_ranges) * len(self.plan.super_blocks)

    @property
    def blocks_reused(self) -> int:
        """Blocks an earlier run committed (not in ``pending``)."""
        return self.blocks - len(self.pending)

    def ref(self) -> ScoreJobRef:
        """A picklable handle on this scoring, for a process that finishes it later (SLURM's
        merge job): the blocks it still lacked at ``prepare_scoring`` stay its ``pending``."""
        return ScoreJobRef(
            self.exp,
            self.variant,
            self.plan,
            self.sset.group.path,
            tuple(self.pending),
            self.resumed,
            tuple(self.lambdas),
        )

    def release(self) -> None:
        """Give up the variant's lease (the unfinished set stays, for a rerun to resume)."""
        if self.lease is not None:
            self.lease.release()

    def discard(self) -> None:
        """Remove the unfinished set (an error a rerun would meet again) and the lease."""
        try:
            self.sset.discard()
        finally:
            self.release()

    def record(self, result: BlockResult) -> None:
        """Count a finished block's work (wherever it ran)."""
        self.bytes_read += result.bytes_read
        self.bytes_written += result.bytes_written
        self.blocks_computed += 1
        self.block_seconds += result.seconds

    def finish(self) -> ScoreSet:
        """Merge every range's partial top-k (in range order: the same bits whatever ran the
        blocks), write the final top-k, drop ``parts/`` and publish the set."""
        done = self.sset.parts.done_mask()
        if not done.all():
            missing = int((~done).sum())
            raise StoreStateError(
                f"{missing} score blocks of {self.sset.group.path} are not committed; run them "
                "(rerun the scoring: committed blocks are kept) before finishing."
            )
        k = min(self.plan.topk, self.plan.n)
        parts = self.sset.parts
        for t0, t1 in self.plan.super_blocks:
            best: TopList | None = None
            worst: TopList | None = None
            for r in range(len(self.plan.row_ranges)):
                got = parts.read(r, t0, t1)
                self.bytes_read += sum(v.nbytes for v in got.values())
                best = merge(best, _top(got, "proponents"), k)
                worst = merge(worst, _top(got, "opponents"), k)
            assert best is not None and worst is not None  # n ≥ 1: at least one range
            self.sset.write_topk(
                t0,
                {
                    "proponents_idx": best[1].T.numpy(),
                    "proponents_val": best[0].T.numpy(),
                    "opponents_idx": worst[1].T.numpy(),
                    "opponents_val": (-worst[0]).T.numpy(),
                },
            )
        self.sset.drop_parts()
        published = self.sset.publish()
        self.release()
        return published


@dataclass(frozen=True)
class ScoreJobRef:
    """``ScoreJob.ref()``: what another process needs to finish the scoring (no open store)."""

    exp: str
    variant: str
    plan: ScorePlan
    path: str  # the unfinished set's group in the store
    pending: tuple[BlockTask, ...]
    resumed: bool
    lambdas: tuple[float, ...]

    def open(self, store: FeatureStore) -> ScoreJob:
        """The scoring again, on ``store`` opened in this process; StoreStateError when its
        unfinished set is gone (a later scoring of the variant replaced it)."""
        parent = group(store.root, layout.scores(self.exp))
        name = self.path.rsplit("/", 1)[-1]
        if name not in parent:
            raise StoreStateError(
                f"the unfinished score set {self.path} is gone: another scoring of "
                f"{self.variant!r} replaced it. Rerun the scoring."
            )
        sset = ScoreSet(group(parent, name), parent, self.variant)
        return ScoreJob(
            store, self.exp, self.variant, self.plan, sset, list(self.pending), self.resumed,
            list(self.lambdas),
        )  # fmt: skip


def _top(got: dict[str, np.ndarray], side: str) -> TopList:
    return torch.from_numpy(got[f"{side}_val"].T.copy()), torch.from_numpy(
        got[f"{side}_idx"].T.copy()
    )


def _check_inputs(store: FeatureStore, exp: str, ids: list[int], p: int) -> None:
    spec = store.spec
    if p > spec.proj_dim:
        raise StoreStateError(
            f"proj_dim={p} exceeds the store's featurised proj_dim={spec.proj_dim}; "
            "featurise at the largest proj_dim of a sweep."
        )
    train_sets = [store.train_rows(c) for c in ids]
    target_sets = [store.target_rows(exp, c) for c in ids]
    for c, rs in zip(ids, train_sets, strict=True):
        if not rs.is_complete():
            raise StoreStateError(f"model_id={c}: train features are incomplete; featurise first.")
    for c, ts in zip(ids, target_sets, strict=True):
        if not ts.is_complete():
            raise StoreStateError(f"model_id={c}: targets of {exp!r} are not all featurised.")
    store.check_same_items(list(zip(ids, train_sets, strict=True)), "train")
    store.check_same_items(list(zip(ids, target_sets, strict=True)), f"target ({exp!r})")


def prepare_scoring(
    store: FeatureStore,
    exp: str,
    model_ids: Sequence[int],
    proj_dim: int | None = None,
    lambda_reg: LambdaReg = AUTO,
    kinv_scaling: str = "mean_abs",
    topk: int = 10,
    train_block: int = 4096,
    target_block: int = 1024,
    memory: int = 1 << 30,
    write_scores: str = "auto",
    full_max_bytes: int = FULL_MAX_BYTES,
    block_rows: int = 1 << 16,
    device: torch.device | str = "cpu",
) -> ScoreJob:
    """Everything a scoring needs before its blocks run (see the module docstring); a set
    left unfinished by an earlier run of the same plan is resumed, its committed blocks kept."""
    spec = store.spec
    p = spec.proj_dim if proj_dim is None else proj_dim
    n, m, ids = spec.train_size, store.num_targets(exp), list(model_ids)
    lambda_reg = parse_lambda(lambda_reg)  # a NaN/inf λ is refused before any work
    _check_inputs(store, exp, ids, p)
    # best: the λ trak-dist eval recorded (a number or auto), or an error naming what to run
    lambda_reg, best_rule = resolve_best(store, exp, p, lambda_reg, kinv_scaling)
    # every checkpoint's λ first (auto: from its spectrum; a non-finite XᵀX or factor is a
    # NonFiniteError, not auto's fallback λ = 1). Factors are re-read below: one p² factor in
    # memory at a time.
    factors = [ensure_factor(store, c, p, device) for c in ids]
    lambdas = [
        f.resolve_lambda(lambda_reg, f"model_id={c}") for c, f in zip(ids, factors, strict=True)
    ]
    spectra = [
        hashlib.sha256(np.ascontiguousarray(f.eigenvalues).tobytes()).hexdigest() for f in factors
    ]
    del factors
    plan = ScorePlan.of(
        n,
        m,
        p,
        len(ids),
        topk,
        train_block,
        target_block,
        memory,
        write_scores,
        full_max_bytes,
        block_rows,
        spec.chunk_rows,
    )
    name = variant_name(p, lambda_reg, kinv_scaling)
    attrs = {
        "proj_dim": p,
        "lambda_reg": lambda_reg,
        "lambda_rule": "; ".join(
            r for r in (best_rule, auto_rule() if lambda_reg == AUTO else "fixed") if r
        ),
        "kinv_scaling": kinv_scaling,
        "model_ids": ids,
        "lambdas": lambdas,
        "write_scores": plan.write_scores,
        "write_scores_asked": write_scores,
        "super_block": plan.super_block,
        "block_rows": plan.block_rows,
        "n": n,
        "m": m,
        "topk": topk,
    }
    # the plan and what the features were (XᵀX's spectrum) name the unfinished set: a rerun
    # resumes only blocks computed from the same features with the same grid
    key = hashlib.sha256(
        json.dumps([attrs, spectra, vars(plan)], sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    parent = store.root.require_group(layout.scores(exp))
    grid = (len(plan.row_ranges), len(plan.super_blocks), plan.super_block)
    chunks = (min(n, spec.chunk_rows), plan.target_block)
    # held until publish or release: resume (or removal of another plan's set) and Y are
    # never done under another scoring of the variant
    lease = scoring_lease(store.where, exp, name, store.options)
    try:
        sset, resumed = ScoreSet.resume(parent, name, key, grid, chunks, plan.full, attrs)
        try:
            _write_y(store, exp, sset, ids, lambdas, p, kinv_scaling, plan, device)
        except (OSError, TrakDistError):
            sset.discard()  # e.g. a full disk: the previous scores stay, the space is freed
            raise
    except BaseException:
        if lease is not None:
            lease.release()
        raise
    done = sset.parts.done_mask()
    pending = [
        BlockTask(
            store.where,
            sset.group.path,
            r,
            s,
            r0,
            r1,
            t0,
            t1,
            tuple(ids),
            p,
            plan.full,
            topk,
            plan.train_block,
            plan.target_block,
        )
        for s, (t0, t1) in enumerate(plan.super_blocks)
        for r, (r0, r1) in enumerate(plan.row_ranges)
        if not done[r, s]
    ]
    return ScoreJob(store, exp, name, plan, sset, pending, resumed, lambdas, lease=lease)


def _write_y(
    store: FeatureStore,
    exp: str,
    sset: ScoreSet,
    ids: list[int],
    lambdas: list[float],
    p: int,
    kinv_scaling: str,
    plan: ScorePlan,
    device: torch.device | str,
) -> None:
    """Y_c = X_tc K_c⁻¹ ``[m, p]`` float32 once per checkpoint (kept by a resumed set)."""
    m, tb = plan.m, plan.target_block
    for c, lam in zip(ids, lambdas, strict=True):
        if sset.y_done(c):
            continue
        factor: Factorization = ensure_factor(store, c, p, device)
        kinv = torch.as_tensor(factor.kinv(lam, kinv_scaling, f"model_id={c}"), device=device)
        ts = store.target_rows(exp, c)
        sset.create_y(c, m, p, tb)
        for t0 in range(0, m, tb):
            xt = torch.as_tensor(ts.read(t0, min(m, t0 + tb), p), device=device)
            sset.write_y(c, t0, (xt.double() @ kinv).float().cpu().numpy())
        sset.commit_y(c)
        del kinv
