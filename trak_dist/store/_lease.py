"""Exclusion between processes on an object store: a lease object beside the store.

Object stores have no file locks, but S3 (and GCS, Azure, SeaweedFS, MinIO) offer conditional
writes, which is all a lease needs:

- **take**: create the object with ``If-None-Match: *``; exactly one of racing writers wins.
- **keep**: a background thread rewrites it every ``ttl / 4`` with ``If-Match: <its ETag>``
  (compare-and-swap); every body is unique (holder id and a counter), so every renewal changes
  the ETag.
- **expire**: a waiter that sees the same ETag for ``ttl`` seconds of its own clock (the
  holder's ``ttl_s``, read from the body) takes the lease over by compare-and-swap on that
  ETag. No clocks are compared between machines; a killed holder blocks others for ``ttl``.
- **give back**: a compare-and-swap to a body marked ``released``, which the next taker swaps
  out. Nothing is ever deleted, so a release can never remove someone else's lease. A lease
  this same process could not give back (the store was unreachable) it takes again at once.

A holder that could not renew for ``ttl`` (a stalled process, a lost network) may find its
lease taken: ``lost`` is set, logged at once, and ``Lease.release`` raises."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from trak_dist.errors import StoreStateError
from trak_dist.remote import LEASE_TTL_S, beside, obstore_store, own_option, remote_error

logger = logging.getLogger(__name__)
POLL_S = 0.5
# names this process in lease bodies: a lease it failed to give back (the store was down) is
# its own to take again at once, not after the ttl
PROCESS = uuid.uuid4().hex
_LIVE: set[str] = set()  # the leases this process holds now (others of its own are leftovers)
_TAKE = threading.Lock()


class Lease:
    """The lease object ``<store>.<name>`` of the object store at ``url``."""

    def __init__(
        self, url: str, name: str, what: str, options: Mapping[str, Any] | None = None
    ) -> None:
        self.url, self.what, self.options = url, what, options
        parent, self.key = beside(url, name)
        self.where = f"{parent}/{self.key}"
        self.ttl = own_option(options, "lease_ttl", LEASE_TTL_S)
        self._store = obstore_store(parent, options, named=url)
        self._id = uuid.uuid4().hex
        self._seq = 0
        self._etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    # ---- taking -----------------------------------------------------------------------------
    def acquire(
        self, until: str = "free", on_busy: Callable[[dict[str, Any]], None] | None = None
    ) -> bool:
        """Take the lease; False when ``until`` says to give up. ``until``: ``"free"`` waits
        until it is released or expires; ``"look"`` gives up at once when it is held;
        ``"renewed"`` gives up when its holder renews it (alive), and takes it once it has
        gone unrenewed for its ttl. ``on_busy`` is called once with the holder's body."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        seen: tuple[str, float] | None = None  # (ETag, when first seen) of someone else's body
        while True:
            try:
                with _TAKE:  # taken and listed as live together (see ``mine``)
                    self._etag = self._put(obstore, mode="create")
                    _LIVE.add(self.where)
                break
            except AlreadyExistsError:
                pass
            held = self._read(obstore)
            if held is None:
                continue  # gone between the two requests: try creating again
            body, etag = held
            now = time.monotonic()
            if (
                seen is not None
                and seen[0] != etag
                and until == "renewed"
                and not body.get("released")
            ):
                return False
            if seen is None or seen[0] != etag:
                if seen is None and on_busy is not None and not body.get("released"):
                    on_busy(body)
                seen = (etag, now)
            expired = now - seen[1] >= float(body.get("ttl_s", self.ttl))
            with _TAKE:
                # this process's own, held by none of its threads: a lease it could not give back
                mine = body.get("process") == PROCESS and self.where not in _LIVE
                if body.get("released") or expired or mine:
                    try:
                        self._etag = self._put(obstore, mode={"e_tag": etag})
                    except PreconditionError:
                        continue  # another waiter was faster
                    _LIVE.add(self.where)
            if body.get("released") or expired or mine:
                if expired and not body.get("released") and not mine:
                    logger.warning(
                        "%s: took over the lease %s of %s (pid %s on %s), not renewed for %.0f s",
                        self.url, self.where, body.get("what"), body.get("pid"), body.get("host"),
                        now - seen[1],
                    )  # fmt: skip
                break
            if until == "look":
                return False
            time.sleep(min(POLL_S, self.ttl / 8))
        self._thread = threading.Thread(target=self._renew, name=f"lease {self.key}", daemon=True)
        self._thread.start()
        return True

    # ---- keeping and giving back ------------------------------------------------------------
    def _renew(self) -> None:
        from obstore.exceptions import PreconditionError

        period = self.ttl / 4
        while not self._stop.wait(period):
            try:
                self._etag = self._put(_obstore(), mode={"e_tag": self._etag})
            except PreconditionError:
                self.lost = True
                logger.error(
                    "%s: lost the lease %s (not renewed for %.0f s, and another process took "
                    "it): another job may be using the store", self.url, self.where, self.ttl,
                )  # fmt: skip
                return
            except Exception as e:  # the network: keep trying while the ttl lasts
                logger.warning("%s: could not renew the lease %s: %s", self.url, self.where, e)

    def release(self) -> None:
        """Give the lease back (StoreStateError: it was lost while held)."""
        from obstore.exceptions import PreconditionError

        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        _LIVE.discard(self.where)
        if self.lost:
            raise StoreStateError(
                f"the lease {self.where} on {self.url} was lost while {self.what} (this process "
                f"did not renew it for {self.ttl:.0f} s and another took it): another job may "
                "have used the store meanwhile. Rerun the same command: it resumes from what was "
                "committed and checks it."
            )
        try:
            self._etag = self._put(_obstore(), mode={"e_tag": self._etag}, released=True)
        except PreconditionError:
            logger.warning(
                "%s: the lease %s was taken before it was given back", self.url, self.where
            )
        except Exception as e:  # it expires by itself; the work it guarded is done
            logger.warning("%s: could not give back the lease %s: %s", self.url, self.where, e)

    # ---- requests ---------------------------------------------------------------------------
    def _put(self, obstore: Any, mode: Any, released: bool = False) -> str:
        self._seq += 1
        body = {
            "holder": self._id,
            "process": PROCESS,
            "seq": self._seq,
            "what": self.what,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "ttl_s": self.ttl,
            "released": released,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            result = obstore.put(self._store, self.key, json.dumps(body).encode(), mode=mode)
        except _conditional_errors():
            raise
        except Exception as e:
            raise remote_error(e, self.url, "write the lease", self.key, self.options) from None
        return str(result["e_tag"])

    def _read(self, obstore: Any) -> tuple[dict[str, Any], str] | None:
        try:
            got = obstore.get(self._store, self.key)
            raw = bytes(got.bytes())
        except FileNotFoundError:
            return None
        except Exception as e:
            raise remote_error(e, self.url, "read the lease", self.key, self.options) from None
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        return (body if isinstance(body, dict) else {}), str(got.meta["e_tag"])


def _obstore() -> Any:
    import obstore

    return obstore


def _conditional_errors() -> tuple[type[Exception], ...]:
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    return (AlreadyExistsError, PreconditionError)
