"""Expected failures as one line: OSErrors, corrupt files, Ray's wrappers, Ctrl-C, a missing
optional extra."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from trak_dist import failures
from trak_dist.errors import ConfigError, IllConditionedError, StoreMismatchError


@pytest.mark.parametrize(
    ("err", "says"),
    [
        (PermissionError(errno.EACCES, "Permission denied", "/ro/s.zarr"), "choose another"),
        (OSError(errno.EROFS, "Read-only file system", "/ro/s.zarr"), "choose another"),
        (OSError(errno.ENOSPC, "No space left on device", "/full/s.zarr"), "Free space"),
        (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x"), "path exists"),
        (OSError(errno.EIO, "Input/output error", "/bad/disk"), "its disk"),
    ],
)
def test_os_errors_name_the_path_and_what_to_do(err, says):
    line = failures.describe(err)
    assert line is not None and "\n" not in line
    assert err.strerror in line and err.filename in line and says in line


def test_corrupt_files_and_bugs():
    try:
        json.loads('{"zarr_format": 3, "node_ty')
    except json.JSONDecodeError as e:
        line = failures.describe(e)
    assert line is not None and "JSON file is corrupt" in line and "line 1" in line
    assert failures.describe(KeyError("a bug")) is None  # keeps its traceback
    multi = StoreMismatchError("settings differ:\n  - seed: 0 vs 1\nUse a new store path.")
    assert failures.describe(multi) == "settings differ: - seed: 0 vs 1 Use a new store path."


def test_ray_task_errors_are_unwrapped():
    from ray.exceptions import RayTaskError

    cause = IllConditionedError("XᵀX + λI is singular (model_id=0)")
    wrapped = RayTaskError("Reducer.score", "Traceback (most recent call last):\n ...", cause)
    dual = wrapped.as_instanceof_cause()  # what ray.get raises: RayTaskError(IllConditioned…)
    assert isinstance(dual, IllConditionedError) and failures.unwrap(dual) is cause
    assert failures.describe(dual) == str(cause)
    nested = RayTaskError("outer", "tb", wrapped)
    assert failures.unwrap(nested) is cause


def test_remote_traceback_text_keeps_its_last_error():
    text = (
        "ray::Worker.__init__() (pid=1, ip=127.0.0.1, repr=<Worker>)\n"
        '  File "worker.py", line 3, in __init__\n'
        "    raise ConfigError(...)\n"
        "trak_dist.errors.ConfigError: checkpoint c.pt could not be loaded\n"
    )
    assert failures.last_error_line(text) == "ConfigError: checkpoint c.pt could not be loaded"
    assert failures.gist(RuntimeError("first. second")) == "RuntimeError: first"
    assert failures.gist(EOFError()) == "EOFError"
    mismatch = RuntimeError(
        "Error(s) in loading state_dict for Sequential:\n\tsize mismatch for 0.weight: copying "
        "a param with shape torch.Size([16, 64]) from checkpoint. More."
    )
    assert failures.gist(mismatch) == (
        "RuntimeError: Error(s) in loading state_dict for Sequential: size mismatch for "
        "0.weight: copying a param with shape torch.Size([16, 64]) from checkpoint"
    )


def test_reported_exit_codes(capsys, monkeypatch):
    monkeypatch.delenv(failures.DEBUG_ENV, raising=False)
    with pytest.raises(SystemExit) as e, failures.reported("prog"):
        raise ConfigError("proj_dim=0; expected a positive integer.")
    assert e.value.code == 2
    assert capsys.readouterr().err == "prog: error: proj_dim=0; expected a positive integer.\n"
    with pytest.raises(SystemExit) as e, failures.reported("prog"):
        raise KeyboardInterrupt
    assert e.value.code == 130
    assert capsys.readouterr().err == f"prog: interrupted; {failures.RESUME}.\n"
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e, failures.reported("prog"):
        os.kill(os.getpid(), signal.SIGTERM)  # `kill`, `ray job stop`, `scancel`
        time.sleep(5)  # the handler raises before this ends
    assert e.value.code == 143
    assert capsys.readouterr().err == f"prog: terminated (SIGTERM); {failures.RESUME}.\n"
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(KeyError), failures.reported("prog"):  # a bug: its traceback stays
        raise KeyError("bug")
    monkeypatch.setenv(failures.DEBUG_ENV, "1")
    with pytest.raises(SystemExit), failures.reported("prog"):
        raise OSError(errno.ENOSPC, "No space left on device", "/full")
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("prog: error: No space left")


def cli_without(module: str, args: list[str], cwd) -> subprocess.CompletedProcess:
    """``trak-dist args`` in a process where importing ``module`` fails, as it does where the
    extra that provides it is not installed."""
    code = f"import sys; sys.modules[{module!r}] = None\nfrom trak_dist.cli import main; main()"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=600,
    )  # fmt: skip


def test_every_extra_s_modules_are_named():
    """The table behind the line: every module an extra's requirements name (pyproject)."""
    from importlib.metadata import requires

    from trak_dist.failures import EXTRAS

    for req in requires("trak_dist") or []:
        name, _, marker = req.partition(";")
        extra = marker.split("extra ==")[-1].strip().strip("'\"") if "extra ==" in marker else ""
        if extra in ("hf", "plot", "ann", "s3"):
            module = {"faiss-cpu": "faiss"}.get(name.split(">")[0].split("=")[0].strip())
            module = module or name.split(">")[0].split("=")[0].strip()
            assert EXTRAS.get(module) == extra, (module, extra)


@pytest.mark.slow
@pytest.mark.parametrize("module", ["transformers", "datasets"])
def test_the_llm_command_without_the_hf_extra_is_one_line(module, tmp_path):
    """The README's "Attribute your LLM" command where ``pip install .`` left the hf extra out:
    one ``trak-dist: error:`` line naming the install, exit 2, no traceback."""
    from tests.fixtures import llm_models
    from tests.hf.test_llm_cli import SMALL, readme_commands

    llm_models.checkpoints(tmp_path, "gpt2", num=3, steps=1)
    attribute, _ = readme_commands()
    out = cli_without(module, [*attribute, *SMALL, "cluster=inprocess"], tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"trak-dist: error: {module} is not installed")
    assert "pip install 'trak_dist[hf]'" in line


def test_serve_ann_without_the_ann_extra_is_one_line(tmp_path):
    out = cli_without("faiss", ["serve", "serve.ann=Flat"], tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("trak-dist serve: error: serve.ann needs faiss")
    assert "pip install 'trak_dist[ann]'" in line


@pytest.mark.slow
def test_the_report_without_the_plot_extra_says_which_to_install(tmp_path, digits_checkpoints):
    """The picture is the one thing the plot extra adds to a run: without it the job still
    runs, and its report says what to install instead of drawing it."""
    args = ["cluster=inprocess", "progress=false", "hydra.run.dir=run", "proj_dim=32",
            f"model.checkpoints=[{digits_checkpoints[0]}]"]  # fmt: skip
    out = cli_without("matplotlib", args, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = (tmp_path / "run" / "trak_report.md").read_text()
    assert "matplotlib is not installed (pip install 'trak_dist[plot]')" in report
