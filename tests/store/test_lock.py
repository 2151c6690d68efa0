import logging
import subprocess
import sys
import time

from trak_dist.store import store_lock

HOLD = """
import sys, time
from filelock import FileLock
with FileLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(2)
"""


def test_a_second_job_waits_for_the_featurising_one(tmp_path, caplog):
    store = tmp_path / "s.zarr"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, f"{store.resolve()}.lock"], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="trak_dist"), store_lock(str(store)):
        waited = time.perf_counter() - t0
    holder.wait(timeout=10)
    holder.stdout.close()
    assert waited > 1.0
    assert "waiting for another trak-dist process" in caplog.text
    with store_lock(str(store)):  # released: no wait now
        pass
