"""Exclusion on an object store: lease objects taken with If-None-Match, renewed with If-Match,
expiring when their holder dies (real SeaweedFS, real processes, SIGKILL and SIGSTOP)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

import obstore
import pytest
from obstore.store import from_url

from trak_dist.errors import StoreStateError
from trak_dist.store import scoring_lease, store_lock
from trak_dist.store._lease import Lease

pytestmark = pytest.mark.s3
TTL = 3.0


def holder(url: str, kind: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.s3._holder", url, str(TTL), kind, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_job_waits_and_a_killed_holder_blocks_only_for_the_ttl(s3_url, caplog):
    options = {"lease_ttl": TTL}
    proc = holder(s3_url, "lock")
    with store_lock(s3_url, wait=False, options=options) as free:
        assert not free  # held, and renewed: no waiting for skippable work
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    t0 = time.monotonic()
    # logger="trak_dist": an in-process TRAKer (logging_level=ERROR) leaves that logger at ERROR
    with (
        caplog.at_level(logging.WARNING, logger="trak_dist"),
        store_lock(s3_url, options=options) as free,
    ):
        waited = time.monotonic() - t0
        assert free
    assert TTL - 0.5 < waited < TTL + 5
    assert "waiting for another trak-dist process using" in caplog.text
    assert "took over the lease" in caplog.text and "not renewed for" in caplog.text
    # given back: the next taker does not wait
    t0 = time.monotonic()
    with store_lock(s3_url, options=options):
        assert time.monotonic() - t0 < 1.5


def test_the_lock_is_reentrant_and_leases_exclude_each_other(s3_url):
    options = {"lease_ttl": TTL}
    with store_lock(s3_url, options=options), store_lock(s3_url, options=options):
        pass
    parent = from_url(s3_url.rsplit("/", 1)[0], client_options={"allow_http": True})
    errors: list[BaseException] = []

    def count(times: int) -> None:
        try:
            for _ in range(times):
                lease = Lease(s3_url, "lock", "counting", options)  # one holder per take
                lease.acquire()
                try:
                    value = int(bytes(obstore.get(parent, "count").bytes()))
                except FileNotFoundError:
                    value = 0
                time.sleep(0.05)  # a read-modify-write that loses updates if two overlap
                obstore.put(parent, "count", str(value + 1).encode())
                lease.release()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=count, args=(3,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert int(bytes(obstore.get(parent, "count").bytes())) == 9


def test_a_second_scoring_of_a_variant_fails_while_the_first_renews(s3_url):
    proc = holder(s3_url, "scoring")
    t0 = time.monotonic()
    with pytest.raises(StoreStateError, match=r"another process is scoring 'v' of 'exp'"):
        scoring_lease(s3_url, "exp", "v", {"lease_ttl": TTL})
    assert time.monotonic() - t0 < TTL  # told at its holder's first renewal
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    t0 = time.monotonic()
    lease = scoring_lease(s3_url, "exp", "v", {"lease_ttl": TTL})  # killed: taken over
    assert time.monotonic() - t0 > TTL - 0.5
    lease.release()
    scoring_lease(s3_url, "exp", "v", {"lease_ttl": TTL}).release()  # released: at once


def test_a_stalled_holder_loses_its_lease_and_says_so(s3_url):
    proc = holder(s3_url, "lock")
    proc.send_signal(signal.SIGSTOP)
    try:
        with store_lock(s3_url, options={"lease_ttl": TTL}):
            proc.send_signal(signal.SIGCONT)
            time.sleep(TTL / 2)  # its renewal thread wakes and finds the lease taken
    finally:
        proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "lost the lease" in err and "another job may have used the store" in err
