"""How many label draws the sampled-label Fisher needs (issue 29, measured offline).

    python -m benchmarks.lm_fisher_draws [--only syn_llama_prompt,text_gpt2] [--draws 8]

The causal-LM default's K = GᵀG takes one label per counted token, drawn from the model
(``featurize.curvature=fisher``): an unbiased but noisy estimate of the token-level Fisher.
Here the same X, T and Kronecker projection (p = 2048, seed 0, the default's) are scored with
K from each single draw and from the mean of D draws, K_D = (1/D) Σ_d G_dᵀG_d (each draw one
more backward over the train set), λ auto and ``per_target`` as the default scores. The spread
of the single draws is what one draw leaves to chance; the gain of K_D is what averaging buys.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from benchmarks import _lm_score, _lm_truth
from benchmarks._lm_benches import BENCHES, LMBench
from benchmarks._lm_curvature import SampledLM, loaded, projected_rows
from benchmarks._table import table
from benchmarks.lm_pipeline import cached_truth
from trak_dist.gradients import HookGradientComputer, kronecker_views
from trak_dist.projection import KroneckerProjector
from trak_dist.tasks import resolve_task

P = 2048
AUTO_C = 1.25


def collect(bench: LMBench, state: dict, model_id: int, draws: int, micro: int = 16) -> dict:
    """``X`` ``[n, P]``, ``T`` ``[m, P]`` and ``Gs`` (one ``[n, P]`` per draw) of a checkpoint."""
    model = loaded(bench, state)
    c = bench.corpus()
    comp_f = HookGradientComputer(model, resolve_task("causal_lm"))
    proj = KroneckerProjector(comp_f.layout.grad_dim, P, 0, kronecker_views(model, comp_f.layout))

    def rows(comp: HookGradientComputer, ids: Tensor, labels: Tensor) -> np.ndarray:
        return projected_rows(comp, proj, ids, labels, model_id, micro)

    gs = []
    for d in range(draws):
        gen = torch.Generator().manual_seed(model_id + 1000 * d)
        gs.append(rows(HookGradientComputer(model, SampledLM(gen)), c.train, c.train_labels()))
    return {
        "X": rows(comp_f, c.train, c.train_labels()),
        "T": rows(comp_f, c.targets, c.target_labels),
        "Gs": gs,
    }


HEADER = ["benchmark", "K from", "last: λ auto", "mean: λ auto", "mean: best (c)"]


def bench_rows(name: str, draws: int, root: Path, models: int) -> list[list[str]]:
    metric = _lm_score.lds_metric(*cached_truth(name, root, models))
    states = _lm_truth.checkpoints(name, root)
    t0 = time.perf_counter()
    got = [collect(BENCHES[name], st, i, draws) for i, st in enumerate(states)]
    print(f"{name}: {draws} draws in {time.perf_counter() - t0:.0f} s", flush=True)
    n = got[0]["X"].shape[0]
    grams = [[g.T @ g for g in one["Gs"]] for one in got]

    def row(label: str, ks: list[np.ndarray]) -> list[str]:
        cvs = [
            _lm_score.Curv(one["X"], one["T"], k, max(n, P)) for one, k in zip(got, ks, strict=True)
        ]
        last, mean = _lm_score.curve(cvs, P, metric, scaling="per_target")
        return [name, label, *_lm_score.cells(last, mean, AUTO_C)]

    out = [row(f"draw {d}", [gr[d] for gr in grams]) for d in range(draws)]
    d = 2
    while d <= draws:
        out.append(row(f"mean of {d} draws", [sum(gr[:d]) / d for gr in grams]))
        d *= 2
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lm_fisher_draws", description=__doc__)
    ap.add_argument("--only", default="syn_llama_prompt,syn_llama,text_gpt2,text_gpt2_prompt")
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows: list[list[str]] = []
    for name in a.only.split(","):
        got = bench_rows(name, a.draws, a.out, a.models)
        print(table(HEADER, got), flush=True)
        rows += got
    print(table(HEADER, rows))


if __name__ == "__main__":
    main()
