"""Are the stored bits the same as another checkout's? Four jobs, every array of their stores
hashed, two runs compared array by array.

    python -m benchmarks.bitwise run OUT [--inputs DIR] [--jobs default,slurm,hf,traker]
    python -m benchmarks.bitwise compare REF OUT [--pair default=inprocess]

``run`` runs each job into ``OUT/<job>.zarr`` and writes ``OUT/digests.json`` (sha256 of every
Zarr array's values); ``compare`` prints one row per job and exits 1 when a shared array
differs. The jobs: ``default`` (``trak-dist``, the digits example on a local Ray), ``inprocess``
(the same with ``cluster=inprocess``, where that exists), ``slurm`` (``trak-dist-slurm array``:
2 shard tasks, reduce, 3 score tasks, merge; ``--local`` where ``sbatch`` is missing), ``hf``
(``model=hf data=text task=causal_lm`` on two GPT-2 checkpoint directories; dense Rademacher
with XᵀX pinned where the code has the causal-LM defaults of issue 29) and ``traker``
(traker's quickstart through ``trak_dist.TRAKer`` on the digits). Inputs (checkpoints, text
files) are made once under ``--inputs`` and shared, so both runs read the same files.

It drives only the CLI and ``trak_dist.TRAKer`` and reads the stores with ``zarr`` itself, so
it runs unchanged against an older checkout: put that checkout first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import zarr

JOBS = ("default", "inprocess", "slurm", "hf", "traker")
TRAKER = """
import sys, torch
from trak_dist import TRAKer
from trak_dist.examples import digits
torch.set_num_threads(1)
train, targets = digits.train_set(), digits.target_set()
x, y = train.tensors
xt, yt = targets.tensors
t = TRAKer(model=digits.make_model(), task="image_classification", train_set_size=len(x),
           save_dir=sys.argv[1], device="cpu", proj_dim=256)
for i, path in enumerate(digits.checkpoints()):
    t.load_checkpoint(torch.load(path, weights_only=True), model_id=i)
    for b in range(0, len(x), 100):
        t.featurize(batch=(x[b:b + 100], y[b:b + 100]), num_samples=len(x[b:b + 100]))
t.finalize_features()
for i, path in enumerate(digits.checkpoints()):
    t.start_scoring_checkpoint("quickstart", torch.load(path, weights_only=True), model_id=i,
                               num_targets=len(xt))
    t.score(batch=(xt, yt), num_samples=len(xt))
