"""Ray inside a SLURM allocation: a head on the first node, workers on the others, the driver on
the head; everything stopped by process group when the driver returns."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import submitit

from trak_dist.config import JobConfig
from trak_dist.pipeline import JobResult

DONE = "driver_done"
Drive = Callable[[JobConfig, Path], dict[str, Any]]


def _wait_port(host: str, port: int, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"no Ray head answered on {host}:{port} within {timeout:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    # `ray start --block` stops the daemons it started on SIGTERM; never `ray stop`, which
    # would kill every Ray process of the node, including other jobs'
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


class RayClusterJob:
    """The callable every task of the allocation runs (one task per node).

    Args:
        port, head_ip: the head's GCS port and address (None: the first node's address).
        cpus, gpus: Ray resources each node offers.
        report_dir: where the driver writes the run report (or the LDS table).
        drive: what the head runs once Ray is up: ``run_and_report`` (as ``trak-dist``) or
            ``evaluate_and_report`` (as ``trak-dist eval``).
    """

    def __init__(
        self,
        cfg: JobConfig,
        port: int,
        head_ip: str | None,
        cpus: int,
        gpus: int,
        report_dir: Path,
        drive: Drive | None = None,
    ) -> None:
        self.cfg, self.port, self.head_ip = cfg, port, head_ip
        self.cpus, self.gpus, self.report_dir = cpus, gpus, report_dir
        self.drive = drive or run_and_report

    def __call__(self) -> dict[str, Any] | None:
        env = submitit.JobEnvironment()
        head_ip = self.head_ip or socket.gethostbyname(env.hostnames[0])
        address = f"{head_ip}:{self.port}"
        done = self.report_dir / f"{DONE}_{env.job_id}"
        ray_bin = str(Path(sys.executable).with_name("ray"))
        common = [f"--num-cpus={self.cpus}", f"--num-gpus={self.gpus}", "--block"]
        if env.global_rank == 0:
            cmd = [
                ray_bin,
                "start",
                "--head",
                f"--port={self.port}",
                f"--node-ip-address={head_ip}",
                "--include-dashboard=false",
                *common,
            ]
        else:
            _wait_port(head_ip, self.port, 300)
            cmd = [ray_bin, "start", f"--address={address}", *common]
        ray_proc = subprocess.Popen(cmd, start_new_session=True)
        try:
            if env.global_rank != 0:
                while not done.exists() and ray_proc.poll() is None:
                    time.sleep(2)
                return None
            _wait_port(head_ip, self.port, 300)
            return self._drive(address, len(env.hostnames))
        finally:
            try:
                if env.global_rank == 0:
                    # the report makes this folder only after a run that succeeds: made here,
                    # a failed run ends with its own error, not a FileNotFoundError that hid it
                    done.parent.mkdir(parents=True, exist_ok=True)
                    done.touch()
            finally:  # whatever the mark does: Ray never outlives the job
                _stop(ray_proc)

    def _drive(self, address: str, nodes: int) -> dict[str, Any]:
        cluster = dataclasses.replace(
            self.cfg.cluster,
            kind="slurm",
            address=address,
            num_workers=self.cfg.cluster.num_workers or None,
        )
        summary = self.drive(dataclasses.replace(self.cfg, cluster=cluster), self.report_dir)
        return {"nodes": nodes, **summary}


def run_and_report(cfg: JobConfig, report_dir: Path) -> dict[str, Any]:
    """The driver of ``trak-dist-slurm ray``: the job on the allocation's Ray, then its report."""
    from trak_dist.distributed import run_job
    from trak_dist.pipeline import resolve_inputs

    cfg = resolve_inputs(cfg)
    return report(cfg, run_job(cfg), report_dir)


def report(cfg: JobConfig, result: JobResult, report_dir: Path) -> dict[str, Any]:
    """The run report of ``result`` in ``report_dir``; returns its summary
    (``summary["report"]``: its Markdown file)."""
    from trak_dist.report import report_job

    return report_job(cfg, result, report_dir / (cfg.report or "trak_report"))


def evaluate_and_report(cfg: JobConfig, report_dir: Path) -> dict[str, Any]:
    """The driver of ``trak-dist-slurm ray --eval``: ``trak-dist eval`` on the allocation."""
    from trak_dist.evaluation import evaluate_config

    ev = evaluate_config(cfg, report_dir / "lds")
    return {
        "trained": ev.run.trained,
        "reused": ev.run.reused,
        "variants": [v.to_json() for v in ev.variants],
        "report": str(ev.files["md"]),
    }
