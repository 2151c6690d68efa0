"""Attribution quality on causal LMs (issue 29): trak_dist against kronfluence, one table.

    python -m benchmarks.lm_quality                         # every benchmark; cached under --out
    python -m benchmarks.lm_quality --only syn_llama --models 60

For each benchmark of ``benchmarks._lm_benches`` (Llama and GPT-2 from configs, synthetic and
packaged text, targets with and without prompts), on the same 3 checkpoints (snapshots of one
run) and the same subset models (``_lm_truth``: α = 0.5, cached per benchmark, subset and seed):

- trak_dist's default through ``TRAKer`` (dense Rademacher, p = 512, λ auto), and dense at
  p = 2048; their featurisation seconds (train set, 3 checkpoints, one process);
- prototypes from one Kronecker pass per checkpoint (``_lm_curvature``): TRAK's XᵀX, the
  token-level Gram of the same backward (``tok_f``), and with labels sampled from the model the
  sequence-level Fisher (``fisher``) and its token-level Gram (``tok_s``), at p ∈ {512,
  2048}, λ = c · tr(K) / min(rank, p) over a grid of c (``_lm_score``); and rows of the
  documents' log-likelihood (``loglik``: each token's margin gradient weighted by its own
  1 − p_t, the loss gradient) with XᵀX or their token-level Gram;
- kronfluence 1.0.1 identity, KFAC and EK-FAC (full gradients; ``_lm_peers``), per checkpoint.

LDS on the last checkpoint and on the mean over the 3 (as trak_dist averages them). Everything
expensive is cached under ``--out``; the curves go to ``<out>/<benchmark>/curves.npz`` for
the λ rule (``benchmarks.lambda_lobo``). Run under ``nice``: it keeps two cores busy for long.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import _lm_curvature, _lm_score, _lm_truth
from benchmarks._facts_bench import FactsBench
from benchmarks._lm_benches import BENCHES, LMBench
from benchmarks._table import table
from trak_dist import TRAKer
from trak_dist.store import FeatureStore

PMAX = 2048
PS = (512, 2048)
AUTO_C = 1.25
HEADER = [
    "benchmark",
    "method",
    "p",
    "checkpoints",
    "last: λ auto",
    "last: best λ",
    "mean: λ auto",
    "mean: best λ (c)",
]


def _f(x: float) -> str:
    return f"{x:.3f}"


def _json(path: Path, make):
    if not path.exists():
        path.write_text(json.dumps(make()))
    return json.loads(path.read_text())


def _docs(ids: torch.Tensor, labels: torch.Tensor, b0: int, b1: int) -> dict:
    i = ids[b0:b1]
    return {"input_ids": i, "attention_mask": (i != 0).long(), "labels": labels[b0:b1]}


def trak_dense(bench: LMBench, states: list, root: Path, p: int) -> tuple[np.ndarray, float]:
    """trak_dist's TRAKer (dense, λ auto) at ``p``: scores over the 3 checkpoints and the
    train featurisation seconds."""
    path = root / f"trak_dense{p}.zarr"

    def make() -> dict:
        c = bench.corpus()
        n, m = len(c.train), len(c.targets)
        t = TRAKer(
            model=bench.model(),
            task="causal_lm",
            train_set_size=n,
            save_dir=path,
            device="cpu",
            proj_dim=p,
            logging_level=logging.ERROR,
            overwrite=True,
        )
        secs = 0.0
        for i, st in enumerate(states):
            t0 = time.perf_counter()
            t.load_checkpoint(st, model_id=i)
            for b in range(0, n, 64):
                t.featurize(_docs(c.train, c.train_labels(), b, b + 64), num_samples=min(64, n - b))
            secs += time.perf_counter() - t0
        t.finalize_features()
        for i, st in enumerate(states):
            t.start_scoring_checkpoint("targets", st, i, m)
            t.score(_docs(c.targets, c.target_labels, 0, m), num_samples=m)
        np.save(root / f"trak_dense{p}_scores.npy", t.finalize_scores("targets"))
        return {"featurize_s": secs}

    info = _json(root / f"trak_dense{p}.json", make)
    return np.load(root / f"trak_dense{p}_scores.npy"), info["featurize_s"]


def kron_pass(bench: LMBench, states: list, root: Path) -> list[dict]:
    """``_lm_curvature.collect`` per checkpoint at PMAX, cached as npz."""
    out = []
    for i, st in enumerate(states):
        path = root / f"kron{PMAX}_c{i}.npz"
        if not path.exists():
            col = _lm_curvature.collect(bench, st, i, PMAX)
            np.savez(
                path,
                X=col.X,
                T=col.T,
                G=col.G,
                H_f=col.H_f,
                H_s=col.H_s,
                seconds=json.dumps(col.seconds),
            )
        z = np.load(path)
        out.append(
            {k: z[k] for k in z.files if k != "seconds"}
            | {"seconds": json.loads(str(z["seconds"]))}
        )
    return out


def loglik_pass(bench: LMBench | FactsBench, states: list, root: Path) -> list[dict]:
    """``_lm_curvature.collect_loglik`` per checkpoint at PMAX, cached as npz."""
    out = []
    for i, st in enumerate(states):
        path = root / f"loglik{PMAX}_c{i}.npz"
        if not path.exists():
            np.savez(path, **_lm_curvature.collect_loglik(bench, st, i, PMAX))
        out.append(dict(np.load(path)))
    return out


def dense_rows(root: Path, p: int, ckpts: int) -> list[tuple[np.ndarray, np.ndarray]]:
    store = FeatureStore.open(root / f"trak_dense{p}.zarr")
    n, m = store.spec.train_size, None
    out = []
    for c in range(ckpts):
        x = store.train_rows(c).read(0, n, p).astype(np.float64)
        tr = store.target_rows("targets", c)
        out.append((x, tr.read(0, tr.n, p).astype(np.float64)))
    del m
    return out


def kronfluence(bench: LMBench, states: list, root: Path, strategy: str) -> tuple[list, float]:
    """kronfluence ``strategy``'s ``[n, m]`` scores per checkpoint (cached under ``root``) and
    the mean seconds of one checkpoint (factors + scores)."""
    from benchmarks import _lm_peers

    mats, secs = [], []
    for i, st in enumerate(states):
        path = root / f"kf_{strategy}_c{i}.npy"
        info = root / f"kf_{strategy}_c{i}.json"
        if not path.exists():
            s, tf, ts = _lm_peers.scores(bench, st, strategy)
            np.save(path, s)
            info.write_text(json.dumps({"factor_s": tf, "score_s": ts}))
        mats.append(np.load(path))
        t = json.loads(info.read_text())
        secs.append(t["factor_s"] + t["score_s"])
    return mats, float(np.mean(secs))


def curvatures(passes: list[dict], n: int, tokens: int) -> dict[str, list[_lm_score.Curv]]:
    out: dict[str, list[_lm_score.Curv]] = {}
    for z in passes:
        x, t = z["X"], z["T"]
        for name, k, rank in [
            ("xtx", x.T @ x, n),
            ("tok_f", z["H_f"], n * tokens),
            ("fisher", z["G"].T @ z["G"], n),
            ("tok_s", z["H_s"], n * tokens),
        ]:
            out.setdefault(name, []).append(_lm_score.Curv(x, t, k, rank))
    return out


def run_bench(
    name: str, out: Path, models: int, peers: bool, loglik: bool = True
) -> tuple[list, dict]:
    root = out / name
    if name == "facts":  # fact retrieval: the MRR of the stating document
        bench: LMBench | FactsBench = FactsBench(out)
        states = bench.states()
        metric = bench.mrr
    else:
        bench = BENCHES[name]
        states = _lm_truth.checkpoints(name, out)
        masks, outputs = _lm_truth.truth(name, out, models)

        def metric(s: np.ndarray) -> float:
            return _lm_score.lds(s, masks, outputs)

    c = bench.corpus()
    n, tokens = len(c.train), int((c.train != 0).sum() / len(c.train))
    rows = []
    done = root / "curves.npz"
    curves: dict = {}
    if done.exists():  # a rerun prints the table from the cached curves
        z = np.load(done)
        curves = {(k.split("|")[1], int(k.split("|")[2])): tuple(z[k]) for k in z.files if "|" in k}

    k = len(states)
    s512, _ = trak_dense(bench, states, root, 512)
    rows.append([name, "trak_dist default: dense, λ auto", 512, k, "-", "-", _f(metric(s512)), "-"])
    s2k, _ = trak_dense(bench, states, root, 2048)
    rows.append([name, "trak_dist dense, λ auto", 2048, k, "-", "-", _f(metric(s2k)), "-"])
    dense = dense_rows(root, 2048, len(states))
    for p in (512, 2048):
        if ("dense_xtx", p) not in curves:
            cv = [_lm_score.Curv(x, t, x[:, :p].T @ x[:, :p], n) for x, t in dense]
            curves[("dense_xtx", p)] = _lm_score.curve(cv, p, metric)

    passes = kron_pass(bench, states, root)
    for cname, cvs in curvatures(passes, n, tokens).items():
        for p in PS:
            if (f"kron_{cname}", p) not in curves:
                curves[(f"kron_{cname}", p)] = _lm_score.curve(cvs, p, metric)
    lls = loglik_pass(bench, states, root) if loglik else []
    for fam in ("xtx", "tok") if loglik else ():
        for p in PS:
            if (f"loglik_{fam}", p) not in curves:
                cvs = [
                    _lm_score.Curv(z["X"], z["T"], z["X"].T @ z["X"], n)
                    if fam == "xtx"
                    else _lm_score.Curv(z["X"], z["T"], z["H"], n * tokens)
                    for z in lls
                ]
                curves[(f"loglik_{fam}", p)] = _lm_score.curve(cvs, p, metric)
    for (cname, p), (last, mean) in curves.items():
        best = f"{mean.max():.3f} (c = {_lm_score.GRID[mean.argmax()]:.3g})"
        auto_last, auto_mean = _lm_score.at(last, AUTO_C), _lm_score.at(mean, AUTO_C)
        rows.append([name, cname, p, k, _f(auto_last), _f(last.max()), _f(auto_mean), best])
    if peers:
        for strat in ("identity", "kfac", "ekfac"):
            mats, _ = kronfluence(bench, states, root, strat)
            last, mean = metric(mats[-1]), metric(np.mean(mats, 0))
            rows.append([name, f"kronfluence {strat}", "full", k, _f(last), "-", _f(mean), "-"])
    return rows, curves


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lm_quality", description=__doc__)
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    ap.add_argument("--only", default=",".join([*BENCHES, "facts"]))
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-loglik", action="store_true", help="skip the log-likelihood rows")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in a.only.split(","):
        r, cv = run_bench(name, a.out, a.models, not a.no_peers, not a.no_loglik)
        rows += r
        np.savez(
            a.out / name / "curves.npz",
            grid=_lm_score.GRID,
            **{f"{name}|{k}|{p}": np.stack(v) for (k, p), v in cv.items()},
        )
        print(table(HEADER, r), flush=True)
    print(table(HEADER, rows))


if __name__ == "__main__":
    main()