print(t.finalize_scores(exp_name="quickstart").shape)
"""


def digests(path: Path) -> dict[str, str]:
    """sha256 of the values (dtype, shape, bytes) of every array under the store at ``path``."""
    out = {}
    root = zarr.open_group(str(path), mode="r")
    for name, node in sorted(root.members(max_depth=None)):
        if isinstance(node, zarr.Array):
            values = np.ascontiguousarray(node[...])
            h = hashlib.sha256(f"{values.dtype}{values.shape}".encode())
            h.update(values.tobytes())
            out[name] = h.hexdigest()
    return out


def hf_inputs(inputs: Path) -> list[Path]:
    ckpts = [inputs / "llm" / f"c{k}" for k in range(2)]
    if not all(c.is_dir() for c in ckpts):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.fixtures import llm_models

        (inputs / "llm").mkdir(parents=True, exist_ok=True)
        ckpts = llm_models.checkpoints(inputs / "llm", "gpt2", num=2)
    return ckpts


def lm_pins(env: dict[str, str]) -> list[str]:
    """The overrides that keep the hf job the one measured before issue 29 (dense Rademacher,
    XᵀX) where the code under test defaults causal LMs to Kronecker + the sampled-label Fisher;
    none for an older checkout, which has neither switch."""
    probe = (
        "import dataclasses as d; from trak_dist.config import FeaturizeConfig as F; "
        "print('curvature' in {f.name for f in d.fields(F)})"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          check=True)  # fmt: skip
    new = done.stdout.strip() == "True"
    return ["projection=rademacher", "featurize.curvature=xtx"] if new else []


def command(job: str, out: Path, inputs: Path, pins: list[str] | None = None) -> list[str]:
    store = f"store.path={out / job}.zarr"
    hydra = f"hydra.run.dir={out / job}_hydra"
    cli = [sys.executable, "-m", "trak_dist"]
    if job in ("default", "inprocess"):
        extra = ["cluster=inprocess"] if job == "inprocess" else []
        return [*cli, store, hydra, "progress=false", *extra]
    if job == "slurm":
        local = [] if shutil.which("sbatch") else ["--local"]
        return [sys.executable, "-m", "launch.slurm", "array", "--tasks", "2", "--score-tasks",
                "3", "--wait", "--folder", str(out / "slurm_jobs"), *local, "--", store,
                "scoring.block_rows=256", "progress=false"]  # fmt: skip
    if job == "hf":
        ckpts = ",".join(str(c) for c in hf_inputs(inputs))
        root = inputs / "llm"
        return [*cli, "task=causal_lm", "model=hf", "data=text", f"model.checkpoints=[{ckpts}]",
                f"data.train={root / 'train.jsonl'}", f"data.targets={root / 'targets.jsonl'}",
                store, hydra, "proj_dim=64", "progress=false", *(pins or [])]  # fmt: skip
    return [sys.executable, "-c", TRAKER, str(out / f"{job}.zarr")]


def run(out: Path, inputs: Path, jobs: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    inputs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRAK_DIST_CACHE": str(inputs / "cache")}
    # checkout root first, so `launch` and `tests` resolve to the checkout the package comes from
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(root)) if p)
    digest_file = out / "digests.json"
    found = json.loads(digest_file.read_text()) if digest_file.exists() else {}
    for job in jobs:
        shutil.rmtree(out / f"{job}.zarr", ignore_errors=True)
        t0 = time.perf_counter()
        pins = lm_pins(env) if job == "hf" else None
        done = subprocess.run(command(job, out, inputs, pins), env=env, cwd=out,
                              capture_output=True, text=True)  # fmt: skip
        seconds = time.perf_counter() - t0
        if done.returncode:
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
            raise SystemExit(f"{job}: exit {done.returncode}")
        found[job] = {"seconds": round(seconds, 1), "arrays": digests(out / f"{job}.zarr")}
        print(f"{job}: {len(found[job]['arrays'])} arrays, {seconds:.1f} s", flush=True)
        digest_file.write_text(json.dumps(found, indent=1, sort_keys=True))


def compare(ref: Path, out: Path, pairs: list[str]) -> int:
    a = json.loads((ref / "digests.json").read_text())
    b = json.loads((out / "digests.json").read_text())
    bad = 0
    print("| job | arrays | equal | differ | only in one | seconds (ref → out) |")
    print("| --- | --- | --- | --- | --- | --- |")
    jobs = [(j, j) for j in sorted(set(a) & set(b))] + [tuple(p.split("=")) for p in pairs]
    for ref_job, job in jobs:
        x, y = a[ref_job]["arrays"], b[job]["arrays"]
        shared = sorted(set(x) & set(y))
        differ = [k for k in shared if x[k] != y[k]]
        only = sorted(set(x) ^ set(y))
        bad += len(differ)
        secs = f"{a[ref_job]['seconds']} → {b[job]['seconds']}"
        name = job if ref_job == job else f"{ref_job} → {job}"
        print(f"| {name} | {len(shared)} | {len(shared) - len(differ)} | {len(differ)} | "
              f"{len(only)} | {secs} |")  # fmt: skip
        for k in differ + only:
            print(f"    {'differs' if k in differ else 'only in one'}: {k}")
    return 1 if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bitwise", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--inputs", type=Path, default=None, help="default: OUT/../inputs")
    r.add_argument("--jobs", default="default,slurm,hf,traker")
    c = sub.add_parser("compare")
    c.add_argument("ref", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument(
        "--pair", action="append", default=[], help="REFJOB=OUTJOB, e.g. default=inprocess"
    )
    args = parser.parse_args()
    if args.cmd == "run":
        out = args.out.resolve()
        jobs = args.jobs.split(",")
        unknown = sorted(set(jobs) - set(JOBS))
        if unknown:
            parser.error(f"unknown jobs {unknown}; known: {JOBS}")
        run(out, (args.inputs or out.parent / "inputs").resolve(), jobs)
    else:
        raise SystemExit(compare(args.ref, args.out, args.pair))


if __name__ == "__main__":
    main()
