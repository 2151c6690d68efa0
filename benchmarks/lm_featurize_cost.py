"""Featurisation cost of the curvature candidates against trak_dist's default, side by side.

    python -m benchmarks.lm_featurize_cost [--bench syn_llama] [--rounds 3]

One checkpoint of an ``_lm_benches`` benchmark (its train set), one torch thread, variants
interleaved round by round, median of the rounds, in **CPU seconds of this process** (steadier
than wall time on a shared machine): the default (dense Rademacher p = 512 through trak_dist's
``Featurizer``, the hook engine), Kronecker rows at p, Kronecker rows plus the rows of a
sampled-label backward (the Fisher's G), and Kronecker rows plus the token-level Gram of the
same or of a sampled backward (``_lm_curvature.TokenKronecker``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks import _lm_curvature, _lm_truth
from benchmarks._lm_benches import BENCHES
from benchmarks._table import table
from trak_dist.featurize import build_featurizer
from trak_dist.gradients import HookGradientComputer
from trak_dist.tasks import resolve_task


def _batches(bench, size: int = 16) -> list[dict]:
    c = bench.corpus()
    return _lm_curvature._batches(c.train, c.train_labels(), size)


def dense(bench, state: dict, p: int, kind: str = "rademacher"):
    model = bench.model()
    model.load_state_dict(state)
    model.eval()
    f = build_featurizer(HookGradientComputer(model, resolve_task("causal_lm")), kind, p)
    batches = _batches(bench)
    f.featurize(batches[0], 0)  # warm-up: P's packed cache, the hook check

    def go() -> None:
        for b in batches:
            f.featurize(b, 0)

    return go


def fisher(bench, state: dict, p: int):
    """Kronecker rows of f, then of the sampled-label log-likelihood (the Fisher's G), each
    through trak_dist's own ``Featurizer`` (positions summed before the pairs are read)."""
    model = bench.model()
    model.load_state_dict(state)
    model.eval()
    rows = build_featurizer(HookGradientComputer(model, resolve_task("causal_lm")), "kronecker", p)
    sampled = _lm_curvature.SampledLM(torch.Generator().manual_seed(0))
    g = build_featurizer(HookGradientComputer(model, sampled), "kronecker", p)
    batches = _batches(bench)
    rows.featurize(batches[0], 0)
    g.project(batches[0], 0)

    def go() -> None:
        for b in batches:
            rows.featurize(b, 0)
            g.project(b, 0)

    return go


def token(bench, state: dict, p: int, sampled: bool, with_gram: bool = True):
    model = bench.model()
    model.load_state_dict(state)
    model.eval()
    task = (
        _lm_curvature.SampledLM(torch.Generator().manual_seed(0))
        if sampled
        else resolve_task("causal_lm")
    )
    comp = HookGradientComputer(model, task)
    rows = HookGradientComputer(model, resolve_task("causal_lm")) if sampled else comp
    from trak_dist.gradients import kronecker_views

    proj = _lm_curvature.TokenKronecker(
        comp.layout.grad_dim, p, 0, kronecker_views(model, comp.layout)
    )
    batches = _batches(bench)
    gram = torch.zeros(p, p, dtype=torch.float64)

    def one(c: HookGradientComputer, b: dict, keep: bool) -> None:
        ids = b["input_ids"]
        proj.begin(ids.shape[0], ids.shape[1])
        acc = torch.zeros(ids.shape[0], p)
        c.stream(b, lambda blocks: acc.add_(proj.project(blocks, 0)))
        if keep and with_gram:
            phi = proj.pos.reshape(-1, p)
            gram.add_((phi.T @ phi + proj.extra.T @ proj.extra).double())

    def go() -> None:
        for b in batches:
            one(rows, b, not sampled)
            if sampled:
                one(comp, b, True)

    one(rows, batches[0], False)
    return go


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lm_featurize_cost", description=__doc__)
    ap.add_argument("--bench", default="syn_llama")
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ps", default="512,2048")
    a = ap.parse_args()
    torch.set_num_threads(1)
    bench = BENCHES[a.bench]
    state = _lm_truth.checkpoints(a.bench, a.out)[-1]
    variants = {"default: dense p=512": dense(bench, state, 512)}
    for p in [int(x) for x in a.ps.split(",")]:
        variants[f"Kronecker p={p}"] = dense(bench, state, p, "kronecker")
        variants[f"Kronecker p={p} + sampled-label Fisher rows (2nd backward)"] = fisher(
            bench, state, p
        )
        variants[f"Kronecker p={p} + token Gram (same backward)"] = token(bench, state, p, False)
        variants[f"Kronecker p={p} + sampled-label token Gram"] = token(bench, state, p, True)
    variants.pop("dense p=512", None)
    secs: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(a.rounds):
        for k, go in variants.items():
            t0 = time.process_time()
            go()
            secs[k].append(time.process_time() - t0)
    base = statistics.median(secs["default: dense p=512"])
    rows = [
        [
            k,
            f"{statistics.median(v):.2f}",
            " / ".join(f"{x:.2f}" for x in v),
            f"{statistics.median(v) / base:.2f}",
        ]
        for k, v in secs.items()
    ]
    n = len(bench.corpus().train)
    print(f"{a.bench}: {n} train documents, 1 checkpoint, 1 thread, CPU seconds")
    print(table(["variant", "median CPU s", "rounds", "× default"], rows))


if __name__ == "__main__":
    main()
