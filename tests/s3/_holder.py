"""A process that holds a store's lease (``python -m tests.s3._holder URL TTL KIND``):
``lock`` holds ``store_lock`` for 2 ttl (until killed or stopped); ``scoring`` the scoring
lease of ``exp/v``."""

from __future__ import annotations

import sys
import time

from trak_dist.store import scoring_lease, store_lock


def main(url: str, ttl: str, kind: str) -> None:
    options = {"lease_ttl": ttl}
    if kind == "lock":
        with store_lock(url, options=options):
            print("held", flush=True)
            time.sleep(float(ttl) * 2)
        print("released", flush=True)
    elif kind == "scoring":
        lease = scoring_lease(url, "exp", "v", options)
        print("held", flush=True)
        time.sleep(float(ttl) * 2)
        lease.release()


if __name__ == "__main__":
    main(*sys.argv[1:])
