"""One score block (train rows ``[r0, r1)`` × a target super-block): a task any process runs.

Per train sub-block of ``train_block`` rows (aligned to multiples of it from row 0, whatever
the task's range) it reads X_c and Q_c of every checkpoint once and, per ``target_block``
columns of the super-block, forms Σ_c X_c Y_cᵀ / C ⊙ mean Q: the same products, in the same
order and shapes, as a single-process scoring, so S and the top-k are bitwise the same however
the rows are split into tasks. It writes its S block (``full``), then its partial top-k and the
block's flag (``ScoreParts``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from trak_dist.errors import NonFiniteError
from trak_dist.scoring._plan import BlockResult, BlockTask, ScorePlan
from trak_dist.scoring._topk import TopList, group_extremes, merge_above
from trak_dist.store import FeatureStore, RowSet, one_thread

# a partial top list shorter than k (a range of fewer than k rows) is padded with entries that
# sort after every finite score in the total order
PAD_ROW = np.iinfo(np.int64).max


def refuse_non_finite_scores(block: torch.Tensor, r0: int, t0: int, label: str) -> None:
    """The last guard of "no NaN score with exit code 0": the rows, Q and XᵀX read are checked
    finite (non-finite rows are never committed; reads are checked, store/_integrity.py), so a
    non-finite score can only be float32 overflow of X·Y."""
    bad = ~torch.isfinite(block)
    if bool(bad.any()):
        rows, cols = bad.nonzero(as_tuple=True)
        raise NonFiniteError(
            f"scores {label} are non-finite at {int(bad.sum())} entries, e.g. train row "
            f"{r0 + int(rows[0])} × target {t0 + int(cols[0])}, though the features read were "
            "finite: they overflow float32. Use a larger lambda_reg (or lambda_reg=auto); the "
            "previous scores are kept."
        )


def _padded(top: TopList, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``[t, k]`` values and rows of a top list ``[k', t]``, padded to k (see PAD_ROW)."""
    vals, rows = top[0].T.cpu().numpy(), top[1].T.cpu().numpy()
    if vals.shape[1] < k:
        pad = k - vals.shape[1]
        vals = np.pad(vals, ((0, 0), (0, pad)), constant_values=-np.inf)
        rows = np.pad(rows, ((0, 0), (0, pad)), constant_values=PAD_ROW)
    return vals, rows


def score_block(
    store: FeatureStore, task: BlockTask, device: torch.device | str = "cpu"
) -> BlockResult:
    """Compute and commit block (``task.row_range``, ``task.super_block``)."""
    start = time.perf_counter()
    t, plan = task, task.plan
    (r_lo, r_hi), (t0, t1) = t.rows, t.targets
    sset = store.unfinished_scores(t.group)
    label = sset.group.path
    c = len(t.model_ids)
    k = min(plan.topk, store.spec.train_size)
    train_sets = [store.train_rows(mid) for mid in t.model_ids]
    ys = [torch.as_tensor(sset.read_y(mid, t0, t1), device=device) for mid in t.model_ids]
    read = sum(y.numel() * 4 for y in ys)
    written = 0
    cols = list(range(t0, t1, plan.target_block))
    best: list[TopList | None] = [None] * len(cols)
    worst: list[TopList | None] = [None] * len(cols)
    # one accumulator for every sub-block: a fresh one per product costs its page faults
    buffer = torch.empty(
        min(plan.train_block, r_hi - r_lo), min(plan.target_block, t1 - t0), device=device
    )
    for r0, r1, xs, qbar, nbytes in _train_blocks(train_sets, r_lo, r_hi, plan, device):
        read += nbytes
        for j, c0 in enumerate(cols):
            c1 = min(t1, c0 + plan.target_block)
            acc = buffer[: r1 - r0, : c1 - c0].zero_()
            for x, y in zip(xs, ys, strict=True):
                acc.addmm_(x, y[c0 - t0 : c1 - t0].T)
            if c > 1:  # x / 1 is x, bit for bit: one pass fewer for one checkpoint
                acc.div_(c)
            block = acc.mul_((qbar / c)[:, None])  # (acc / C) · (Σ_c Q_c / C)
            high, low = group_extremes(block)  # both sides' bounds
            # every entry is finite if the extremes are: a sum of them, not of the block (inf
            # may be a false alarm of the sum: refuse_non_finite_scores looks at the block)
            if not bool(torch.isfinite(high.sum() - low.sum())):
                refuse_non_finite_scores(block, r0, c0, label)
            if plan.full:
                out = block.cpu().numpy()
                sset.write_block(r0, c0, out)
                written += out.nbytes
            best[j] = merge_above(best[j], block, r0, k, largest=True, ext=high)
            worst[j] = merge_above(worst[j], block, r0, k, largest=False, ext=low)
    # opponents are kept as the proponents of -S (their values negated) until the final merge
    pv, pi = _padded(_cat(best), k)
    ov, oi = _padded(_cat(worst), k)
    values = {"proponents_val": pv, "proponents_idx": pi, "opponents_val": ov, "opponents_idx": oi}
    written += sset.parts.write(t.row_range, t.super_block, t0, values)
    return BlockResult(t, time.perf_counter() - start, read, written)


def _train_blocks(
    train_sets: list[RowSet], r_lo: int, r_hi: int, plan: ScorePlan, device: torch.device | str
) -> Iterator[tuple[int, int, list[torch.Tensor], torch.Tensor, int]]:
    """Per train sub-block of rows ``[r_lo, r_hi)``: its rows, X of every checkpoint (float32,
    on ``device``), Σ_c Q_c, and the bytes read. The next sub-block is read on a thread while
    the caller scores this one: a read waits on the medium and the checksum, not on the cores
    the products use, so the matmul never waits for the store (docs/design.md, "Pace")."""

    def read(r0: int) -> tuple[int, int, list[torch.Tensor], torch.Tensor, int]:
        r1 = min(r_hi, r0 + plan.train_block)
        xs, nbytes = [], 0
        qbar = torch.zeros(r1 - r0, dtype=torch.float32, device=device)
        with one_thread():  # casts bound by memory: see one_thread
            for rs in train_sets:
                xa, qa = rs.read(r0, r1, plan.proj_dim), rs.read_q(r0, r1)
                nbytes += xa.nbytes + qa.nbytes
                xs.append(torch.as_tensor(xa, device=device).float())
                qbar += torch.as_tensor(qa, device=device)
        return r0, r1, xs, qbar, nbytes

    starts = list(range(r_lo, r_hi, plan.train_block))
    with ThreadPoolExecutor(1, thread_name_prefix="trak-dist-score-reader") as reader:
        ahead = reader.submit(read, starts[0])
        for nxt in [*starts[1:], None]:
            block = ahead.result()
            if nxt is not None:
                ahead = reader.submit(read, nxt)
            yield block


def _cat(tops: list[TopList | None]) -> TopList:
    parts = [top for top in tops if top is not None]
    return torch.cat([v for v, _ in parts], 1), torch.cat([r for _, r in parts], 1)
