"""The score-block worker: runs BlockTasks of any scoring on one store. A plain class (Ray's
worker actors wrap it, docs/design.md invariant 6)."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from typing import Any

import torch

from trak_dist.scoring import BlockResult, BlockTask, score_block
from trak_dist.store import FeatureStore


class BlockScorer:
    """Computes and commits score blocks (``score_block``) of the store at ``store``; holds
    what one block needs (``scoring.memory``), nothing between blocks but the open store."""

    def __init__(
        self,
        store: str,
        device: str | torch.device = "cpu",
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.store = FeatureStore.open(store, options=options)
        self.device = torch.device(device)
        self.name = f"{socket.gethostname()}:{os.getpid()}"

    def pid(self) -> int:
        return os.getpid()

    def committed(self, task: BlockTask) -> bool:
        """Whether block (``task.row_range``, ``task.super_block``) has its commit flag (an
        earlier run of the task, e.g. before SLURM requeued it, finished it)."""
        sset = self.store.unfinished_scores(task.group)
        return bool(sset.parts.done[task.row_range, task.super_block])

    def run(self, task: BlockTask) -> BlockResult:
        """Block (``task.row_range``, ``task.super_block``): its S block (if full), its
        partial top-k, then its commit flag."""
        return dataclasses.replace(score_block(self.store, task, self.device), worker=self.name)
