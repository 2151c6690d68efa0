"""trak_dist's pipeline itself on the causal-LM benchmarks (issue 29): today's default against
the sampled-label Fisher curvature (``featurize.curvature=fisher``), and the peers (kronfluence,
Bergson), on the same checkpoints and cached subset models, in one table.

    python -m benchmarks.lm_pipeline --only syn_llama,syn_llama_prompt --models 60
    python -m benchmarks.lm_pipeline --peers   # + kronfluence and Bergson (requirements-peers)

Per benchmark, two stores written by ``run_pipeline`` on the in-process executor (one thread):

- ``before``: the default before issue 29 (dense Rademacher, p = 512, XᵀX, λ auto);
- ``fisher``: Kronecker rows featurised once at p = 2048 with the sampled-label Fisher's rows G
  (K = GᵀG), scored at p ∈ {512, 1024, 2048} (prefix property) with λ auto and the default
  ``scoring.kinv_scaling`` (``auto``: ``per_target`` here, ``mean_abs`` for ``before``);
- ``fisher<D>`` (``--draws D``): the same with ``featurize.fisher_draws=D`` label draws per row.

The pipeline's own scores (mean over the checkpoints) give "mean: λ auto"; the last checkpoint
and the λ curves (c · tr(K) / min(r, p), r = ``scoring.rank_bound``, on ``_lm_score.GRID``,
saved as ``<out>/<benchmark>/pipeline_curves.npz``) are computed from the stored X, targets
and K by ``_lm_score`` (the same formula; its value at c = 1.25 is checked against the
pipeline's).
Featurisation cost: CPU seconds of the train shards (``ShardResult.cpu_seconds``), both stores
side by side; and each store's whole run (``phases["total"]``: featurise, reduce, score at
every p) in wall seconds per checkpoint, the peers' unit.
With ``--peers``, the peers on the same checkpoints and subset models, in the same table:
kronfluence 1.0.1's identity, KFAC and EK-FAC (``kronfluence`` below) and Bergson 2.5.1's
EK-FAC, TrackStar and TRAK (``_bergson_peers``), their cost as wall seconds of one checkpoint's
whole pipeline; without it, kronfluence's EK-FAC from the cache if it is there.
Subset models are only read here (``_lm_truth`` trains them); a benchmark with fewer cached
models than ``--models`` uses those it has.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch

from benchmarks import _lm_score, _lm_truth
from benchmarks._facts_bench import FactsBench
from benchmarks._lm_benches import BENCHES, LMBench
from benchmarks._table import table
from trak_dist.config import (
    ClusterConfig,
    DataConfig,
    FeaturizeConfig,
    JobConfig,
    ModelConfig,
    ProjectionConfig,
    StoreConfig,
    TaskConfig,
)
from trak_dist.pipeline import InProcessExecutor, run_pipeline
from trak_dist.scoring import rank_bound, resolve_kinv_scaling
from trak_dist.store import FeatureStore, subset_mask, variant_name

PS = (512, 1024, 2048)
AUTO_C = 1.25


class Docs(torch.utils.data.Dataset):
    """Token ids ``[N, T]`` (0 = padding, on the right) and labels as dict items."""

    def __init__(self, ids: torch.Tensor, labels: torch.Tensor) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": self.labels[i]}


def cached_truth(name: str, root: Path, models: int) -> tuple[np.ndarray, np.ndarray]:
    """``(masks, outputs)`` of the cached subset models among the first ``models`` (none are
    trained here; one a stopped run did not finish is left out)."""
    n = len(BENCHES[name].corpus().train)
    found = [
        (j, path)
        for j in range(models)
        if (path := root / name / "truth" / f"subset{j}_seed{1000 + j}.npy").exists()
    ]
    masks = np.stack([subset_mask(n, 0.5, 0, j) for j, _ in found])
    return masks, np.stack([np.load(path) for _, path in found])


def draws_of(variant: str) -> int:
    """Label draws per row of a variant: D for ``fisher<D>``, 1 for ``fisher`` and the rest."""
    return int(variant.removeprefix("fisher") or 1) if variant.startswith("fisher") else 1


def job(
    bench: LMBench | FactsBench,
    ckpts: list[Path],
    store: Path,
    variant: str,
    micro_batch: int = 64,
    overwrite: bool = True,
) -> JobConfig:
    c = bench.corpus()
    fisher = variant.startswith("fisher")
    draws = draws_of(variant)
    return JobConfig(
        proj_dim=PS[-1] if fisher else 512,
        lambda_reg="auto",
        model=ModelConfig(factory=bench.model, checkpoints=[str(p) for p in ckpts]),
        data=DataConfig(
            train=Docs(c.train, c.train_labels()),
            targets=Docs(c.targets, c.target_labels),
            train_fingerprint=f"{bench.name}-train",
        ),
        task=TaskConfig(name="causal_lm"),
        projection=ProjectionConfig(kind="kronecker" if fisher else "rademacher"),
        featurize=FeaturizeConfig(
            micro_batch=micro_batch,
            curvature="fisher" if fisher else "xtx",
            fisher_draws=draws,
            device="cpu",
        ),
        store=StoreConfig(path=str(store), overwrite=overwrite),
        cluster=ClusterConfig(num_workers=1),
        progress=False,
        report=None,
    )


def run_store(bench: LMBench | FactsBench, ckpts: list[Path], root: Path, variant: str) -> dict:
    """Featurise and score ``variant`` (cached: ``<variant>.json`` beside its store; a cached
    store is resumed, which featurises nothing and rescores only a variant whose λ or plan
    changed, e.g. after a change of the auto rule)."""
    info_path = root / f"pipeline_{variant}.json"
    store = root / f"pipeline_{variant}.zarr"
    ps = PS if variant.startswith("fisher") else (512,)
    if info_path.exists():
        cfg = job(bench, ckpts, store, variant, overwrite=False)
        run_pipeline(cfg, InProcessExecutor(), [(p, "auto") for p in ps])
        return json.loads(info_path.read_text())
    shutil.rmtree(store, ignore_errors=True)
    cfg = job(bench, ckpts, store, variant)
    cpu = {"train": 0.0, "target": 0.0}

    def on_shard(result) -> None:  # type: ignore[no-untyped-def]
        cpu[result.task.kind] += result.cpu_seconds

    result = run_pipeline(cfg, InProcessExecutor(), [(p, "auto") for p in ps], on_shard)
    info = {"cpu": cpu, "phases": result.phases, "ps": list(ps)}
    info_path.write_text(json.dumps(info))
    return info


def stored_curvatures(store_path: Path) -> list[_lm_score.Curv]:
    store = FeatureStore.open(store_path, mode="r")
    n, rank = store.spec.train_size, rank_bound(store.spec)
    out = []
    for c in store.checkpoint_ids():
        x = store.train_rows(c).read(0, n).astype(np.float64)
        ts = store.target_rows("targets", c)
        k = store.read_xtx(c)
        assert k is not None
        t = ts.read(0, ts.n).astype(np.float64)
        out.append(_lm_score.Curv(x, t, k, rank))
    return out


def bench_rows(
    name: str, root: Path, models: int, draws: tuple[int, ...] = (), peers: bool = False
) -> tuple[list[list[str]], dict]:
    broot = root / name
    if name == "facts":  # fact retrieval: the MRR of the stating document, no subset models
        facts = FactsBench(root)
        bench: LMBench | FactsBench = facts
        states = facts.states()
    else:
        bench = BENCHES[name]
        states = _lm_truth.checkpoints(name, root)
    ckpts = []
    for i, st in enumerate(states):
        path = broot / f"ckpt{i}.pt"
        if not path.exists():
            torch.save(st, path)
        ckpts.append(path)
    if name == "facts":
        outputs = np.zeros((0,))

        def metric(s: np.ndarray) -> float:
            return facts.mrr(s)

    else:
        masks, outputs = cached_truth(name, root, models)

        def metric(s: np.ndarray) -> float:
            return _lm_score.lds(s, masks, outputs)

    rows, curves = [], {}
    variants = ("before", "fisher", *(f"fisher{d}" for d in draws))
    infos = {v: run_store(bench, ckpts, broot, v) for v in variants}
    base_cpu = infos["before"]["cpu"]["train"]
    for variant, info in infos.items():
        store_path = broot / f"pipeline_{variant}.zarr"
        store = FeatureStore.open(store_path, mode="r")
        cvs = stored_curvatures(store_path)
        # the job's kinv_scaling=auto as resolved (per_target for the Fisher, mean_abs before)
        scaling = resolve_kinv_scaling("auto", store.spec)
        for p in info["ps"]:
            sset = store.score_set("targets", variant_name(p, "auto", scaling))
            assert sset is not None
            piped = metric(sset.scores())
            last, mean = _lm_score.curve(cvs, p, metric, scaling=scaling)
            curves[f"{name}|{variant}|{p}|last"], curves[f"{name}|{variant}|{p}|mean"] = last, mean
            what = (
                "default before: dense, XᵀX"
                if variant == "before"
                else f"Kronecker, sampled-label Fisher GᵀG ({variant}), {scaling}"
            )
            cost = info["cpu"]["train"] / base_cpu
            best = int(np.argmax(mean))
            rows.append(
                [
                    name,
                    what,
                    str(p),
                    str(len(cvs)),
                    f"{_lm_score.at(last, AUTO_C):.3f}",
                    f"{piped:.3f} ({_lm_score.at(mean, AUTO_C):.3f})",
                    f"{mean[best]:.3f} ({_lm_score.GRID[best]:.3g})",
                    f"{info['cpu']['train']:.1f} ({cost:.2f}×)",
                    f"{info['phases']['total'] / len(ckpts):.1f}",
                    str(len(outputs)) if name != "facts" else "MRR",
                ]
            )
    rows += peer_rows(name, bench, states, broot, metric, peers)
    return rows, curves


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


def peer_rows(  # type: ignore[no-untyped-def]
    name: str,
    bench: LMBench | FactsBench,
    states: list,
    broot: Path,
    metric,
    peers: bool,
) -> list[list[str]]:
    """The peers' rows: with ``peers``, kronfluence's identity, KFAC and EK-FAC and Bergson's
    EK-FAC, TrackStar and TRAK (both installed from ``benchmarks/requirements-peers.txt``; run
    once, cached under ``broot``); without, kronfluence's EK-FAC from the cache, if there.
    Their cost: wall seconds of a checkpoint's whole pipeline (curvature, queries, scoring;
    for Bergson also its process start, about 5 s)."""
    from benchmarks._lm_peers import STRATEGIES

    kf = [(f"kronfluence {s}", "full", kronfluence, s) for s in STRATEGIES]
    if not peers:
        cached = (broot / "kf_ekfac_c0.npy").exists()
        runs = [r for r in kf if r[3] == "ekfac"] if cached else []
    else:
        from benchmarks import _bergson_peers

        bg = [
            (f"bergson {m}", p, _bergson_peers.scores, m) for m, p in _bergson_peers.SKETCH.items()
        ]
        runs = kf + bg
    rows = []
    for label, sketch, run, method in runs:
        mats, secs = run(bench, states, broot, method)
        last, mean = metric(mats[-1]), metric(np.mean(mats, 0))
        rows.append(
            [name, label, sketch, str(len(mats)), f"{last:.3f}", f"{mean:.3f}", "-",
             "-", f"{secs:.1f}", "-"]
        )  # fmt: skip
    return rows


HEADER = [
    "benchmark",
    "method",
    "p",
    "ckpts",
    "last: λ auto",
    "mean: λ auto, pipeline (offline)",
    "mean: best λ (c)",
    "train featurise CPU s (× before)",
    "whole pipeline wall s / ckpt",
    "subset models",
]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lm_pipeline", description=__doc__)
    ap.add_argument("--only", default="syn_llama,syn_llama_prompt,text_gpt2,text_gpt2_prompt")
    ap.add_argument("--models", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(".lds_bench/lm"))
    ap.add_argument(
        "--draws",
        default="",
        help="also featurise with featurize.fisher_draws = each of these (e.g. 2,4): stores "
        "pipeline_fisher<D>.zarr, curves as variant 'fisher<D>'",
    )
    ap.add_argument(
        "--peers",
        action="store_true",
        help="also run kronfluence's identity, KFAC, EK-FAC and Bergson's EK-FAC, TrackStar, "
        "TRAK (install benchmarks/requirements-peers.txt first)",
    )
    a = ap.parse_args()
    draws = tuple(int(d) for d in a.draws.split(",") if d)
    torch.set_num_threads(1)
    rows: list[list[str]] = []
    for name in a.only.split(","):
        got, curves = bench_rows(name, a.out, a.models, draws, a.peers)
        np.savez(a.out / name / "pipeline_curves.npz", **curves)
        rows += got
        print(table(HEADER, got), flush=True)
    print(table(HEADER, rows))


if __name__ == "__main__":
    main()
