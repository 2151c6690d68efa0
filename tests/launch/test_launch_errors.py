"""The SLURM launcher's entry point reports expected failures in one line (no SLURM needed:
submitit's local executor)."""

import os
from pathlib import Path

from launch.slurm import main

ROOT = Path(__file__).resolve().parents[2]


def test_bad_config_is_one_line(tmp_path, capsys):
    code = main(
        [
            "array",
            "--local",
            "--folder",
            str(tmp_path),
            "--",
            "lambda_reg=nan",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("python -m launch.slurm: error: lambda_reg=nan; expected 'auto' or")


def test_a_failed_job_is_one_line_with_its_cause(tmp_path, capsys, monkeypatch):
    """A truncated checkpoint fails the array task; --wait reports its cause, not its trace."""
    monkeypatch.chdir(ROOT)  # the job imports launch/ from the submitting directory
    torn = tmp_path / "torn.pt"
    torn.write_bytes(b"PK\x03\x04 not a whole zip archive")
    code = main(
        [
            "array",
            "--local",
            "--wait",
            "--tasks",
            "1",
            "--folder",
            str(tmp_path / "jobs"),
            "--",
            f"model.checkpoints=[{torn}]",
            f"store.path={tmp_path / 's.zarr'}",
            "proj_dim=16",
            "progress=false",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    failed = "python -m launch.slurm: error: a SLURM job failed: ConfigError: checkpoint"
    assert err[0].startswith(failed)
    assert str(torn) in err[0] and str(tmp_path / "jobs") in err[0]
    assert os.path.isdir(tmp_path / "s.zarr")  # committed nothing, but the store stands
