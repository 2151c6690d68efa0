"""Exact top-k of score columns under one total order: the value (descending), then the train
row (ascending) among equal values.

Because the order is total, the top-k of a union is the top-k of the top-k's of its parts:
partial top-k lists of score blocks merge to the same bits whatever the number of blocks, the
workers that computed them or the order they arrive in (docs/design.md, "Scoring at scale").
``torch.topk`` alone picks an arbitrary row among ties at the k-th value (duplicate train
examples score alike), so ties there are settled by a stable sort of the few columns that have
them."""

from __future__ import annotations

import torch

TopList = tuple[torch.Tensor, torch.Tensor]  # values [k, t] (float32), rows [k, t] (int64)


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


def merge_block(best: TopList | None, block: torch.Tensor, first_row: int, k: int) -> TopList:
    """``best`` merged with the top-k of ``block`` ``[r, t]`` (rows ``first_row …``)."""
    return merge(best, block_topk(block, first_row, k), k)
