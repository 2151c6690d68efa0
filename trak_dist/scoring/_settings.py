"""The scoring settings (``scoring.*``): one frozen object, passed whole from the job's config
to the plan and the block tasks (``trak_dist.config`` re-exports it as a section of JobConfig),
and a ``ScoreRequest``: those settings for one (proj_dim, λ) variant."""

from __future__ import annotations

import re
from dataclasses import dataclass

from trak_dist._validate import _one_of, _positive
from trak_dist.errors import ConfigError
from trak_dist.scoring._factor import KINV_SCALINGS
from trak_dist.scoring._lambda import AUTO, LambdaReg

WRITE_MODES = ("auto", "full", "topk")
# auto writes S whole up to this size. ScoreSet.scores() reads S into one array, so above it a
# full matrix would not fit the 4 GiB a process is given at scale (and at ~350 MB/s it is
# seconds to write, not minutes); LDS evaluation, which reads S, is for sets this size.
FULL_MAX_BYTES = 2 << 30
MEMORY_DEFAULT = "1GiB"
BLOCK_ROWS = 65536  # train rows per score task: ≥ 16 tasks at n = 1M for the workers to share
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(value: int | str, name: str = "scoring.memory") -> int:
    """``1073741824``, ``"512MiB"``, ``"4GiB"`` or ``"4G"`` as bytes (ConfigError otherwise)."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtb]?)(?:i?b)?\s*", str(value).lower())
        if found is None:
            raise ConfigError(
                f"{name}={value!r}; expected bytes as an integer or with a unit (512MiB, 4GiB)."
            )
        n = int(float(found[1]) * _UNITS[found[2]])
    if n < 1:
        raise ConfigError(f"{name}={value!r}; expected a positive size.")
    return n


@dataclass(frozen=True)
class ScoringConfig:
    """Which targets are scored and how.

    Attributes:
        write_scores: ``full`` (S ``[n, m]`` and the top-k), ``topk`` (only the top-k
            proponents and opponents, exact) or ``auto`` (full while S is at most
            ``full_max_bytes``; default 2 GiB, what ``scores()`` can still read whole).
        memory: what one scoring process may hold (bytes, or ``"1GiB"``): the target
            super-block, which X is read once for, is as wide as fits.
        block_rows: train rows per score task (the unit spread over workers and resumed).
        kinv_scaling: how each checkpoint weighs in the mean (``Factorization.kinv``);
            ``auto`` (the default) is resolved from the store's spec where scores are made
            or read (``resolve_kinv_scaling``).
    """

    exp_name: str = "targets"
    kinv_scaling: str = "auto"
    topk: int = 10
    train_block: int = 4096
    target_block: int = 1024
    device: str = "cpu"
    write_scores: str = "auto"
    full_max_bytes: int = FULL_MAX_BYTES
    memory: str = MEMORY_DEFAULT
    block_rows: int = BLOCK_ROWS

    def __post_init__(self) -> None:
        _one_of(self, "kinv_scaling", KINV_SCALINGS)
        _one_of(self, "write_scores", WRITE_MODES)
        _positive(self, "topk", "train_block", "target_block", "full_max_bytes", "block_rows")
        parse_bytes(self.memory, "scoring.memory")
        if not self.exp_name or "/" in self.exp_name:
            raise ConfigError(
                f"scoring.exp_name={self.exp_name!r}; expected a non-empty name without '/' "
                "(it names the store group the scores go to)."
            )

    @property
    def memory_bytes(self) -> int:
        return parse_bytes(self.memory, "scoring.memory")


@dataclass(frozen=True)
class ScoreRequest:
    """Score the targets of ``scoring.exp_name`` for one variant, ``proj_dim`` (None: the
    store's width) and ``lambda_reg`` (a number, ``auto`` or ``best``), averaged over
    ``model_ids``, with the settings ``scoring``."""

    scoring: ScoringConfig
    model_ids: tuple[int, ...]
    proj_dim: int | None = None
    lambda_reg: LambdaReg = AUTO

    @property
    def exp(self) -> str:
        return self.scoring.exp_name
