"""Every command against a store on S3, run as a user runs them (``trak-dist`` in a subprocess,
a local Ray), with checkpoints on S3 too: the job, its report in the store, ``show``,
``store verify`` / ``repair``, a multirun sweep resuming the repaired chunk, and no credential
in any output (by hand: ``python -m pytest benchmarks/remote_checks``)."""

from __future__ import annotations

import json

import numpy as np
import obstore
import pytest
from obstore.store import from_url

from tests.fixtures.pipeline import CHUNK, LAMBDA, P
from tests.s3.test_commands import job_args, keys, no_secret, trak_dist
from trak_dist.store import FeatureStore, variant_name

pytestmark = [pytest.mark.s3, pytest.mark.ray, pytest.mark.slow]


def test_the_job_show_verify_repair_and_a_sweep(
    s3_url, s3_env, s3_checkpoints, digits_checkpoints, tmp_path
):
    """The same command with the store and checkpoints on local disk is the reference: the
    scores must equal it to the bit (an in-process run rounds the scoring matmul otherwise:
    its thread count differs from a Ray actor's)."""
    local = tmp_path / "local"
    local.mkdir()
    ref = trak_dist(
        job_args(str(local / "store.zarr"), [str(c) for c in digits_checkpoints]), local, s3_env
    )
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = FeatureStore.open(local / "store.zarr", mode="r").score_set(
        "targets", variant_name(P, LAMBDA)
    )
    assert expected is not None
    reference = expected.scores()
    work = tmp_path / "work"
    work.mkdir()
    tmp_path = work
    args = job_args(s3_url, s3_checkpoints)
    run = trak_dist([*args, "hydra.run.dir=run1"], tmp_path, s3_env)
    assert run.returncode == 0, run.stderr[-3000:]
    report_url = run.stdout.strip().splitlines()[-1].removeprefix("report: ")
    assert report_url.startswith(f"{s3_url}.reports/") and report_url.endswith("trak_report.md")
    parent = s3_url.rsplit("/", 1)[0]
    names = keys(parent)
    stem = report_url[len(parent) + 1 : -len(".md")]
    assert f"{stem}.md" in names and f"{stem}.json" in names and f"{stem}.png" in names
    assert "store.zarr.lock" in names  # the lease, given back
    client = from_url(parent, client_options={"allow_http": True})
    report = json.loads(bytes(obstore.get(client, f"{stem}.json").bytes()))
    assert report["store"] == s3_url and report["rows_computed"]["train"] == 2 * 1500
    store = FeatureStore.open(s3_url, mode="r")
    sset = store.score_set("targets", variant_name(P, LAMBDA))
    assert sset is not None
    np.testing.assert_array_equal(sset.scores(), reference)
    # on local disk: Hydra's run folder and the node's copy of the checkpoints, nothing else
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "run1"]
    assert not list(tmp_path.rglob("*.lock"))

    show = trak_dist(["show", *args], tmp_path, s3_env)
    assert show.returncode == 0, show.stderr[-3000:]
    assert "target 0:" in show.stdout

    chunk = "train/1/X/c/3/0"
    client = from_url(s3_url, client_options={"allow_http": True})  # the store's own prefix
    raw = bytearray(bytes(obstore.get(client, chunk).bytes()))
    raw[7] ^= 1
    obstore.put(client, chunk, bytes(raw))
    damaged = trak_dist(["store", "verify", s3_url], tmp_path, s3_env)
    assert damaged.returncode == 1 and "train/1/X chunk 3 (rows [192, 256))" in damaged.stdout
    fixed = trak_dist(["store", "repair", s3_url], tmp_path, s3_env)
    assert fixed.returncode == 0 and "un-committed 1 chunk(s) of train/1" in fixed.stdout

    # a sweep on the same store: featurises only the repaired chunk, scores both widths
    sweep = trak_dist(["-m", *args, f"proj_dim={P // 2},{P}"], tmp_path, s3_env)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert f"sweep summary: {s3_url}.reports/" in sweep.stdout
    reports = sorted(tmp_path.glob("multirun/*/*/*/trak_report.json"))
    assert len(reports) == 2
    first = json.loads(reports[0].read_text())
    assert first["rows_computed"] == {"train": CHUNK, "target": 0}
    again = FeatureStore.open(s3_url, mode="r").score_set("targets", variant_name(P, LAMBDA))
    assert again is not None
    np.testing.assert_array_equal(again.scores(), reference)
    no_secret(run.stdout, run.stderr, show.stdout, show.stderr, sweep.stdout, sweep.stderr)
    no_secret(
        *(
            p.read_text(errors="replace")
            for p in tmp_path.rglob("*")
            if p.is_file() and p.suffix in (".log", ".yaml", ".json", ".md")
        )
    )
