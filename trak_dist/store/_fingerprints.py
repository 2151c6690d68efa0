"""What ties a store to its inputs: a 64-bit content hash per train and target row, and the
fingerprints of a dataset, a checkpoint file (or folder) and a checkpoint's tensors.

Rows are hashed from the collated batch and stored with them (``H``); reused rows are compared,
so changed data is an error naming the rows. A dataset's fingerprint hashes every row's hash;
a checkpoint's is recorded when it binds a row set, so a reused model_id is caught."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trak_dist.batches import batch_of  # collated exactly as the workers collate
from trak_dist.errors import StoreMismatchError
from trak_dist.remote import local_copy

BLOCK = 1024


def _fields(batch: Any) -> list[tuple[str, Any]]:
    if isinstance(batch, Mapping):
        return [(str(k), v) for k, v in batch.items()]
    if isinstance(batch, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(batch)]
    return [("0", batch)]


def _row_bytes(value: Any, size: int) -> list[bytes]:
    """Each row's bytes of one field of a batch with ``size`` rows."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        header = f"{tuple(t.shape[1:])}{t.dtype}".encode()
        # via uint8 so that dtypes numpy lacks (bfloat16) hash too
        raw = t.reshape(size, -1).view(torch.uint8).numpy()
        return [header + r.tobytes() for r in raw]
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        header = f"{a.shape[1:]}{a.dtype}".encode()
        return [header + r.tobytes() for r in a.reshape(size, -1)]
    if isinstance(value, (list, tuple)) and len(value) == size:
        return [repr(v).encode() for v in value]
    return [repr(value).encode()] * size


def batch_rows(batch: Any) -> int:
    for _, value in _fields(batch):
        if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim:
            return int(value.shape[0])
        if isinstance(value, (list, tuple)):
            return len(value)
    raise ValueError(f"cannot tell the number of rows of a {type(batch).__name__} batch")


def row_hashes(batch: Any) -> np.ndarray:
    """``[B]`` uint64: a hash of each row of a collated batch (every field, its name, dtype
    and shape). Never 0, the store's value for "not written"."""
    size = batch_rows(batch)
    parts = [(name.encode(), _row_bytes(value, size)) for name, value in _fields(batch)]
    out = np.empty(size, dtype=np.uint64)
    for i in range(size):
        h = hashlib.blake2b(digest_size=8)
        for name, rows in parts:
            h.update(name)
            h.update(len(rows[i]).to_bytes(8, "little"))
            h.update(rows[i])
        out[i] = int.from_bytes(h.digest(), "little") or 1
    return out


def dataset_row_hashes(dataset: Any, block: int = BLOCK) -> np.ndarray:
    """``[len(dataset)]`` uint64 row hashes of a map-style dataset, as workers compute them."""
    n = len(dataset)
    out = [row_hashes(batch_of(dataset, s, min(n, s + block))) for s in range(0, n, block)]
    return np.concatenate(out) if out else np.zeros(0, dtype=np.uint64)


def fingerprint(hashes: np.ndarray) -> str:
    """The fingerprint of a dataset from its row hashes (covers every row and the order)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"rows:{len(hashes)}".encode())
    h.update(np.ascontiguousarray(hashes, dtype="<u8").tobytes())
    return h.hexdigest()


def describe_rows(rows: np.ndarray, limit: int = 10) -> str:
    """``rows 3, 17 and 5 more`` for an error message."""
    rows = np.asarray(rows)
    shown = ", ".join(str(int(r)) for r in rows[:limit])
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"row{'s' if len(rows) > 1 else ''} {shown}{more}"


def check_unchanged(
    stored: np.ndarray, fresh: np.ndarray, rows: np.ndarray, what: str, where: str
) -> None:
    """Raise StoreMismatchError naming the ``rows`` whose ``fresh`` hashes differ from the
    ``stored`` ones (0: never written, not compared); ``what`` names them in the message."""
    changed = np.asarray(rows)[(stored != 0) & (stored != fresh)]
    if len(changed):
        raise StoreMismatchError(
            f"the {what} data changed since the store at {where} was featurised: "
            f"{describe_rows(changed)} {'differs' if len(changed) == 1 else 'differ'} from the "
            "items the stored features were computed from. Use a new store path for the new data "
            "(or overwrite this one: "
            "store.overwrite=true, TRAKer(overwrite=True))."
        )


def _update_with_tensor(h: Any, t: torch.Tensor | np.ndarray) -> None:
    h.update(f"{tuple(t.shape)}{t.dtype}".encode())
    if isinstance(t, torch.Tensor):
        # via uint8 so that dtypes numpy lacks (bfloat16) hash too
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    else:
        h.update(np.ascontiguousarray(t).tobytes())


def dataset_fingerprint(dataset: Any) -> str:
    """A content hash of every item, in order (``fingerprint`` of its row hashes). It reads
    each item once: pass your own fingerprint when that is too expensive (reused rows are still
    checked against their stored hashes)."""
    return fingerprint(dataset_row_hashes(dataset))


def file_fingerprint(path: str | Path, block: int = 1 << 22) -> str:
    """Hash of a file's bytes (a checkpoint file, to catch a reused model_id); for a directory
    (a Hugging Face checkpoint), of every file's relative name and bytes. A URL: its local
    copy's, so a node's download is checked against the fingerprint the store's rows hold."""
    h = hashlib.blake2b(digest_size=16)
    root = local_copy(path)  # a URL's copy on this node (remote/_fetch.py)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    for file in files:
        if root.is_dir():
            h.update(file.relative_to(root).as_posix().encode() + b"\0")
        with open(file, "rb") as f:
            while chunk := f.read(block):
                h.update(chunk)
    return h.hexdigest()


def checkpoint_fingerprint(
    state_dict: Mapping[str, Any], names: Iterable[str] | None = None
) -> str:
    """Hash of a checkpoint's tensors (all, or ``names``), to catch a reused model_id."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(state_dict) if names is None else names:
        value = state_dict[name]
        h.update(name.encode())
        if isinstance(value, torch.Tensor):
            _update_with_tensor(h, value)
    return h.hexdigest()
