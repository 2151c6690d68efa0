"""Removing a failed score set's folder while zarr's writes are still in flight
(``trak_dist/store/scores/_files.py``; docs/design.md, "bad input loses nothing")."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from zarr.core import sync as zsync
from zarr.core.buffer import default_buffer_prototype
from zarr.storage import LocalStore

from trak_dist.store.scores._files import REMOVE_SETTLE_S, remove_dir


def _lagging_write(root: Path, key: str, delay: float) -> asyncio.Future:
    """A zarr write on zarr's own I/O loop that lands ``delay`` s from now, as a sibling write
    of a failed gather does: LocalStore makes the key's parent folders first."""
    store = LocalStore(root)
    body = default_buffer_prototype().buffer.from_bytes(b"{}")

    async def write() -> None:
        await asyncio.sleep(delay)
        await store.set(key, body)

    return asyncio.run_coroutine_threadsafe(write(), zsync._get_loop())  # type: ignore[return-value]


def test_a_folder_a_lagging_zarr_write_recreates_is_removed_after_it(tmp_path):
    """The write lands after the settle time, which alone gave up on it before (a
    ``.partial-`` folder was left behind by a full-disk test under load, 2026-11-29)."""
    partial = tmp_path / "v.partial-0123456789ab"
    (partial / "c").mkdir(parents=True)
    late = REMOVE_SETTLE_S + 0.5
    pending = _lagging_write(tmp_path, f"{partial.name}/c/zarr.json", late)
    t0 = time.monotonic()
    remove_dir(partial)
    assert time.monotonic() - t0 >= late  # it waited for the write in flight
    pending.result(timeout=5)
    assert not partial.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_folder_never_made_is_no_error(tmp_path):
    remove_dir(tmp_path / "v.partial-never")
    assert list(tmp_path.iterdir()) == []
