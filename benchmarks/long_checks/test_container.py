"""The image really built and run (.ci/container-smoke.sh): docker/Dockerfile built with podman
on a Debian 12 base made with debootstrap (the kernel stage skipped: no nvcc there), the default
job run in a container without network, and `trak-dist serve` in another, queried from here over
its published loopback port with the bearer token, its top-k equal to the job's stored top-k.

It needs root, podman and the network to the Debian mirror (the script installs podman, buildah,
runc and debootstrap with apt-get when they are missing), and takes ~5–10 minutes. It runs where
TRAK_DIST_REQUIRE_CONTAINER=1 (CI: then a missing podman fails it) or where podman is installed
and this is root; elsewhere it is skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the checkout
SCRIPT = ROOT / ".ci" / "container-smoke.sh"


def _reason_to_skip() -> str | None:
    if os.environ.get("TRAK_DIST_REQUIRE_CONTAINER") == "1":
        return None
    if os.geteuid() != 0:
        return "rootful podman and debootstrap need root (TRAK_DIST_REQUIRE_CONTAINER=1 forces)"
    if shutil.which("podman") is None:
        return "podman not installed (apt-get install podman; TRAK_DIST_REQUIRE_CONTAINER=1 forces)"
    return None


@pytest.mark.container
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_image_builds_runs_the_default_job_and_serves(tmp_path: Path) -> None:
    reason = _reason_to_skip()
    if reason:
        pytest.skip(reason)
    summary = tmp_path / "summary.json"
    env = {
        **os.environ,
        "HOST_PYTHON": sys.executable,
        "TRAK_CONTAINER_SUMMARY": str(summary),
    }
    env.pop("KEEP", None)
    out = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=1700
    )
    assert out.returncode == 0, f"{out.stdout[-6000:]}\n{out.stderr[-4000:]}"
    # the script asserts the replies itself; what it measured is reported for the CI log
    result = json.loads(summary.read_text())
    print(json.dumps(result, indent=1))
    assert result["n"] == 1500  # the digits train set, as the image's default job featurised it
    assert result["build_s"] > 0 and result["image_mb"] > 0
    assert len(result["top_proponent"]) == 2 and result["top_proponent"][1] > 0
