"""The winning candidate alone on more benchmarks: trak_dist's default, Kronecker rows with the
sampled-label Fisher as curvature, and kronfluence EK-FAC (issue 29).

    python -m benchmarks.lm_fisher --only text_gpt2,text_gpt2_prompt --models 60

Per checkpoint: Kronecker rows of trak_dist's f (train and targets) and of the log-likelihood
of labels drawn from the model (G, train), no token Grams (``_lm_curvature.collect_loglik``,
cached as ``fisher<p>_c<i>.npz``); K = GᵀG, λ = c · tr(K) / min(n, p). The default and EK-FAC
come from ``lm_quality``'s caches (computed here when missing).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from benchmarks import _lm_curvature, _lm_score, _lm_truth
from benchmarks._lm_benches import BENCHES
from benchmarks._table import table
from benchmarks.lm_quality import kronfluence, trak_dense

P = 2048


def fisher_pass(name: str, out: Path, states: list) -> list[dict]:
    bench, root = BENCHES[name], out / name
    got = []
    for i, st in enumerate(states):
        path = root / f"fisher{P}_c{i}.npz"
        if not path.exists():
            rows = _lm_curvature.collect_loglik(bench, st, i, P, task="causal_lm", with_gram=False)
            g = _lm_curvature.collect_loglik(bench, st, i, P, task="sampled", with_gram=False)
            np.savez(path, X=rows["X"], T=rows["T"], G=g["X"])
        got.append(dict(np.load(path)))
    return got


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lm_fisher", description=__doc__)
    ap.add_argument("--only", default="text_gpt2,text_gpt2_prompt")
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in a.only.split(","):
        bench, root = BENCHES[name], a.out / name
        states = _lm_truth.checkpoints(name, a.out)
        metric = _lm_score.lds_metric(*_lm_truth.truth(name, a.out, a.models))

        s512, _ = trak_dense(bench, states, root, 512)
        rows.append([name, "trak_dist default: dense, λ auto", 512, "-", f"{metric(s512):.3f}"])
        n = len(bench.corpus().train)
        z = fisher_pass(name, a.out, states)
        for p in (512, P):
            cv = [_lm_score.Curv(d["X"], d["T"], d["G"].T @ d["G"], n) for d in z]
            last, mean = _lm_score.curve(cv, p, metric)
            rows.append(
                [
                    name,
                    "Kronecker + sampled Fisher, λ auto",
                    p,
                    f"{_lm_score.at(last, 1.25):.3f}",
                    f"{_lm_score.at(mean, 1.25):.3f}",
                ]
            )
        mats, _ = kronfluence(bench, states, root, "ekfac")
        rows.append(
            [
                name,
                "kronfluence EK-FAC",
                "full",
                f"{metric(mats[-1]):.3f}",
                f"{metric(np.mean(mats, 0)):.3f}",
            ]
        )
        print(table(["benchmark", "method", "p", "LDS last", "LDS mean"], rows[-4:]), flush=True)
    print(table(["benchmark", "method", "p", "LDS last", "LDS mean"], rows))


if __name__ == "__main__":
    main()
