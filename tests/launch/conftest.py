import os
import shutil
import subprocess

import pytest


@pytest.fixture(scope="session")
def slurm():
    """A running SLURM controller with an idle node (CI starts one: .ci/slurm-up.sh)."""
    reason = None
    if shutil.which("sinfo") is None:
        reason = "no SLURM client here"
    else:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
        if out.returncode or not ({"idle", "mix", "mixed"} & set(out.stdout.split())):
            reason = f"no idle SLURM node (sinfo: {out.stdout.strip() or out.stderr.strip()})"
    if reason:
        message = f"{reason}: start one with `sudo .ci/slurm-up.sh` (CI does)"
        if os.environ.get("TRAK_DIST_REQUIRE_SLURM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return "debug"
