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


def block_topk(block: torch.Tensor, first_row: int, k: int) -> TopList:
    """The ``min(k, r)`` best train rows of each column of ``block`` ``[r, t]`` (rows
    ``first_row …``), in the total order; ``[k', t]`` values and global row numbers."""
    k = min(k, block.shape[0])
    vals, pos = torch.topk(block, k, dim=0)
    kth = vals[-1]
    # a column with more rows equal to its k-th value than topk kept: which of them topk kept
    # is arbitrary, the lowest rows are the exact answer
    ties = ((block == kth).sum(0) > (vals == kth).sum(0)).nonzero().flatten().tolist()
    for col in ties:
        order = torch.argsort(block[:, col], descending=True, stable=True)[:k]
        pos[:, col] = order
        vals[:, col] = block[order, col]
    return _canonical(vals, pos + first_row)


def merge(best: TopList | None, other: TopList, k: int) -> TopList:
    """The top-k (total order) of two top lists over disjoint train rows."""
    if best is not None:
        other = (torch.cat([best[0], other[0]]), torch.cat([best[1], other[1]]))
    vals, rows = _canonical(*other)
    return vals[:k], rows[:k]


def merge_block(best: TopList | None, block: torch.Tensor, first_row: int, k: int) -> TopList:
    """``best`` merged with the top-k of ``block`` ``[r, t]`` (rows ``first_row …``)."""
    return merge(best, block_topk(block, first_row, k), k)
