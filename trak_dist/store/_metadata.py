"""Metadata a store is opened with: every ``zarr.json`` of a store must parse (a row set's
metadata holds its checkpoint); ``trak-dist store repair`` drops what torn files describe.
Walked through the Zarr store (``_tree.py``), so object stores are checked alike. Also the
root's ``trak_dist`` attribute (``store_meta``) and removing a store (``remove_store``)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from zarr.abc.store import Store
from zarr.core.sync import sync

from trak_dist.errors import StoreMismatchError, StoreStateError
from trak_dist.remote import is_url, local_path
from trak_dist.store._layout import CONTAINERS, EVAL, ROW_GROUPS
from trak_dist.store._object_store import open_zarr
from trak_dist.store._spec import FORMAT_VERSION
from trak_dist.store._tree import META, Tree

logger = logging.getLogger(__name__)
ATTR = "trak_dist"  # the root attribute that holds the spec and codec

# how long a node's metadata may be half written by another process before it counts as torn
SETTLE_LOOKS = 4
SETTLE_S = 0.25


def settled_unreadable(store: Store | str | Path) -> list[str]:
    """:func:`unreadable_metadata`, less nodes another process is creating right now (Zarr
    writes a folder before its ``zarr.json``, non-atomically): only what stays unreadable for
    about a second is reported."""
    bad = set(unreadable_metadata(store))
    for _ in range(SETTLE_LOOKS):
        if not bad:
            break
        time.sleep(SETTLE_S)
        bad &= set(unreadable_metadata(store))
    return sorted(bad)


def check_metadata(store: Store, where: str) -> None:
    """Raise StoreStateError naming every unreadable ``zarr.json`` of the store ``where``."""
    folders, files = sync(Tree(store).entries(""))
    if META not in files and not any(c in folders for c in ROW_GROUPS):
        return  # no store here yet (a traker save_dir may hold a "scores" folder of its own)
    bad = settled_unreadable(store)
    if not bad:
        return
    if "" in bad:
        raise StoreStateError(
            f"the store's root metadata {where}/zarr.json is unreadable (cut short, "
            "missing or not Zarr JSON). It holds the store's settings, which cannot be rebuilt: "
            "featurise into a new store path (or overwrite this one: store.overwrite=true, "
            "TRAKer(overwrite=True))."
        )
    files_ = ", ".join(f"{where}/{b}/zarr.json" for b in bad)
    raise StoreStateError(
        f"unreadable metadata in the store at {where}: {files_} (cut short, missing or not "
        f"Zarr JSON). Run `trak-dist store repair {where}`: it drops what these files "
        "describe, and the next run recomputes it."
    )


def unreadable_metadata(store: Store | str | Path) -> list[str]:
    """Node paths (``""``: root) whose ``zarr.json`` is missing, cut short or not Zarr v3.
    Chunk folders and foreign folders (a traker ``save_dir``) are skipped; ``eval/`` only when
    it has metadata of its own. Each level of the tree is listed and read concurrently."""
    if not isinstance(store, Store):
        store = open_zarr(str(store), read_only=True)
    tree = Tree(store)
    bad: list[str] = []

    async def visit(rel: str) -> list[str]:
        (folders, files), raw = await asyncio.gather(
            tree.entries(rel), tree.read(f"{rel}/{META}" if rel else META)
        )
        node_type = _node_type(raw) if META in files else None
        # (a folder with nothing in it but folders holds nothing to read: SeaweedFS lists the
        # folders of deleted objects, as a file system lists empty directories)
        if node_type is None and (rel == "" or files or await tree.holds_objects(rel)):
            bad.append(rel)
        if rel == "":
            eval_meta = EVAL in folders and await store.exists(f"{EVAL}/{META}")
            folders = [d for d in folders if d in CONTAINERS and (d != EVAL or eval_meta)]
        elif node_type != "group":
            # an array's chunks (or a node we cannot read): nothing below is metadata we own
            folders = [d for d in folders if d != "c"] if node_type is None else []
        return [f"{rel}/{d}" if rel else d for d in folders]

    async def walk() -> None:
        level = [""]
        while level:
            found = await asyncio.gather(*(visit(rel) for rel in level))
            level = [child for children in found for child in children]

    sync(walk())
    return sorted(bad)


def _node_type(raw: bytes | None) -> str | None:
    try:
        meta = json.loads(raw) if raw is not None else None
    except ValueError:
        return None
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3:
        return None
    kind = meta.get("node_type")
    return kind if kind in ("group", "array") else None


def store_meta(meta: object, where: str) -> dict[str, Any]:
    """The store's ``trak_dist`` attribute, checked (StoreMismatchError: not a trak_dist store,
    or another format)."""
    if not isinstance(meta, dict):
        raise StoreMismatchError(
            f"{where} is a Zarr group but not a trak_dist store (no '{ATTR}' metadata). "
            "Point save_dir/store at a new or trak_dist-written path."
        )
    version = meta.get("spec", {}).get("format_version")
    if version != FORMAT_VERSION:
        raise StoreMismatchError(
            f"{where} is a trak_dist store of format {version}; this trak_dist reads format "
            f"{FORMAT_VERSION} (checksummed chunks, per-row item hashes, reductions marked "
            "complete), so the stored features cannot be checked. Featurise into a new store "
            "path (or overwrite this one: store.overwrite=true, "
            "TRAKer(overwrite=True))."
        )
    return meta


def remove_store(zstore: Store, where: str) -> None:
    """Delete the store at ``where`` (``store.overwrite``)."""
    if is_url(where):
        logger.warning("overwriting the existing store at %s", where)
        sync(zstore.delete_dir(""))
    elif Path(local_path(where)).exists():
        logger.warning("overwriting the existing store at %s", where)
        shutil.rmtree(local_path(where))
