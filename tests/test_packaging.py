"""What an installed trak_dist needs, checked in the checkout (fast): the distribution's package
list, where configs and the kernel sources are looked up, the version, and one-line errors at the
edge. Building the wheel and running it from a fresh venv is .ci/wheel-check.sh (CI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import requires, version
from pathlib import Path

import pytest
import tomllib

import trak_dist
from trak_dist import _build_cuda, _resources, cli
from trak_dist.errors import ConfigError
from trak_dist.store._spec import FORMAT_VERSION

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def run(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in {"TRAK_DIST_CONF", "RAY_ADDRESS"}}
    return subprocess.run(
        [sys.executable, "-c", code, *env.pop("ARGS", "").split()],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        timeout=120,
    )


CLI = "from trak_dist.cli import main; main()"


def test_every_package_directory_is_distributed():
    """pyproject.toml lists packages explicitly (package-dir mappings rule out `find`): a new
    subpackage must be added there or the wheel silently lacks it."""
    tool = PYPROJECT["tool"]["setuptools"]
    listed, mapped = set(tool["packages"]), tool["package-dir"]
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "trak_dist").rglob("*.py")
    }
    on_disk = {p for p in on_disk if "__pycache__" not in p}
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages"
    assert mapped == {
        "trak_dist.launch": "launch",
        "trak_dist.conf": "conf",
        "trak_dist.cuda_ext": "cuda_ext",
    }
    assert set(mapped) <= listed and all((ROOT / d).is_dir() for d in mapped.values())
    # package-data globs (relative to the mapped directory, as setuptools reads them) cover
    # every config and every kernel source; the wheel's full contents are .ci/wheel-check.sh's
    data = tool["package-data"]
    for pkg in ("trak_dist.conf", "trak_dist.cuda_ext"):
        src = ROOT / mapped[pkg]
        matched = {f for pattern in data[pkg] for f in src.glob(pattern)}
        files = {f for f in src.rglob("*") if f.is_file() and "build" not in f.parts}
        assert files - matched == set(), f"not covered by package-data[{pkg!r}]"


def test_the_version_has_one_source():
    assert trak_dist.__version__ == version("trak_dist") == PYPROJECT["project"]["version"]
    want = f"trak-dist {trak_dist.__version__} (store format version {FORMAT_VERSION})"
    assert cli.version() == want


def test_version_flag(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    monkeypatch.setattr(sys, "argv", ["trak-dist", "--version"])
    cli.main()  # returns: Hydra, whose own --version names only Hydra's, never runs
    assert capsys.readouterr().out == f"{cli.version()}\n"


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site-packages layout: trak_dist/ holding conf/ and cuda_ext/ as the wheel has them."""
    pkg = tmp_path / "site-packages" / "trak_dist"
    shutil.copytree(ROOT / "conf", pkg / "conf")
    shutil.copytree(ROOT / "cuda_ext", pkg / "cuda_ext", ignore=shutil.ignore_patterns("build"))
    monkeypatch.setattr(_resources, "PACKAGE", pkg)
    monkeypatch.delenv("TRAK_DIST_CONF", raising=False)
    return pkg


def test_an_installed_package_uses_its_own_configs_and_kernel_sources(installed: Path):
    assert cli.conf_dir() == installed / "conf"
    assert _resources.cuda_ext_dir() == installed / "cuda_ext"


