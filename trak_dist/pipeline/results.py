"""What the pipeline's stages return (a scoring's request and result are ``trak_dist.scoring``'s):
frozen dataclasses, never dicts read by key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trak_dist.scoring import ScoreResult


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
