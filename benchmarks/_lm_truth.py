"""Checkpoints and subset models of the ``_lm_benches`` benchmarks, cached on disk.

    <root>/<bench>/checkpoints.pt                       3 snapshots of one run on all documents
    <root>/<bench>/truth/subset<j>_seed<s>.npy           [m] target outputs of subset model j

Subset j trains on ``trak_dist.store.subset_mask(n, 0.5, 0, j)`` with seed ``1000 + j``; each
model's outputs are written when it finishes (write, then rename), so a stopped run resumes and
every method is measured against the same models."""

from __future__ import annotations

import os
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import torch

from benchmarks._lm_benches import BENCHES
from trak_dist.store import subset_mask

CHECKPOINTS = 3


def _checkpoint_run(name: str, moments: list | None = None) -> list[dict[str, torch.Tensor]]:
    """The run ``checkpoints`` caches: every document, seed 0, CHECKPOINTS snapshots."""
    bench = BENCHES[name]
    return bench.train(np.arange(len(bench.corpus().train)), 0, CHECKPOINTS, moments)


def _save(obj: object, path: Path) -> None:
    """``torch.save`` to ``path`` whole or not at all (write, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, str(path) + ".tmp")
    os.replace(str(path) + ".tmp", path)


def checkpoints(name: str, root: Path) -> list[dict[str, torch.Tensor]]:
    path = root / name / "checkpoints.pt"
    if not path.exists():
        _save(_checkpoint_run(name), path)
    return torch.load(path, weights_only=True)


def adam_moments(name: str, root: Path) -> list[dict[str, torch.Tensor]]:
    """AdamW's second moments at the snapshots of ``checkpoints``: that run again (same data,
    seed and recipe), its states checked against the cached ones first."""
    path = root / name / "adam_moments.pt"
    if not path.exists():
        moments: list[dict[str, torch.Tensor]] = []
        again = _checkpoint_run(name, moments)
        for i, (a, b) in enumerate(zip(again, checkpoints(name, root), strict=True)):
            err = max(
                float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-12)) for k in b
            )
            print(f"{name} snapshot {i}: rerun vs cached state, max relative difference {err:.2e}")
            if err > 1e-2:
                raise SystemExit(
                    f"{name}: the rerun drifted from the cached checkpoint ({err:.2e})"
                )
        _save(moments, path)
    return torch.load(path, weights_only=True)


def masks(name: str, models: int) -> np.ndarray:
    """``[models, n]`` bool."""
    n = len(BENCHES[name].corpus().train)
    return np.stack([subset_mask(n, 0.5, 0, j) for j in range(models)])


# benchmarks that differ only in their targets share their subset models (same data, model,
# recipe and seeds): one training writes both outputs
TWINS = {"text_gpt2": "text_gpt2_prompt", "text_gpt2_prompt": "text_gpt2"}


def _path(root: Path, name: str, j: int) -> Path:
    return root / name / "truth" / f"subset{j}_seed{1000 + j}.npy"


def _subset(args: tuple[str, int, Path]) -> None:
    name, j, root = args
    torch.set_num_threads(1)
    bench = BENCHES[name]
    idx = np.flatnonzero(masks(name, j + 1)[j])
    state = bench.train(idx, 1000 + j)[0]
    for other in (name, TWINS.get(name)):
        if other is not None:
            out = _path(root, other, j)
            out.parent.mkdir(parents=True, exist_ok=True)
            np.save(str(out) + ".tmp.npy", BENCHES[other].outputs(state))
            os.replace(str(out) + ".tmp.npy", out)


def truth(name: str, root: Path, models: int, procs: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """``(masks [models, n], outputs [models, m])``, training the subset models not cached."""
    paths = [_path(root, name, j) for j in range(models)]
    todo = [(name, j, root) for j, p in enumerate(paths) if not p.exists()]
    if todo:
        with Pool(procs) as pool:
            for _ in pool.imap_unordered(_subset, todo):
                pass
    return masks(name, models), np.stack([np.load(p) for p in paths])


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="train and cache checkpoints and subset models")
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    ap.add_argument("--only", default=",".join(BENCHES))
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--procs", type=int, default=2)
    a = ap.parse_args()
    for n in a.only.split(","):
        checkpoints(n, a.out)
        m, y = truth(n, a.out, a.models, a.procs)
        print(n, y.shape, flush=True)
