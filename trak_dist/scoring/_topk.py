"""Exact top-k of score columns under one total order: the value (descending), then the train
row (ascending) among equal values.

Because the order is total, the top-k of a union is the top-k of the top-k's of its parts:
partial top-k lists of score blocks merge to the same bits whatever the number of blocks, the
workers that computed them or the order they arrive in (docs/design.md, "Scoring at scale").
``torch.topk`` alone picks an arbitrary row among ties at the k-th value (duplicate train
examples score alike), so ties there are settled by a stable sort of the few columns that have
them."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch

TopList = tuple[torch.Tensor, torch.Tensor]  # values [k, t] (float32), rows [k, t] (int64)


@dataclass(frozen=True)
class TopK:
    """Per target, the ``k`` highest scores (proponents) and the ``k`` lowest (opponents, their
    values ascending from the lowest), ``[m, k]`` each: a score set's, or a query's."""

    proponents_idx: np.ndarray
    proponents_val: np.ndarray
    opponents_idx: np.ndarray
    opponents_val: np.ndarray

    @classmethod
    def head(cls, top: dict[str, np.ndarray], targets: int) -> TopK:
        """The first ``targets`` rows of a score set's ``read_topk()``."""
        return cls(**{f.name: top[f.name][:targets] for f in fields(cls)})


def _canonical(vals: torch.Tensor, rows: torch.Tensor) -> TopList:
    """``vals``/``rows`` ``[k, t]`` reordered by (value descending, row ascending)."""
    by_row = torch.argsort(rows, dim=0, stable=True)
    vals, rows = torch.gather(vals, 0, by_row), torch.gather(rows, 0, by_row)
    by_val = torch.argsort(vals, dim=0, descending=True, stable=True)
    return torch.gather(vals, 0, by_val), torch.gather(rows, 0, by_val)


def block_topk(block: torch.Tensor, first_row: int, k: int, largest: bool = True) -> TopList:
    """The ``min(k, r)`` best train rows of each column of ``block`` ``[r, t]`` (rows
    ``first_row …``) in the total order, as ``[k', t]`` values and global row numbers;
    ``largest=False``: the lowest, returned as the best of ``-block`` (values negated)."""
    return block_topk_t(block.T.contiguous(), first_row, k, largest)


def block_topk_t(rows_last: torch.Tensor, first_row: int, k: int, largest: bool) -> TopList:
    """``block_topk`` of ``rows_last`` = block.T ``[t, r]`` contiguous (one copy serves both
    sides: topk along a contiguous axis is several times faster than along the rows)."""
    r = rows_last.shape[1]
    k = min(k, r)
    # one more than k: where the (k+1)-th equals the k-th, topk's choice among the tied rows
    # is arbitrary and the column is settled by a stable sort (the lowest rows win)
    vals, pos = torch.topk(rows_last, min(k + 1, r), dim=1, largest=largest)
    if vals.shape[1] > k:
        ties = (vals[:, k] == vals[:, k - 1]).nonzero().flatten().tolist()
        vals, pos = vals[:, :k].clone(), pos[:, :k].clone()
        for col in ties:
            order = torch.argsort(rows_last[col], descending=largest, stable=True)[:k]
            pos[col] = order
            vals[col] = rows_last[col, order]
    if not largest:
        vals = -vals  # the opponents are the proponents of -S (negation is exact)
    return _canonical(vals.T, pos.T + first_row)


def merge(best: TopList | None, other: TopList, k: int) -> TopList:
    """The top-k (total order) of two top lists over disjoint train rows."""
    if best is not None:
        other = (torch.cat([best[0], other[0]]), torch.cat([best[1], other[1]]))
    vals, rows = _canonical(*other)
    return vals[:k], rows[:k]


