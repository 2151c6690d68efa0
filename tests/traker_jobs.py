"""traker's documented workflows as separate processes (tests/test_traker_workflows.py).

``python tests/traker_jobs.py slurm <model_id> <save_dir> <ckpt_dir>``: one job of traker's
SLURM tutorial (featurize one checkpoint, finalize it, score the targets with it).
``python tests/traker_jobs.py shard <k> <save_dir> <ckpt_dir>``: the k-th of SHARDS slices of
the train set and of the targets, featurised and scored for every checkpoint, with ``inds=``
in shuffled batches.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

N, M = 300, 40
TRAIN_SHARDS = (0, 97, 211, N)  # not multiples of the store's 64-row chunks
TARGET_SHARDS = (0, 13, 29, M)
LAMBDA = 1e-2


def digits() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """The first N digits as the train set, the next M as targets (scikit-learn ships them)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.int64)
    return (x[:N], y[:N]), (x[N : N + M], y[N : N + M])


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 8), nn.Tanh(), nn.Linear(8, 10))


def train_states(num: int = 3, steps: int = 60) -> list[dict[str, torch.Tensor]]:
    """``num`` checkpoints trained from different seeds (full-batch Adam, well under a second)."""
    (x, y), _ = digits()
    states = []
    for seed in range(num):
        model = make_model(seed)
        opt = torch.optim.Adam(model.parameters(), lr=3e-2)
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return states


def noop_kwargs() -> dict:
    """Settings under which ours and traker compute the same numbers: identity projection,
    float32, λ > 0 (n < d makes XᵀX singular)."""
    from trak.projectors import NoOpProjector

    return dict(
        projector=NoOpProjector(device="cpu"),
        use_half_precision=False,
        lambda_reg=LAMBDA,
        device="cpu",
        logging_level=logging.ERROR,
    )


def _checkpoints(ckpt_dir: str) -> list[dict[str, torch.Tensor]]:
    paths = sorted(Path(ckpt_dir).glob("ckpt_*.pt"))
    return [torch.load(p, weights_only=True) for p in paths]


def slurm_job(model_id: int, save_dir: str, ckpt_dir: str) -> None:
    """featurize_and_score.py of traker's SLURM tutorial, with its load_from_save_dir choice."""
    from trak_dist import TRAKer

    (x, y), (xt, yt) = digits()
    ckpt = _checkpoints(ckpt_dir)[model_id]
    traker = TRAKer(
        model=make_model(),
        task="image_classification",
        train_set_size=N,
        save_dir=save_dir,
        load_from_save_dir=model_id == 0,
        **noop_kwargs(),
    )
    traker.load_checkpoint(ckpt, model_id=model_id)
    for b in range(0, N, 50):
        traker.featurize(batch=(x[b : b + 50], y[b : b + 50]), num_samples=len(x[b : b + 50]))
    traker.finalize_features(model_ids=[model_id])
    traker.start_scoring_checkpoint("exp", ckpt, model_id=model_id, num_targets=M)
    traker.score(batch=(xt, yt), num_samples=M)


def shard_job(k: int, save_dir: str, ckpt_dir: str) -> None:
    """Rows [TRAIN_SHARDS[k], TRAIN_SHARDS[k+1]) and the k-th target slice, every checkpoint."""
    from trak_dist import TRAKer

    (x, y), (xt, yt) = digits()
    rng = np.random.default_rng(k)
    traker = TRAKer(
        model=make_model(),
        task="image_classification",
        train_set_size=N,
        save_dir=save_dir,
        chunk_rows=64,
        **noop_kwargs(),
    )
    for model_id, ckpt in enumerate(_checkpoints(ckpt_dir)):
        traker.load_checkpoint(ckpt, model_id=model_id)
        parts = np.array_split(np.arange(TRAIN_SHARDS[k], TRAIN_SHARDS[k + 1]), 5)
        for i in rng.permutation(len(parts)):  # any order
            traker.featurize(batch=(x[parts[i]], y[parts[i]]), inds=parts[i])
        traker.start_scoring_checkpoint("exp", ckpt, model_id=model_id, num_targets=M)
        inds = np.arange(TARGET_SHARDS[k], TARGET_SHARDS[k + 1])
        traker.score(batch=(xt[inds], yt[inds]), inds=inds)


if __name__ == "__main__":
    job, index, save_dir, ckpt_dir = sys.argv[1:5]
    {"slurm": slurm_job, "shard": shard_job}[job](int(index), save_dir, ckpt_dir)
