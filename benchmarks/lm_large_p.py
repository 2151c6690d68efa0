"""One LM benchmark's last checkpoint at a larger Kronecker p: XᵀX and the token-level Gram of
the same backward, LDS at λ auto and the best c (issue 29: does p alone close the gap?).

    python -m benchmarks.lm_large_p [--bench syn_llama_prompt] [--p 4096] [--models 60]

Uses ``_lm_curvature.collect_loglik(task="causal_lm")`` (trak_dist's f; cached as
``<out>/<bench>/tokf<p>_c<last>.npz``) and the subset models cached by ``_lm_truth``; the
curves join ``<out>/<bench>/curves.npz``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from benchmarks import _lm_curvature, _lm_score, _lm_truth
from benchmarks._lm_benches import BENCHES


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lm_large_p", description=__doc__)
    ap.add_argument("--bench", default="syn_llama_prompt")
    ap.add_argument("--p", type=int, default=4096)
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    bench, root = BENCHES[a.bench], a.out / a.bench
    states = _lm_truth.checkpoints(a.bench, a.out)
    masks, outputs = _lm_truth.truth(a.bench, a.out, a.models)
    last = len(states) - 1
    path = root / f"tokf{a.p}_c{last}.npz"
    if not path.exists():
        np.savez(
            path, **_lm_curvature.collect_loglik(bench, states[-1], last, a.p, task="causal_lm")
        )
    z = dict(np.load(path))
    c = bench.corpus()
    n, tokens = len(c.train), int((c.train != 0).sum() / len(c.train))
    curves = {}
    for fam, k, rank in [("kron_tok_f", z["H"], n * tokens), ("kron_xtx", z["X"].T @ z["X"], n)]:
        lds_last, _ = _lm_score.curve(
            [_lm_score.Curv(z["X"], z["T"], k, rank)],
            a.p,
            lambda s: _lm_score.lds(s, masks, outputs),
        )
        curves[f"{a.bench}|{fam}|{a.p}"] = np.stack([lds_last, lds_last])
        best = _lm_score.GRID[lds_last.argmax()]
        print(
            f"{a.bench} {fam} p={a.p} last checkpoint: auto {_lm_score.at(lds_last, 1.25):.3f}, "
            f"best {lds_last.max():.3f} (c = {best:.3g}), largest c {lds_last[-1]:.3f}"
        )
    done = root / "curves.npz"
    merged = dict(np.load(done)) if done.exists() else {"grid": _lm_score.GRID}
    merged.update(curves)
    np.savez(done, **merged)


if __name__ == "__main__":
    main()
