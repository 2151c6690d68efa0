"""The GPU check's driver: setup in this process, each section in a process of its own with a
time budget, the output teed to the console and a log. Standard library only (it runs before
the wheel set is installed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
WHEELS = {"gpu": ROOT / ".device" / "gpu", "dry": ROOT / ".device" / "dryrun"}
FAST_JL_LIMIT_S = 120
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclass
class Outcome:
    name: str
    title: str
    status: str
    seconds: float
    budget: float
    markdown: str
    numbers: dict[str, Any] = field(default_factory=dict)


def commit() -> str:
    """The checkout's commit, if it is a git checkout (the device tool sends files, not .git)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "not a git checkout"
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
        timeout=10,
    ).stdout.strip()
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


class Check:
    """One run of the check: its mode (``gpu``/``dry``), scratch folder, log and setup facts."""

    def __init__(self, mode: str, work: Path, log: Path) -> None:
        self.mode, self.work, self.log = mode, work, log
        self.py = sys.executable
        self.site = work / "site"
        self.site_fast_jl = work / "site_fast_jl"
        self.lib = work / "kernel" / "libtrak_proj.so"
        self.hide = work / "hidden.txt"
        self.numbers: dict[str, Any] = {}
        self._md: list[str] = []
        self._fast_jl: subprocess.Popen[bytes] | None = None
        self._fast_jl_started = 0.0
        self.capability: tuple[int, int] | None = None
        log.write_text("")

    # ---- output ---------------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(text, flush=True)
        with self.log.open("a") as f:
            f.write(text + "\n")

    def note(self, text: str) -> None:
        """A line of the setup section's report (and the log)."""
        self._md.append(text)
        self.say(text)

    def env(self) -> dict[str, str]:
        """The sections' environment: the wheel set, the checkout, the kernel just built; in the
        dry run the image's stand-in (hidden modules) first."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
        paths = [str(self.site), str(self.site_fast_jl), str(ROOT)]
        if self.mode == "dry":
            paths.insert(0, str(HERE / "hide"))
            env["TRAK_DIST_DEVICE_HIDE"] = str(self.hide)
        env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [env.get("PYTHONPATH")] if p])
        env["TRAK_DIST_CUDA_LIB"] = str(self.lib)
        return env

    def run(self, cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> int:
        """Run ``cmd`` in its own process group, its output teed; killed (all of it) after
        ``timeout`` seconds, then returns -9."""
        self.say("$ " + " ".join(cmd))
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env or self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdout is not None
        stream = proc.stdout

        def pump() -> None:
            with self.log.open("ab") as f:
                for line in iter(stream.readline, b""):
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()
                    f.write(line)
                    f.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=max(timeout, 1.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -9
        reader.join(timeout=5)
        return code

    # ---- setup ----------------------------------------------------------------------------

    def setup(self, deadline: float) -> Outcome:
        """Wheels, the dry run's checks, the import check, the kernel, fast_jl (background)."""
        start = time.time()
        try:
            ok = self._setup(deadline)
        except SetupError as e:
            self.note(f"- **FAILED**: {e}")
            ok = False
        status = "ok" if ok else "FAILED"
        budget = deadline - start
        return Outcome(
            "setup",
            "Wheels, kernel build, fast_jl build",
            status,
            time.time() - start,
            budget,
            "\n".join(self._md),
            self.numbers,
        )

    def _setup(self, deadline: float) -> bool:
        wheels = WHEELS[self.mode]
        found = sorted(wheels.glob("*.whl"))
        if not found:
            raise SetupError(
                f"no wheels in {wheels}: run `make device-wheels` in the checkout first (and "
                'name ".device/gpu" in the device run\'s carry).'
            )
        self.note(f"- Python {sys.version.split()[0]} ({self.py})")
        size = sum(p.stat().st_size for p in wheels.iterdir() if p.is_file()) / 2**20
        pip = [
            self.py,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
        ]
        t0 = time.time()
        self._must([*pip, "--target", str(self.site), *map(str, found)], deadline, "wheel install")
        self.note(
            f"- installed the {len(found)} wheels of {wheels.relative_to(ROOT)} ({size:.1f} "
            f"MiB with the fast_jl sdist) into a fresh target with --no-index: "
            f"{time.time() - t0:.1f} s"
        )
        if self.mode == "dry":
            self._dry_run_checks(pip, deadline)
        self.capability = self._capability()
        if self.capability is None and self.mode == "gpu":
            raise SetupError("torch sees no CUDA GPU on the GPU machine")
        # early, so that its (single-threaded) compile overlaps everything up to the projection
        self._start_fast_jl()
        self._import_check(deadline)
        self._build_kernel(deadline)
        return True

    def _must(self, cmd: list[str], deadline: float, what: str, env: dict | None = None) -> None:
        code = self.run(cmd, deadline - time.time(), env or dict(os.environ))
        if code != 0:
            raise SetupError(f"{what} failed (exit {code}); the log has its output")

    def _dry_run_checks(self, pip: list[str], deadline: float) -> None:
        gpu = sorted(WHEELS["gpu"].glob("*.whl"))
        plats = [a for p in PLATFORMS for a in ("--platform", p)]
        py312 = [
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            "--abi",
            "cp312",
        ]
        target = ["--target", str(self.work / "target312")]
        self._must([*pip, *py312, *plats, *target, *map(str, gpu)], deadline, "the 3.12 install")
        self.note(
            f"- the GPU machine's set ({len(gpu)} wheels for CPython 3.12) installs with "
            "--no-index --only-binary=:all: --python-version 3.12 into a clean target"
        )
        same = [self.py, "-m", "benchmarks.device.wheels", "same", *map(str, WHEELS.values())]
        self._must(same, deadline, "comparing the 3.12 set with this Python's")
        self._must([self.py, "-m", "benchmarks.device._hide", str(self.hide)], deadline, "hiding")
        hidden = self.hide.read_text().split()
        self.note(
            f"- this Python's set holds the same distributions at the same versions; it "
            f"stands in for the 3.12 one. Hidden, as absent from the GPU image: "
            f"{len(hidden)} top-level modules of this venv, `ray` among them"
        )

    def _import_check(self, deadline: float) -> None:
        code = (
            "import importlib.util, trak_dist, zarr, hydra, omegaconf, submitit\n"
            "from trak_dist.pipeline import InProcessExecutor, run_pipeline\n"
            "import torch\n"
            "print('torch', torch.__version__, 'cuda', torch.version.cuda, 'zarr', "
            "zarr.__version__, 'ray importable:', importlib.util.find_spec('ray') is not None)\n"
            "try:\n    import ray\nexcept ImportError:\n    pass\n"
            "else:\n    raise SystemExit('ray is importable: the check must run without it')\n"
        )
        self._must([self.py, "-c", code], deadline, "importing trak_dist", self.env())
        self.note(
            "- `import trak_dist` and the in-process executor work with the set; `ray` is "
            "not importable"
        )

    def _capability(self) -> tuple[int, int] | None:
        probe = "import torch; print(*torch.cuda.get_device_capability()) if torch.cuda.is_available() else print()"  # noqa: E501
        out = subprocess.run(
            [self.py, "-c", probe],
            capture_output=True,
            text=True,
            env=self.env(),
            check=False,
            timeout=120,
        ).stdout.split()
        return (int(out[0]), int(out[1])) if len(out) == 2 else None

    def _build_kernel(self, deadline: float) -> None:
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not Path(nvcc).exists():
            raise SetupError("nvcc not found (looked on PATH and /usr/local/cuda/bin)")
        cap = self.capability
        arch = f"{cap[0]}{cap[1]}" if cap else "90"
        why = "the GPU present" if cap else "the lent H100/H200, as no GPU is here"
        t0 = time.time()
        self._must(
            [
                "make",
                "-s",
                "-C",
                "cuda_ext",
                f"BUILD_DIR={self.lib.parent}",
                f"NVCC={nvcc}",
                f"ARCHS=sm_{arch}",
                f"PTX_ARCH=compute_{arch}",
            ],
            deadline,
            "the kernel build",
        )
        version = (
            subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
            .stdout.strip()
            .splitlines()[-1]
        )
        self.numbers.update(kernel_arch=f"sm_{arch}", nvcc=version)
        self.note(
            f"- kernel built with {nvcc} ({version}) for sm_{arch} ({why}): "
            f"{time.time() - t0:.1f} s → {self.lib}"
        )

    def _start_fast_jl(self) -> None:
        sdists = sorted(WHEELS["gpu"].glob("fast_jl-*.tar.gz"))
        if not sdists:
            self.note("- fast_jl: no sdist in .device/gpu (make device-wheels brings it)")
            return
        src = self.work / "fast_jl"
        with tarfile.open(sdists[0]) as tar:
            tar.extractall(src, filter="data")
        (setup,) = src.glob("*/setup.py")
        cap = self.capability
        arch = f"{cap[0]}.{cap[1]}" if cap else "9.0"
        text = setup.read_text()
        # fast_jl 0.1.3 pins TORCH_CUDA_ARCH_LIST to 7.0+PTX, which CUDA 13's nvcc no longer
        # accepts (Volta was dropped); the GPU present's architecture instead
        if "7.0+PTX" not in text:
            self.note("- fast_jl: its setup.py no longer pins 7.0+PTX; built as it is")
        setup.write_text(text.replace("7.0+PTX", arch))
        if self.mode == "dry":
            self.note(
                f"- fast_jl: unpacked, its arch pin set to {arch}; skipped: building it needs "
                "a CUDA build of torch (torch.utils.cpp_extension refuses a CPU-only one)"
            )
            return
        cmd = [
            self.py,
            "-m",
            "pip",
            "install",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "--no-cache-dir",
            "--target",
            str(self.site_fast_jl),
            str(setup.parent),
        ]
        env = dict(self.env(), MAX_JOBS=str(os.cpu_count() or 4))
        log = (self.work / "fast_jl.log").open("wb")
        self._fast_jl = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._fast_jl_started = time.time()
        self.note(
            f"- fast_jl: building in the background from {sdists[0].name} for {arch} "
            f"(limit {FAST_JL_LIMIT_S} s)"
        )

    def wait_fast_jl(self) -> None:
        """Wait for the fast_jl build up to its limit; its outcome goes into the numbers."""
        if self._fast_jl is None:
            return
        left = self._fast_jl_started + FAST_JL_LIMIT_S - time.time()
        try:
            code = self._fast_jl.wait(timeout=max(left, 0.1))
        except subprocess.TimeoutExpired:
            self.stop_fast_jl()
            self.numbers["fast_jl"] = (
                f"not built: the build passed {FAST_JL_LIMIT_S} s and was stopped"
            )
        else:
            # the log's last write is the build's end (it may have ended sections ago)
            took = (self.work / "fast_jl.log").stat().st_mtime - self._fast_jl_started
            tail = (self.work / "fast_jl.log").read_text(errors="replace").strip().splitlines()[-3:]
            self.numbers["fast_jl"] = (
                f"built in {took:.0f} s"
                if code == 0
                else f"build failed (exit {code}): " + " / ".join(tail)
            )
        with (self.work / "fast_jl.log").open("rb") as f, self.log.open("ab") as out:
            out.write(b"---- fast_jl build log ----\n" + f.read())
        self.say(f"fast_jl: {self.numbers['fast_jl']}")
        self._fast_jl = None

    def stop_fast_jl(self) -> None:
        if self._fast_jl is not None and self._fast_jl.poll() is None:
            os.killpg(self._fast_jl.pid, signal.SIGKILL)
            self._fast_jl.wait()

    # ---- sections -------------------------------------------------------------------------

    def section(self, name: str, title: str, budget: float, state: dict) -> Outcome:
        """Run section ``name`` with ``budget`` seconds (its own deadline 5 s earlier, so it can
        stop cleanly before it is killed)."""
        md, js, st = (self.work / f"{name}.{ext}" for ext in ("md", "json", "state.json"))
        st.write_text(json.dumps(state, default=str))
        start = time.time()
        self.say(f"\n## {name}: {title} (budget {budget:.0f} s)")
        if name == "pytest":
            code = self._pytest(md, js, budget)
        else:
            cmd = [
                self.py,
                "-m",
                f"benchmarks.device.{name}",
                "--mode",
                self.mode,
                "--md",
                str(md),
                "--json",
                str(js),
                "--state",
                str(st),
                "--deadline",
                str(start + budget - 5),
            ]
            code = self.run(cmd, budget)
        seconds = time.time() - start
        status = {0: "ok", -9: f"cut short at {budget:.0f} s"}.get(code, f"FAILED (exit {code})")
        text = md.read_text() if md.exists() else ""
        if code == -9:
            text += (
                f"\n- **cut short**: killed at its budget ({budget:.0f} s); the rest was not run\n"
            )
        numbers = json.loads(js.read_text()) if js.exists() and js.read_text() else {}
        return Outcome(name, title, status, seconds, budget, text, numbers)

    def _pytest(self, md: Path, js: Path, budget: float) -> int:
        from benchmarks.device import _pytest

        return _pytest.run(self, md, js, budget)


class SetupError(RuntimeError):
    """Setup cannot go on (the message says why and what to do)."""
