"""``trak-dist serve``'s refusals before anything starts: one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trak_dist", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help() -> None:
    out = _serve("--help")
    assert out.returncode == 0
    assert "POST /attribute" in out.stdout and "serve.token_file" in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve.host=0.0.0.0"], "serve.host=0.0.0.0 accepts connections from other machines"),
        (["serve.port=70000"], "ServeConfig.port=70000"),
        (["serve.index_dtype=int8"], "ServeConfig.index_dtype='int8'"),
        (["serve.require_token=true"], "needs a bearer token: set serve.token_file"),
    ],
)
def test_refused_settings(args: list[str], message: str) -> None:
    out = _serve(*args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_refused_token_file_and_store(tmp_path: Path) -> None:
    empty = tmp_path / "token"
    empty.write_text("\n")
    out = _serve(f"serve.token_file={empty}", "serve.require_token=true")
    assert out.returncode == 2 and "holds 0 characters" in out.stderr, out.stderr
    out = _serve(f"store.path={tmp_path / 'none.zarr'}")
    assert out.returncode == 2 and "no store at" in out.stderr, out.stderr
