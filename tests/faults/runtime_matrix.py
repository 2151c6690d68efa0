"""Issue 10's runtime fault matrix as a table: each case run as a user would, on any checkout.

    python -m tests.faults.runtime_matrix                   # this checkout
    python -m tests.faults.runtime_matrix --code OLD_TREE   # e.g. `git archive 71d1b98 | tar -x`

Prints a Markdown table: exit code, stderr lines, the first line a user reads, and the outcome
(scores compared with a clean run of the same code, leftover processes, listening sockets).
tests/faults/test_runtime_faults.py asserts the same cases; this script only reports, so it
also runs against code that fails them (the "before" column of the issue's note). It takes
about 15 runs of the small digits job (minutes on a 2-core machine).
"""

from __future__ import annotations

import argparse
import glob
import http.client
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from tests.fixtures.fault_data import FAULT_DATA

HERE = Path(__file__).resolve().parent

P, LAMBDA, CHUNK = 64, 0.01, 64
VARIANT = f"p{P}_lambda{LAMBDA:g}"


class Runner:
    def __init__(self, code: Path, work: Path) -> None:
        self.code, self.work = code, work
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
        self.env.update(
            PYTHONPATH=os.pathsep.join([str(code), str(work)]), RAY_USAGE_STATS_ENABLED="0"
        )
        (work / "faultdata.py").write_text(FAULT_DATA)
        out = self.python(
            "from trak_dist.examples import digits; "
            f"print(','.join(map(str, digits.checkpoints(2, 5, {str(work / 'cache')!r}))))"
        )
        self.ckpts = out.strip().splitlines()[-1]

    def python(self, code: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=self.work,
            env=self.env,
            check=True,
        )
        return out.stdout

    def args(self, store: str, *extra: str) -> list[str]:
        return [
            "data=custom",
            "data.train=faultdata:train_set",
            "data.targets=faultdata:target_set",
            f"model.checkpoints=[{self.ckpts}]",
            f"proj_dim={P}",
            f"lambda_reg={LAMBDA}",
            f"store.chunk_rows={CHUNK}",
            f"store.path={self.work / store}",
            "featurize.micro_batch=32",
            "featurize.half_precision=false",
            "progress=false",
            f"hydra.run.dir={self.work / ('out_' + store)}",
            *extra,
        ]

    def faults(self, train: str = "", target: str = "") -> None:
        (self.work / "train_faults").write_text(train)
        (self.work / "target_faults").write_text(target)

    def popen(self, args: list[str], prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        cli = [sys.executable, "-c", "from trak_dist.cli import main; main()"]
        return subprocess.Popen(
            [*prefix, *cli, *args],
            cwd=self.work,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def run(self, args: list[str], prefix: tuple[str, ...] = ()) -> dict:
        t0 = time.time()
        proc = self.popen(args, prefix)
        out, err = proc.communicate(timeout=1800)
        return {"rc": proc.returncode, "out": out, "err": err, "s": time.time() - t0}

    def scores(self, store: str, variant: str = VARIANT) -> np.ndarray | None:
        path = self.work / store / "scores" / "targets" / variant / "S"
        if not path.exists():
            return None
        code = (
            "import zarr, numpy as np, sys; "
            f"np.save(sys.stdout.buffer, np.asarray(zarr.open_array({str(path)!r})[:]))"
        )
        raw = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, cwd=self.work, env=self.env
        ).stdout
        import io

        return np.load(io.BytesIO(raw)) if raw else None


def first_line(r: dict) -> str:
    """The first line on stderr that reports a failure (Ray's own warnings skipped)."""
    lines = [x.strip() for x in r["err"].splitlines() if x.strip()]
    words = ("error", "interrupt", "traceback")
    failing = [x for x in lines if any(w in x.lower() for w in words)]
    text = failing[0] if failing else ("" if r["rc"] == 0 else (lines or [""])[-1])
    return (text[:110] + "…") if len(text) > 110 else text


def stderr_lines(r: dict) -> int:
    return len([x for x in r["err"].splitlines() if x.strip()])


def compare(s: np.ndarray | None, ref: np.ndarray) -> str:
    if s is None:
        return "no scores"
    nan = int((~np.isfinite(s)).sum())
    if nan:
        return f"{nan} non-finite scores"
    return f"max|ΔS|/max|S| = {np.abs(s - ref).max() / np.abs(ref).max():.1e}"


def watch(proc: subprocess.Popen[str]) -> dict:
    """Listening sockets (and which serve Prometheus metrics) and worker processes of a running
    job, found by its PIDs."""
    sockets: dict[tuple[str, int], str] = {}
    metrics: set[tuple[str, int]] = set()
    workers: set[int] = set()
    while proc.poll() is None:
        try:
            procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in procs:
            try:
                name = p.name()
                conns = p.net_connections(kind="inet")
            except psutil.Error:
                continue
            if name == "ray::Worker":
                workers.add(p.pid)
            for c in conns:
                key = (c.laddr.ip, c.laddr.port)
                if c.status == psutil.CONN_LISTEN and key not in sockets:
                    sockets[key] = name
                    if serves_metrics(c.laddr.port):
                        metrics.add(key)
        time.sleep(0.3)
    return {"sockets": sockets, "workers": len(workers), "metrics": len(metrics)}


def loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(addr, "ipv4_mapped", None) or addr).is_loopback