def merge_above(
    best: TopList | None,
    block: torch.Tensor,
    first_row: int,
    k: int,
    largest: bool,
    ext: torch.Tensor | None = None,
) -> TopList:
    """``merge(best, block_topk(block, first_row, k, largest), k)``, the same bits, looking in
    ``block`` ``[r, t]`` only at the entries that can enter the top-k.

    The extreme (max, or min for opponents) of every ``GROUP`` rows of a column is one cheap
    reduction over the block. An entry below a column's bound cannot enter its top-k: the bound
    is the k-th kept value once ``best`` holds k rows (k better are known), else the k-th best
    group extreme (k distinct entries at least that good). Only groups whose extreme reaches the
    bound are read again, and only their entries that reach it are sorted. Over a pass in random
    row order the entries that enter fall as k / blocks seen, so selection costs a small part
    of the matmul that made the block (a ``topk`` per block cost about half of it;
    docs/design.md, "Scoring at scale"). ``ext``: the block's group extremes of this side
    (``group_extremes``), where the caller has them."""
    r, t = block.shape
    if ext is None:
        ext = group_extremes(block)[0 if largest else 1]  # [⌈r / GROUP⌉, t]
    if not largest:
        ext = -ext  # in the kept values: opponents' are those of -S
    if best is not None and best[0].shape[0] == k:
        kth = best[0][k - 1]
    elif best is None and ext.shape[0] >= k:
        kth = torch.topk(ext.T, k, dim=1).values[:, k - 1]  # [t]
        best = (
            torch.full((k, t), -torch.inf, device=block.device),
            torch.full_like(ext[:k], PAD, dtype=torch.int64),
        )  # sorts after every entry: none is kept
    else:  # fewer than k rows so far
        return merge(best, block_topk_t(block.T.contiguous(), first_row, k, largest), k)
    # ≥, not >: an entry equal to the k-th value enters when its row is lower
    groups, cols = (ext >= kth).nonzero(as_tuple=True)
    if groups.numel() == 0:
        return best
    if groups.numel() * GROUP > block.numel() // 8:  # reading most of it: topk is cheaper
        return merge(best, block_topk_t(block.T.contiguous(), first_row, k, largest), k)
    rows = groups[:, None] * GROUP + torch.arange(GROUP, device=block.device)  # [q, GROUP]
    inside = rows < r  # the last group may be short
    rows = rows.clamp_max(r - 1)
    vals = block[rows, cols[:, None]]
    if not largest:
        vals = -vals
    take = inside & (vals >= kth[cols][:, None])
    cols = cols[:, None].expand_as(rows)[take]
    return _merge_entries(best, vals[take], rows[take] + first_row, cols, k)


PAD = torch.iinfo(torch.int64).max  # the row of an empty slot: after every real row
GROUP = 16  # rows per maximum: the bound costs 1/GROUP of a block, a hit reads GROUP entries


def group_extremes(block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per column, the max and the min of every GROUP rows of ``block`` ``[r, t]``, each
    ``[⌈r / GROUP⌉, t]`` (both sides' bounds; NaN and ±inf propagate into them, so they also
    tell whether the block is finite). Two passes: ``aminmax`` over the group axis is several
    times slower than ``amax`` and ``amin`` together (torch 2.13, CPU)."""
    r, t = block.shape
    whole = r - r % GROUP
    parts = [block[:whole].view(whole // GROUP, GROUP, t), block[whole:].unsqueeze(0)]
    parts = [part for part in parts if part.shape[0] * part.shape[1] > 0]
    high = torch.cat([torch.amax(part, dim=1) for part in parts])
    return high, torch.cat([torch.amin(part, dim=1) for part in parts])


def _merge_entries(
    best: TopList, vals: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, k: int
) -> TopList:
    """``best`` ``[k, t]`` merged with entries (``vals``, global ``rows``, ``cols``) ``[q]``;
    only the columns the entries fall in are re-sorted."""
    hit, col = torch.unique(cols, return_inverse=True)  # hit columns, ascending; col: [q] in 0…u
    u = hit.numel()
    # kept and new entries of the hit columns as one flat list sorted by (column, value desc,
    # row asc): column j's k best then start at j·k + (new entries in columns < j)
    all_vals = torch.cat([best[0][:, hit].reshape(-1), vals])
    all_rows = torch.cat([best[1][:, hit].reshape(-1), rows])
    all_cols = torch.cat([torch.arange(u, device=vals.device).repeat(k), col])
    order = torch.argsort(all_rows, stable=True)
    order = order[torch.argsort(all_vals[order], descending=True, stable=True)]
    order = order[torch.argsort(all_cols[order], stable=True)]
    starts = torch.arange(u, device=vals.device) * k
    starts[1:] += torch.cumsum(torch.bincount(col, minlength=u), 0)[:-1]
    pick = order[starts[None, :] + torch.arange(k, device=vals.device)[:, None]]
    out_vals, out_rows = best[0].clone(), best[1].clone()
    out_vals[:, hit], out_rows[:, hit] = all_vals[pick], all_rows[pick]
    return out_vals, out_rows
