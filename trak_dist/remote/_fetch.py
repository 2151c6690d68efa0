"""Inputs on object storage (checkpoints, Hugging Face directories, data files and
``save_to_disk`` directories named by ``s3://…`` URLs): fetched once per node into a local
cache, where everything that reads files by path reads them.

A URL names an object (a file) or a prefix (a directory: every object under it). Its copy lives
in ``$TRAK_DIST_CACHE/inputs/<hash of the URL>/<hash of the listing>/<name>`` (default cache
``~/.cache/trak_dist``): the listing's sizes and ETags name the version, so a changed object is
fetched again into a new folder and an unchanged one is reused without a download (one listing
request per process). Copies are written to a temporary folder, checked against the listing's
sizes and ETags, then renamed into place, so a killed fetch leaves no copy that looks whole.

What a copy holds is then checked like any local input: a checkpoint's bytes against the
fingerprint its store rows are bound to, data rows against their stored hashes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

from trak_dist.errors import ConfigError, DataError
from trak_dist.remote._client import obstore_store
from trak_dist.remote._errors import remote_error
from trak_dist.remote._urls import is_url, local_path

logger = logging.getLogger(__name__)
CACHE_ENV = "TRAK_DIST_CACHE"
_fetched: dict[str, Path] = {}
_lock = threading.Lock()


def cache_root() -> Path:
    """Where fetched inputs go: ``$TRAK_DIST_CACHE/inputs`` or ``~/.cache/trak_dist/inputs``."""
    base = os.environ.get(CACHE_ENV) or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "trak_dist"
    )
    return Path(base).expanduser().resolve() / "inputs"


def local_copy(ref: str | Path, what: str = "input") -> Path:
    """A local path for ``ref``: itself, or the local copy of a URL (fetched on first use in
    this process unless the cache holds this version; ConfigError: nothing there)."""
    if not is_url(ref):
        return Path(local_path(str(ref)))
    url = str(ref).rstrip("/")
    with _lock:  # one fetch per URL and process, whatever thread asks
        if url not in _fetched:
            _fetched[url] = _fetch(url, what)
        return _fetched[url]


def _split(url: str) -> tuple[str, str]:
    scheme, rest = url.split("://", 1)
    bucket, _, key = rest.partition("/")
    return f"{scheme}://{bucket}", key


def _listing(store: Any, key: str, url: str, what: str) -> list[dict[str, Any]]:
    """``[{"key", "name", "size", "e_tag"}]``: the object ``key``, else every object under it."""
    import obstore

    try:
        meta = obstore.head(store, key) if key else None
        if meta is not None:
            return [{"key": key, "name": "", "size": meta["size"], "e_tag": meta["e_tag"]}]
    except FileNotFoundError:
        pass
    except Exception as e:
        raise remote_error(e, url, "look up", key, None) from None
    try:
        found = [o for batch in obstore.list(store, f"{key}/" if key else None) for o in batch]
    except Exception as e:
        raise remote_error(e, url, "list", key, None) from None
    if not found:
        raise ConfigError(f"{what}={url!r}: no object and no prefix with objects there.")
    strip = len(key) + 1 if key else 0
    return sorted(
        ({"key": o["path"], "name": o["path"][strip:], "size": o["size"], "e_tag": o["e_tag"]}
         for o in found),
        key=lambda o: o["key"],
    )  # fmt: skip


def _fetch(url: str, what: str) -> Path:
    import obstore
    from obstore.exceptions import BaseError

    container, key = _split(url)
    store = obstore_store(container, named=url)
    listing = _listing(store, key, url, what)
    version = hashlib.sha256(
        json.dumps([(o["name"], o["size"], o["e_tag"]) for o in listing]).encode()
    ).hexdigest()[:16]
    name = key.rsplit("/", 1)[-1] or container.split("://", 1)[1]
    home = cache_root() / hashlib.sha256(url.encode()).hexdigest()[:16]
    dest = home / version / name
    if dest.exists():
        return dest
    tmp = home / f".partial-{uuid.uuid4().hex[:12]}"
    nbytes = 0
    try:
        for o in listing:
            target = tmp / name / o["name"] if o["name"] else tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            size = 0
            try:
                got = obstore.get(store, o["key"])
                with open(target, "wb") as f:  # streamed: checkpoints can be larger than RAM
                    for part in got.stream():
                        size += f.write(memoryview(part))
            except BaseError as e:  # the store's; the local disk's OSErrors stay as they are
                raise remote_error(e, url, "read", o["key"], None) from None
            if size != o["size"] or got.meta["e_tag"] != o["e_tag"]:
                raise DataError(
                    f"{what}={url!r}: {o['key']} changed while it was fetched (size "
                    f"{size} vs {o['size']} listed); rerun once it is no longer written."
                )
            nbytes += size
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp / name, dest)
        except OSError:
            if not dest.exists():  # else another process on this node was faster
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("fetched %s (%d objects, %d bytes) into %s", url, len(listing), nbytes, dest)
    return dest