def serves_metrics(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        found = resp.status == 200 and b"# TYPE" in resp.read(65536)
        conn.close()
        return found
    except (OSError, http.client.HTTPException):
        return False  # not HTTP (gRPC), or not on loopback


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, default=HERE.parents[1], help="trak_dist checkout")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="trak_faults_"))
    r = Runner(args.code.resolve(), work)
    rows: list[tuple[str, dict, str]] = []

    def row(case: str, res: dict, outcome: str) -> None:
        rows.append((case, res, outcome))
        print(
            f"{case}: rc={res['rc']} ({res['s']:.0f} s) {first_line(res)} | {outcome}", flush=True
        )

    # clean run, watched: sockets of the job's processes
    r.faults()
    t0 = time.time()
    proc = r.popen(r.args("clean"))
    seen = watch(proc)
    out, err = proc.communicate()
    clean = {"rc": proc.returncode, "out": out, "err": err, "s": time.time() - t0}
    ref = r.scores("clean")
    assert ref is not None, err[-2000:]
    exposed = [f"{n} {ip}:{p}" for (ip, p), n in seen["sockets"].items() if not loopback(ip)]
    row(
        "default local run: sockets",
        clean,
        f"{len(seen['sockets'])} listening, {len(exposed)} beyond loopback, "
        f"{seen['metrics']} serve /metrics",
    )

    r.faults(train="nan:17")
    res = r.run(r.args("nan", "data.train_fingerprint=v1"))
    row("NaN pixel in train row 17", res, compare(r.scores("nan"), ref))
    r.faults()
    res = r.run(r.args("nan", "data.train_fingerprint=v1"))
    row("… rerun after fixing the data", res, compare(r.scores("nan"), ref))

    r.faults(target="nan:5")
    res = r.run(r.args("nan_target"))
    row("NaN pixel in target row 5", res, compare(r.scores("nan_target"), ref))

    r.faults(train="-1:17")
    res = r.run(r.args("label"))
    row("train label −1 (row 17)", res, compare(r.scores("label"), ref))
    r.faults(target="10:3")
    res = r.run(r.args("label_t"))
    row("target label 10 = C (row 3)", res, compare(r.scores("label_t"), ref))
    r.faults()

    shutil.copytree(work / "clean", work / "lam")
    shutil.rmtree(work / "lam" / "scores" / "targets")
    res = r.run(r.args("lam", "lambda_reg=nan"))
    written = [Path(v).name for v in glob.glob(str(work / "lam" / "scores" / "targets" / "*"))]
    nan = [compare(r.scores("lam", v), ref) for v in written]
    row("lambda_reg=nan (features reused)", res, f"score sets written: {written} {nan}")

    shutil.copytree(work / "clean", work / "topk")
    # k > 2 blocks: before, the block-wise top-k merge could not hold k rows
    res = r.run(r.args("topk", "scoring.topk=50", "scoring.train_block=10"))
    kept = compare(r.scores("topk"), ref)
    row("scoring.topk=50 > train_block=10", res, f"scores in the store after: {kept}")

    locked = work / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        prefix = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--")
    res = r.run(r.args("locked/store.zarr"), prefix)
    row("read-only store directory", res, "")

    torn = work / "torn.pt"
    data = Path(r.ckpts.split(",")[0]).read_bytes()
    torn.write_bytes(data[: len(data) // 2])
    res = r.run([*r.args("torn"), f"model.checkpoints=[{torn}]"])
    row("truncated checkpoint (read by workers)", res, "")

    (work / "bad.zarr").mkdir()
    (work / "bad.zarr" / "zarr.json").write_text('{"zarr_format": 3, "node_ty')
    res = r.run(r.args("bad.zarr"))
    row("torn store zarr.json", res, "")

    (work / "conf" / "cluster").mkdir(parents=True)
    (work / "conf" / "cluster" / "mine.yaml").write_text("kind: local\nnum_workers: [1,\n")
    res = r.run([f"--config-dir={work / 'conf'}", "cluster=mine", "progress=false"])
    row("corrupt YAML config", res, "")

    t0 = time.time()
    proc = r.popen(r.args("sigint", "featurize.shard_rows=64"))
    while not glob.glob(str(work / "sigint/train/*/done/c/*")) and proc.poll() is None:
        time.sleep(0.05)
    job = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    time.sleep(5)
    left = [p for p in job if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    res = {"rc": proc.returncode, "out": out, "err": err, "s": time.time() - t0}
    row("Ctrl-C (SIGINT to the group)", res, f"{len(left)} processes left 5 s later")
    for p in left:
        p.kill()
    res = r.run(r.args("sigint", "featurize.shard_rows=64"))
    rep = json.loads((work / "out_sigint" / "trak_report.json").read_text())
    reused = rep["rows_reused"]["train"]
    row("… rerun", res, f"{reused} train rows reused, {compare(r.scores('sigint'), ref)}")

    t0 = time.time()
    # 8, not the 1000: code without the cap starts one actor per task (58 here, each
    # with its own torch, ~15 GB), too much for a shared test machine; 8 shows the same thing
    proc = r.popen(r.args("many", "cluster.num_workers=8"))
    seen = watch(proc)
    out, err = proc.communicate()
    res = {"rc": proc.returncode, "out": out, "err": err, "s": time.time() - t0}
    warned = "fits" in out + err
    row(
        f"cluster.num_workers=8 ({os.cpu_count()} CPUs)",
        res,
        f"{seen['workers']} worker actors, warning: {warned}, {res['s']:.0f} s vs "
        f"{clean['s']:.0f} s, {compare(r.scores('many'), ref)}",
    )

    print(f"\ncode: {args.code}\n")
    print("| case | exit | stderr lines | first line on stderr | outcome |")
    print("| --- | --- | --- | --- | --- |")
    for case, res, outcome in rows:
        line = first_line(res).replace("|", "\\|")
        print(f"| {case} | {res['rc']} | {stderr_lines(res)} | {line} | {outcome} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
