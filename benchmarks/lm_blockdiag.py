"""Per-parameter (block-diagonal) curvature in the projected space (issue 29's untried
candidate): EK-FAC's own structure, where each parameter's curvature ignores every other's.

    python -m benchmarks.lm_blockdiag [--only syn_llama_prompt,syn_llama] [--models 60]

Per checkpoint: Kronecker rows at p = 2048 with ``share="concat"`` (parameter m owns ~p/M
columns of its own, so its block of GᵀG is its own projected Fisher), of trak_dist's f (train
and targets) and of the log-likelihood of labels drawn from the model (G, train); cached as
``concat<p>_c<i>.npz``. Scored as trak_dist does (``_lm_score``), LDS at λ auto (c = 1.25) and
at the best c of the grid, last checkpoint and the mean over the checkpoints:

- ``concat, full GᵀG``: the default's curvature on these columns;
- ``concat, block-diag GᵀG``: GᵀG with every block between two parameters set to zero;
- ``sum (the default)``: the pipeline's own columns (``share="sum"``), from ``lm_quality``'s
  cache when present.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import _lm_curvature, _lm_score, _lm_truth
from benchmarks._lm_benches import BENCHES, LMBench
from benchmarks._table import table
from trak_dist.gradients import HookGradientComputer, kronecker_views
from trak_dist.projection import KroneckerProjector
from trak_dist.tasks import resolve_task

P = 2048
AUTO_C = 1.25


class SizedConcat(KroneckerProjector):
    """``share="concat"`` with parameter m's columns in proportion to its size (at least
    ``MIN_COLUMNS``), not ~p/M each: a norm weight of 64 entries gets few, a 64 × 512 matrix
    many."""

    def _columns_of(self, index: int) -> tuple[int, int]:
        sizes = np.array([v.numel for v in self.views], dtype=np.float64)
        free = self.proj_dim - MIN_COLUMNS * len(sizes)
        widths = MIN_COLUMNS + np.floor(free * sizes / sizes.sum()).astype(np.int64)
        widths[np.argmax(sizes)] += self.proj_dim - int(widths.sum())
        start = int(widths[:index].sum())
        return start, start + int(widths[index])


MIN_COLUMNS = 4


def concat_rows(bench: LMBench, state: dict, model_id: int, p: int, sized: bool = False) -> dict:
    """X, T (``causal_lm``'s f) and G (sampled labels) with concat columns, and each column's
    parameter index."""
    torch.manual_seed(0)
    model = bench.model()
    model.load_state_dict(state)
    model.eval()
    c = bench.corpus()
    out: dict = {}
    t0 = time.perf_counter()
    for key, task, ids, labels in (
        ("X", resolve_task("causal_lm"), c.train, c.train_labels()),
        ("T", resolve_task("causal_lm"), c.targets, c.target_labels),
        (
            "G",
            _lm_curvature.SampledLM(torch.Generator().manual_seed(model_id)),
            c.train,
            c.train_labels(),
        ),
    ):
        comp = HookGradientComputer(model, task)
        views = kronecker_views(model, comp.layout)
        kind = SizedConcat if sized else KroneckerProjector
        proj = kind(comp.layout.grad_dim, p, 0, views, share="concat")
        scale = math.sqrt(comp.layout.grad_dim)
        rows = []
        for batch in _lm_curvature._batches(ids, labels, 16):
            acc = torch.zeros(batch["input_ids"].shape[0], p)
            comp.stream(batch, lambda bl, acc=acc, pr=proj: acc.add_(pr.project(bl, model_id)))
            rows.append(acc / scale)
        out[key] = torch.cat(rows).double().numpy()
    # every pass has the same parameters, so the same columns: the last projector's say whose
    owner = np.zeros(p, np.int64)
    for i in range(len(proj.views)):
        c0, c1 = proj._columns_of(i)
        owner[c0:c1] = i
    out["owner"] = owner
    out["seconds"] = time.perf_counter() - t0
    return out


def block_diagonal(k: np.ndarray, owner: np.ndarray) -> np.ndarray:
    return np.where(owner[:, None] == owner[None, :], k, 0.0)


def _block_scores(z: dict, n: int, per_block: bool, grid: np.ndarray) -> list[np.ndarray]:
    """Scores per c of the grid with K = block-diag GᵀG, inverted block by block (any p):
    λ_m = c · tr(K) / min(n, p) for every block, or (``per_block``) c · tr(K_m) / min(n, p_m);
    K⁻¹ rescaled by its mean |entry| as trak_dist does."""
    owner, p = z["owner"], z["X"].shape[1]
    parts = []
    total = 0.0
    for m in np.unique(owner):
        cols = owner == m
        g = z["G"][:, cols]
        e, v = np.linalg.eigh(g.T @ g)
        e = np.clip(e, 0, None)
        parts.append((e, v, z["X"][:, cols] @ v, z["T"][:, cols] @ v))
        total += e.sum()
    out = []
    for c in grid:
        s = np.zeros((z["X"].shape[0], z["T"].shape[0]))
        kinv_abs = 0.0
        for e, v, a, b in parts:
            unit = e.sum() / min(n, len(e)) if per_block else total / min(n, p)
            w = 1.0 / (e + c * unit + 1e-300)
            s += (a * w) @ b.T
            kinv_abs += np.abs((v * w) @ v.T).sum()
        out.append(s / (kinv_abs / p**2))
    return out


def block_curve(zs: list[dict], n: int, metric, per_block: bool) -> tuple[np.ndarray, np.ndarray]:
    grid = _lm_score.GRID
    per = [_block_scores(z, n, per_block, grid) for z in zs]
    last = np.array([metric(s) for s in per[-1]])
    mean = np.array([metric(np.mean([pc[i] for pc in per], 0)) for i in range(len(grid))])
    return last, mean


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lm_blockdiag", description=__doc__)
    ap.add_argument("--only", default="syn_llama_prompt,syn_llama,text_gpt2")
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    ap.add_argument("--sized-ps", default="", help="p's of the size-proportional concat")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in a.only.split(","):
        bench, root = BENCHES[name], a.out / name
        states = _lm_truth.checkpoints(name, a.out)
        metric = _lm_score.lds_metric(*_lm_truth.truth(name, a.out, a.models))

        n = len(bench.corpus().train)
        zs = []
        for i, st in enumerate(states):
            path = root / f"concat{P}_c{i}.npz"
            if not path.exists():
                np.savez(path, **concat_rows(bench, st, i, P))
            zs.append(dict(np.load(path)))
        variants = {
            "concat, full GᵀG": [_lm_score.Curv(z["X"], z["T"], z["G"].T @ z["G"], n) for z in zs],
            "concat, block-diag GᵀG": [
                _lm_score.Curv(z["X"], z["T"], block_diagonal(z["G"].T @ z["G"], z["owner"]), n)
                for z in zs
            ],
        }
        sums = [root / f"kron{P}_c{i}.npz" for i in range(len(states))]
        if all(s.exists() for s in sums):
            loaded = [np.load(s) for s in sums]
            variants["sum (the default), GᵀG"] = [
                _lm_score.Curv(z["X"], z["T"], z["G"].T @ z["G"], n) for z in loaded
            ]
        curves = {vname: _lm_score.curve(cvs, P, metric) for vname, cvs in variants.items()}
        for sp in [int(x) for x in a.sized_ps.split(",") if x]:
            sz = []
            for i, st in enumerate(states):
                path = root / f"sized{sp}_c{i}.npz"
                if not path.exists():
                    np.savez(path, **concat_rows(bench, st, i, sp, sized=True))
                sz.append(dict(np.load(path)))
            print(f"{name}: sized p={sp} featurising s: {[float(z['seconds']) for z in sz]}")
            for per_block in (False, True):
                lam = "λ per block" if per_block else "one λ"
                curves[f"sized concat p={sp}, block-diag, {lam}"] = block_curve(
                    sz, n, metric, per_block
                )
        for vname, (last, mean) in curves.items():
            g = _lm_score.GRID
            rows.append(
                [
                    name,
                    vname,
                    f"{_lm_score.at(last, AUTO_C):.3f}",
                    f"{last.max():.3f} ({g[last.argmax()]:.3g})",
                    f"{_lm_score.at(mean, AUTO_C):.3f}",
                    f"{mean.max():.3f} ({g[mean.argmax()]:.3g})",
                ]
            )
            print(" | ".join(rows[-1]), flush=True)
        print(f"{name}: featurising s per checkpoint: {[float(z['seconds']) for z in zs]}")
    head = ["benchmark", "curvature", "last, auto", "last, best (c)", "mean, auto"]
    head.append("mean, best (c)")
    print(table(head, rows))


if __name__ == "__main__":
    main()
