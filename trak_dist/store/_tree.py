"""The store's nodes as folders and files, through the Zarr store (a directory or an object
store alike): what ``verify``, ``repair`` and the metadata check walk, without Zarr's own
listing (which reads, and warns about, every child's metadata)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from zarr.abc.store import Store
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import LocalStore

META = "zarr.json"


class Tree:
    """Folders (key prefixes) and files (keys) of the Zarr store ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def entries(self, rel: str) -> tuple[list[str], list[str]]:
        """(sub-folders, files) directly under ``rel`` (``""``: the root), sorted."""
        if isinstance(self.store, LocalStore):
            base = self.store.root / rel
            if not base.is_dir():
                return [], []
            found = list(base.iterdir())
            return (
                sorted(p.name for p in found if p.is_dir()),
                sorted(p.name for p in found if p.is_file()),
            )
        remote: Any = self.store  # a RemoteZarrStore (_object_store.py)
        return await remote.entries(rel)

    async def holds_objects(self, rel: str) -> bool:
        """Whether anything but empty folders is under ``rel``."""
        if isinstance(self.store, LocalStore):
            return any(p.is_file() for p in (self.store.root / rel).rglob("*"))
        remote: Any = self.store
        return bool(await remote.holds_objects(rel))

    async def read(self, key: str) -> bytes | None:
        buf = await self.store.get(key, default_buffer_prototype())
        return None if buf is None else buf.to_bytes()

    def children(self, rel: str) -> list[str]:
        """Child nodes of ``rel``: its sub-folders that hold a ``zarr.json``."""

        async def run() -> list[str]:
            folders, _ = await self.entries(rel)
            path = f"{rel}/" if rel else ""
            have = await asyncio.gather(*(self.store.exists(f"{path}{f}/{META}") for f in folders))
            return [f for f, ok in zip(folders, have, strict=True) if ok]

        return list(sync(run()))

    def metadata(self, rel: str) -> dict[str, Any] | None:
        """The parsed ``zarr.json`` of node ``rel``; None: missing or not JSON."""
        raw = sync(self.read(f"{rel}/{META}" if rel else META))
        try:
            meta = json.loads(raw) if raw is not None else None
        except ValueError:
            return None
        return meta if isinstance(meta, dict) else None

    def remove(self, rel: str) -> None:
        """Delete the node ``rel`` with everything under it."""
        sync(self.store.delete_dir(rel))

    def files(self, rel: str) -> list[str]:
        """Every key under ``rel``, recursively."""

        async def run() -> list[str]:
            return [k async for k in self.store.list_prefix(rel)]

        return list(sync(run()))