def test_trak_dist_conf_overrides_the_installed_configs(
    installed: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TRAK_DIST_CONF", str(ROOT / "conf"))
    assert cli.conf_dir() == ROOT / "conf"


def test_a_checkout_uses_the_top_level_configs(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRAK_DIST_CONF", raising=False)
    assert _resources.PACKAGE == ROOT / "trak_dist"
    assert cli.conf_dir() == ROOT / "conf"
    assert _resources.cuda_ext_dir() == ROOT / "cuda_ext"


def test_no_configs_anywhere_is_one_error_naming_both_places(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(_resources, "PACKAGE", tmp_path / "lib" / "trak_dist")
    monkeypatch.delenv("TRAK_DIST_CONF", raising=False)
    with pytest.raises(ConfigError) as info:
        cli.conf_dir()
    message = str(info.value)
    assert str(tmp_path / "lib" / "trak_dist" / "conf") in message
    assert str(tmp_path / "lib" / "conf") in message and "TRAK_DIST_CONF" in message


def one_line_error(code: int, err: str, prefix: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prefix}: error: "), err
    return lines[0]


def test_a_missing_config_directory_is_one_line(tmp_path: Path):
    """As a user sees it: a process, its exit code and its stderr. Importing the CLI and the
    launchers needs no configs (it used to raise inside Hydra's decorator, at import)."""
    code = f"import trak_dist.cli, launch.slurm; {CLI}"
    out = run(code, tmp_path, TRAK_DIST_CONF=str(tmp_path / "nowhere"))
    line = one_line_error(out.returncode, out.stderr, "trak-dist")
    assert f"TRAK_DIST_CONF={tmp_path / 'nowhere'}" in line


@pytest.mark.parametrize(
    ("text", "problem", "args"),
    [
        ("a: [\n", "expected the node content, but found '<stream end>' (line 2, column 1)", []),
        ("a: 1\n\tb: 2\n", "found character '\\t' that cannot start any token (line 2", ["--help"]),
    ],
)
def test_a_broken_config_file_is_one_line_naming_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    text: str,
    problem: str,
    args: list[str],
):
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "cluster" / "local.yaml").write_text(text)
    monkeypatch.setenv("TRAK_DIST_CONF", str(conf))
    monkeypatch.setattr(sys, "argv", ["trak-dist", *args])
    with pytest.raises(SystemExit) as info:
        cli.main()
    line = one_line_error(int(info.value.code or 0), capsys.readouterr().err, "trak-dist")
    assert f"{conf / 'cluster' / 'local.yaml'} cannot be read: {problem}" in line


def test_the_slurm_launcher_reports_a_missing_config_directory_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from launch import slurm

    monkeypatch.setenv("TRAK_DIST_CONF", str(tmp_path))
    code = slurm.main(["array", "--local"], prog="trak-dist-slurm")
    one_line_error(code, capsys.readouterr().err, "trak-dist-slurm")


def test_submitit_is_a_dependency_not_an_extra():
    """`pip install trak_dist` gives working SLURM launchers; the `slurm` extra stays, empty,
    so that `pip install "trak_dist[slurm]"` keeps working."""
    deps = [d.split(">")[0].split("=")[0] for d in PYPROJECT["project"]["dependencies"]]
    assert {"submitit", "hydra-submitit-launcher"} <= set(deps)
    assert PYPROJECT["project"]["optional-dependencies"]["slurm"] == []
    # the installed metadata says the same (no `extra == "slurm"` marker on submitit)
    installed = [r for r in requires("trak_dist") or [] if r.startswith("submitit")]
    assert installed and all("extra" not in r for r in installed), installed


@pytest.mark.parametrize(
    "argv",
    [
        [str(Path(sys.executable).parent / "trak-dist-slurm"), "--help"],
        [sys.executable, "-m", "trak_dist.launch.slurm", "--help"],
    ],
    ids=["console-script", "python-m"],
)
def test_the_slurm_launcher_help_runs_from_any_directory(tmp_path: Path, argv: list[str]):
    """Both spellings of the launcher, as processes started outside the checkout (no
    PYTHONPATH): usage on stdout, exit 0, no traceback."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "TRAK_DIST_CONF"}}
    out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "{ray,array}" in out.stdout and "submitit" in out.stdout


def test_build_cuda_is_a_subcommand_with_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert cli.SUBCOMMANDS["build-cuda"] is _build_cuda.main
    code = _build_cuda.main(["--nvcc", str(tmp_path / "no-nvcc")])
    line = one_line_error(code, capsys.readouterr().err, "trak-dist build-cuda")
    assert "is not an executable" in line and "--nvcc" in line
    blocked = tmp_path / "file"
    blocked.write_text("")
    nvcc = shutil.which("nvcc") or sys.executable  # the directory check comes before nvcc runs
    code = _build_cuda.main(["--nvcc", nvcc, "--build-dir", str(blocked / "sub")])
    line = one_line_error(code, capsys.readouterr().err, "trak-dist build-cuda")
    assert "cannot create" in line and "TRAK_DIST_CUDA_LIB" in line
