"""The units of work the driver hands out and what comes back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShardTask:
    """Featurise rows ``[start, end)`` (whole chunks) of checkpoint ``model_id``: ``kind``
    ``train`` (X and Q, returns a partial XᵀX) or ``target`` (X of experiment ``exp``);
    ``attempt`` counts retries from 0."""

    kind: str
    model_id: int
    start: int
    end: int
    exp: str = ""
    attempt: int = 0

    @property
    def rows(self) -> int:
        return self.end - self.start

    def retry(self) -> ShardTask:
        return ShardTask(self.kind, self.model_id, self.start, self.end, self.exp, self.attempt + 1)

    def __str__(self) -> str:
        what = "train" if self.kind == "train" else f"targets {self.exp}"
        return f"{what} rows [{self.start}, {self.end}) of model_id={self.model_id}"


@dataclass(frozen=True)
class ShardResult:
    """What a finished shard reports (its partial XᵀX travels separately, see Worker.run)."""

    task: ShardTask
    rows_computed: int
    rows_reused: int
    seconds: float
    worker: str
    cpu_seconds: float = 0.0


def shard_plan(n: int, chunk_rows: int, shard_rows: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of ``shard_rows`` rows (a multiple of ``chunk_rows``) covering n;
    independent of what is done (a committed chunk is read back, Worker.run)."""
    if shard_rows % chunk_rows:
        raise ValueError(f"shard_rows={shard_rows} is not a multiple of chunk_rows={chunk_rows}")
    return [(s, min(n, s + shard_rows)) for s in range(0, n, shard_rows)]


def auto_shard_rows(n: int, chunk_rows: int, workers: int, per_worker: int = 4) -> int:
    """About ``per_worker`` shards per worker for balance, at least one chunk each."""
    chunks = -(-n // chunk_rows)
    per_shard = max(1, chunks // max(1, workers * per_worker))
    return per_shard * chunk_rows
