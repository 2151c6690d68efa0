"""What the pipeline's stages ask for and return: frozen dataclasses, never dicts read by key."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from trak_dist.config import JobConfig
from trak_dist.scoring import BLOCK_ROWS, FULL_MAX_BYTES, LambdaReg

# targets whose top-k proponents a score result carries back (the report reads no more)
PREVIEW_TARGETS = 100


@dataclass(frozen=True)
class ScoreRequest:
    """Score experiment ``exp`` for one (proj_dim, λ) variant, averaged over ``model_ids``;
    defaults are ``compute_scores``'s, ``of`` takes a job's scoring section."""

    exp: str
    model_ids: tuple[int, ...]
    proj_dim: int
    lambda_reg: LambdaReg
    kinv_scaling: str = "mean_abs"
    topk: int = 10
    train_block: int = 4096
    target_block: int = 1024
    write_scores: str = "auto"
    memory: int = 1 << 30
    full_max_bytes: int = FULL_MAX_BYTES
    block_rows: int = BLOCK_ROWS

    @classmethod
    def of(
        cls, cfg: JobConfig, model_ids: list[int], proj_dim: int, lambda_reg: LambdaReg
    ) -> ScoreRequest:
        s = cfg.scoring
        return cls(
            s.exp_name,
            tuple(model_ids),
            proj_dim,
            lambda_reg,
            s.kinv_scaling,
            s.topk,
            s.train_block,
            s.target_block,
            s.write_scores,
            s.memory_bytes,
            s.full_max_bytes,
            s.block_rows,
        )


@dataclass(frozen=True)
class TopK:
    """Top-k proponents and opponents of the first targets, each ``[targets, k]``."""

    proponents_idx: np.ndarray
    proponents_val: np.ndarray
    opponents_idx: np.ndarray
    opponents_val: np.ndarray

    @classmethod
    def head(cls, top: dict[str, np.ndarray], targets: int) -> TopK:
        """The first ``targets`` rows of a score set's ``read_topk()``."""
        return cls(**{f.name: top[f.name][:targets] for f in fields(cls)})


@dataclass(frozen=True)
class ScoreResult:
    """One scored variant: its name and ``path`` in the store, the λ per checkpoint
    (``lambdas``) and the top-k of the first ``PREVIEW_TARGETS`` targets (``top``).

    Attributes:
        write_scores: ``full`` (S stored) or ``topk`` (only the top-k).
        super_block: targets per super-block; ``x_passes``: how many times every train row of
            X was read (one pass per super-block, over all checkpoints).
        blocks, blocks_computed, blocks_reused: score blocks in the plan, computed by this run
            (a block computed twice after a lost worker counts twice), committed by an earlier
            run and kept.
        bytes_read, bytes_written: by the blocks computed and the final merge (not Y).
        worker_restarts: score workers replaced during this scoring (Ray).
        block_seconds: the blocks' compute time, summed over the workers that ran them.
    """

    exp: str
    variant: str
    proj_dim: int
    lambda_reg: LambdaReg
    lambdas: tuple[float, ...]
    seconds: float
    path: str
    top: TopK
    write_scores: str = "full"
    super_block: int = 0
    x_passes: int = 0
    blocks: int = 0
    blocks_computed: int = 0
    blocks_reused: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    worker_restarts: int = 0
    block_seconds: float = 0.0


@dataclass(frozen=True)
class FeaturizeReport:
    """What an executor's featurise stage did."""

    rows_computed: dict[str, int] = field(default_factory=lambda: {"train": 0, "target": 0})
    rows_reused: dict[str, int] = field(default_factory=lambda: {"train": 0, "target": 0})
    worker_restarts: int = 0
    task_retries: int = 0
    worker_start_s: float = 0.0
    featurize_s: float = 0.0


@dataclass(frozen=True)
class JobResult:
    """What a run did: where results are, how long each phase took, what was reused.

    Attributes:
        scores: one result per scored (proj_dim, λ) variant.
        phases: seconds per phase (``setup``, ``featurize``, ``reduce``, ``score``, ``total``…).
        rows_computed, rows_reused: rows per kind (``train``, ``target``).
        conditioning: condition number of XᵀX per checkpoint and p.
    """

    store: str
    exp: str
    n: int
    m: int
    checkpoints: int
    proj_dim: int
    scores: list[ScoreResult]
    phases: dict[str, float]
    rows_computed: dict[str, int]
    rows_reused: dict[str, int]
    worker_restarts: int
    task_retries: int
    conditioning: dict[int, dict[int, float]]
    format_version: int
    store_options: dict[str, Any] = field(default_factory=dict)
