"""How a scoring is cut into blocks: target super-blocks that fit the memory budget (one pass
over X each) × train-row ranges (the tasks run in parallel), and whether S is written whole.

Sizes are chosen from (n, m, p, C, k, budget) alone, never from the number of workers, so the
blocks, and with them every bit of the scores, are the same on any executor."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trak_dist.errors import ConfigError
from trak_dist.scoring._settings import WRITE_MODES, ScoringConfig


@dataclass(frozen=True)
class ScorePlan:
    """The block grid of one scoring.

    Attributes:
        super_block: targets per super-block (a multiple of ``target_block`` unless it is m);
            every block task holds Y ``[C, super_block, p]`` and reads its train rows once.
        block_rows: train rows per task (a multiple of ``train_block`` and of S's row chunks).
        full: whether S ``[n, m]`` is written (else only the top-k).
    """

    n: int
    m: int
    proj_dim: int
    checkpoints: int
    topk: int
    train_block: int
    target_block: int
    super_block: int
    block_rows: int
    full: bool

    @classmethod
    def of(
        cls, n: int, m: int, p: int, checkpoints: int, s: ScoringConfig, chunk_rows: int = 1
    ) -> ScorePlan:
        """The grid for ``n`` train rows, ``m`` targets, ``proj_dim`` p and ``checkpoints``
        under the settings ``s`` (its memory budget, blocks, write mode)."""
        write_scores, topk, train_block = s.write_scores, s.topk, s.train_block
        memory, target_block = s.memory_bytes, s.target_block
        if write_scores not in WRITE_MODES:
            raise ConfigError(f"write_scores={write_scores!r}; expected one of {WRITE_MODES}.")
        tb = min(target_block, m)
        k = min(topk, n)
        # held whatever the super-block: C train sub-blocks of X (float32) and ~4 score
        # sub-blocks (product, Q-scaled, negated, topk's copy)
        fixed = 4 * checkpoints * train_block * p + 16 * train_block * tb
        # per target: its Y row per checkpoint, and two top lists (+ their merge buffers)
        per_target = 4 * checkpoints * p + 4 * 12 * k
        fits = (memory - fixed) // per_target
        if fits < tb:
            need = fixed + tb * per_target
            raise ConfigError(
                f"scoring.memory={memory} bytes is too small for one block of {tb} targets "
                f"(p={p}, {checkpoints} checkpoints, train_block={train_block}): it needs "
                f"{need} bytes. Raise scoring.memory or lower train_block/target_block."
            )
        super_block = m if fits >= m else fits // tb * tb
        unit = math.lcm(train_block, max(1, min(chunk_rows, n)))
        rows = min(-(-s.block_rows // unit) * unit, -(-n // unit) * unit)
        full = write_scores == "full" or (write_scores == "auto" and 4 * n * m <= s.full_max_bytes)
        return cls(n, m, p, checkpoints, topk, train_block, tb, super_block, rows, full)

    @property
    def row_ranges(self) -> list[tuple[int, int]]:
        return [(r, min(self.n, r + self.block_rows)) for r in range(0, self.n, self.block_rows)]

    @property
    def super_blocks(self) -> list[tuple[int, int]]:
        return [(t, min(self.m, t + self.super_block)) for t in range(0, self.m, self.super_block)]

    @property
    def x_passes(self) -> int:
        """How many times scoring reads every train row of X (one pass per super-block)."""
        return len(self.super_blocks)

    @property
    def write_scores(self) -> str:
        return "full" if self.full else "topk"


@dataclass(frozen=True)
class BlockTask:
    """One score block of a scoring whose unfinished score set is ``group`` in the store at
    ``store``: train rows ``[r0, r1)`` = the plan's range ``row_range`` × targets ``[t0, t1)`` =
    its super-block ``super_block``, averaged over ``model_ids``."""

    store: str
    group: str
    row_range: int
    super_block: int
    model_ids: tuple[int, ...]
    plan: ScorePlan

    @property
    def rows(self) -> tuple[int, int]:
        """``(r0, r1)``."""
        return self.plan.row_ranges[self.row_range]

    @property
    def targets(self) -> tuple[int, int]:
        """``(t0, t1)``."""
        return self.plan.super_blocks[self.super_block]


@dataclass(frozen=True)
class BlockResult:
    """What one block task did: the bytes it read (X, Q and Y) and wrote, and where."""

    task: BlockTask
    seconds: float
    bytes_read: int
    bytes_written: int
    worker: str = ""
