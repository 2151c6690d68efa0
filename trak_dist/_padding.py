"""Length grouping: the rows of a token batch ordered by length, each micro-batch cut to its
own longest row.

A ``data=text`` dataset is padded on the right to its longest row (its row hashes and
fingerprint are taken from the padded tensors, so the width must not depend on batching). The
gradient passes need not see that padding: under an attention mask, right padding changes no
real token's output (a causal model never looks right, a masked key gets zero weight, and
positions count from the left), so a micro-batch cut to its longest row gives the same
gradients up to float rounding, for less work. Ordering the rows by length first puts rows of
like length in one micro-batch. The featuriser puts the rows back in the batch's order, so row
i of the store stays row i of the dataset.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from trak_dist.batches import Batch


def length_order(batch: Batch) -> Tensor | None:
    """Positions ``[B]`` (int64) of a right-padded token batch's rows, longest first (ties in
    batch order); None where grouping does not apply: not a mapping, no 2-D
    ``attention_mask``, or padding that is not on the right."""
    if not isinstance(batch, Mapping) or "attention_mask" not in batch:
        return None
    mask = batch["attention_mask"]
    if mask.dim() != 2:
        return None
    real = (mask != 0).cpu()
    if (real[:, 1:] & ~real[:, :-1]).any():  # a real token after a pad: left or inner padding
        return None
    return torch.sort(real.sum(dim=1), descending=True, stable=True).indices


def trim(batch: Batch) -> Batch:
    """A right-padded token batch (``length_order`` not None) cut to its longest row: every
    ``[B, T, …]`` tensor keeps its first ``max(longest, min(2, T))`` columns (a causal LM needs
    two); others (``[B]`` class labels) stay whole."""
    assert isinstance(batch, Mapping)
    mask = batch["attention_mask"]
    width = mask.shape[1]
    keep = max(int((mask != 0).sum(dim=1).max()), min(2, width))
    if keep == width:
        return batch
    return {k: v[:, :keep] if v.dim() >= 2 and v.shape[1] == width else v for k, v in batch.items()}
