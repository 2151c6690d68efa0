"""Where everything lives in a trak_dist store, and how its arrays are chunked.

The one module that names the store's nodes: everyone builds paths with the functions below
and classifies them with ``parse``. Layout (one Zarr v3 group)::

    attrs["trak_dist"]            FeatureSpec + codec
    train/<model_id>/             row set: X [n, p], Q [n], H [n], done [chunks], and
                                  G [n, p] with spec.curvature = fisher;
                                  attrs["checkpoint"]: bound at the first commit
    train/<model_id>/xtx          [p, p] float64 XᵀX (GᵀG with spec.curvature = fisher) once
                                  every chunk is committed
    train/<model_id>/factor/p<k>/ eigenvalues [k], eigenvectors [k, k] of XᵀX[:k, :k]
    targets/<exp>/                attrs: num_targets, fingerprint
    targets/<exp>/<model_id>/     row set: X [m, p], H [m], done
    <row set>/staged/<writer>/    one writer's staged rows: X, Q, H, has (G … with fisher);
                                  attrs["checkpoint"]
    scores/<exp>/<variant>/       S, top-k arrays, Y/<model_id>; ``.partial-``/``.old-`` beside
    eval/<exp>/                   masks, margins, done (LDS subset models)

Chunks are bounded in bytes (``CHUNK_BYTES``) along both axes: ``min(chunk_rows, n)`` rows (the
commit unit) and as many columns as fit, so a wide X (p = 11.7M) is not one huge chunk that Zarr
allocates and compares whole on every write. One owner writes all column chunks of a row chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import zarr

TRAIN, TARGETS, SCORES, EVAL = "train", "targets", "scores", "eval"
# the store's top-level groups; nothing else is ours (eval/ is made by the first `trak-dist eval`)
CONTAINERS = (TRAIN, TARGETS, SCORES, EVAL)
ROW_GROUPS = (TRAIN, TARGETS)  # only trak_dist makes these; traker makes "scores" too
STAGED = "staged"
XTX, FACTOR, Y = "xtx", "factor", "Y"
ROW_ARRAYS = ("X", "Q", "H", "done")
EVAL_ARRAYS = ("masks", "margins", "done")
TOPK_ARRAYS = ("proponents_idx", "proponents_val", "opponents_idx", "opponents_val")
CHECKPOINT = "checkpoint"  # a row set's (and a shadow's) checkpoint fingerprint attribute
PARTIAL, OLD = ".partial-", ".old-"  # score sets being written / being replaced
CHUNK_BYTES = 64 << 20  # the most bytes one chunk of any array holds (before compression)
ROW_CHUNK_BYTES = 16 << 20  # what ``store.chunk_rows: auto`` aims a row chunk at
MIN_CHUNK_ROWS = 256  # ``auto``'s fewest rows per chunk (the fixed default before it)


# ---- paths -------------------------------------------------------------------------------------
def train(model_id: int) -> str:
    return f"{TRAIN}/{int(model_id)}"


def xtx(model_id: int) -> str:
    return f"{train(model_id)}/{XTX}"


def factors(model_id: int) -> str:
    return f"{train(model_id)}/{FACTOR}"


def factor(model_id: int, proj_dim: int) -> str:
    return f"{factors(model_id)}/p{int(proj_dim)}"


def experiment(exp: str) -> str:
    return f"{TARGETS}/{exp}"


def targets(exp: str, model_id: int) -> str:
    return f"{experiment(exp)}/{int(model_id)}"


def scores(exp: str, variant: str | None = None) -> str:
    return f"{SCORES}/{exp}" if variant is None else f"{SCORES}/{exp}/{variant}"


def y(model_id: int) -> str:
    """``Y`` of one checkpoint, inside its score set (X_target K⁻¹, kept for new targets)."""
    return f"{Y}/{int(model_id)}"


def eval_set(exp: str) -> str:
    return f"{EVAL}/{exp}"


def shadow(rows: str, writer: str) -> str:
    return f"{rows}/{STAGED}/{writer}"


def is_leftover(name: str) -> bool:
    """A partial or replaced score set left behind by a killed scoring."""
    return PARTIAL in name or OLD in name


# ---- what a path is ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Node:
    """What a path of the store is.

    Attributes:
        kind: ``root``, ``container``, ``experiment``, ``rows``, ``staged``, ``xtx``,
            ``factors``, ``scores``, ``score_set``, ``eval`` or ``other``.
        path: the node's own path, cut to its unit (row set, shadow, score set, eval set,
            ``xtx``, factorisation).
        model_id, exp: the checkpoint and experiment the path names, if any.
    """

    kind: str
    path: str
    model_id: int | None = None
    exp: str | None = None

    @property
    def is_train(self) -> bool:
        return self.path.startswith(f"{TRAIN}/")


def _mid(part: str) -> int | None:
    return int(part) if part.isdigit() else None


def parse(rel: str) -> Node:
    """Classify ``rel`` (a path in the store, ``""`` for the root)."""
    parts = [p for p in rel.split("/") if p]
    if not parts:
        return Node("root", "")
    top = parts[0]
    if len(parts) == 1:
        return Node("container" if top in CONTAINERS else "other", top)
    if top in ROW_GROUPS:
        depth = 2 if top == TRAIN else 3  # train/<id>, targets/<exp>/<id>
        exp = parts[1] if top == TARGETS else None
        if len(parts) < depth:
            return Node("experiment", "/".join(parts), exp=exp)
        rows = "/".join(parts[:depth])
        mid, rest = _mid(parts[depth - 1]), parts[depth:]
        if rest and rest[0] == STAGED:
            return Node("staged", "/".join(parts[: depth + 2]), mid, exp)
        if top == TRAIN and rest and rest[0] == XTX:
            return Node("xtx", f"{rows}/{XTX}", mid)
        if top == TRAIN and rest and rest[0] == FACTOR:
            return Node("factors", "/".join(parts[: depth + 2]), mid)
        return Node("rows", rows, mid, exp)
    if top == SCORES:
        if len(parts) == 2:
            return Node("scores", "/".join(parts), exp=parts[1])
        return Node("score_set", "/".join(parts[:3]), exp=parts[1])
    if top == EVAL:
        return Node("eval", "/".join(parts[:2]), exp=parts[1])
    return Node("other", "/".join(parts))


def describe(rel: str) -> str:
    """Whose rows a row set holds, for messages: ``train rows of model_id=0``."""
    node = parse(rel)
    if node.kind == "rows" and node.is_train:
        return f"train rows of model_id={node.model_id}"
    if node.kind == "rows":
        return f"target rows of experiment {node.exp!r}, model_id={node.model_id}"
    return f"rows of {rel}"


# ---- chunks ------------------------------------------------------------------------------------
def bounded_chunks(
    shape: tuple[int, ...], itemsize: int, rows: int | None = None, cap: int | None = None
) -> tuple[int, ...]:
    """Chunk shape of an array: ``rows`` rows (default: all, at most what fits ``cap``), and the
    columns split into equal chunks of at most ``cap`` bytes (default ``CHUNK_BYTES``) with
    those rows."""
    cap = CHUNK_BYTES if cap is None else cap
    if not shape:
        return (1,)
    r = max(1, min(shape[0], rows if rows is not None else shape[0]))
    width = math.prod(shape[1:]) if len(shape) > 1 else 1
    if rows is None:
        r = max(1, min(r, cap // max(1, width * itemsize)))
    if len(shape) == 1:
        return (r,)
    most = max(1, cap // (r * itemsize))
    cols = shape[1] if shape[1] <= most else math.ceil(shape[1] / math.ceil(shape[1] / most))
    return (r, max(1, cols), *shape[2:])


def auto_chunk_rows(n: int, row_bytes: int) -> int:
    """``store.chunk_rows: auto``: the power of two of rows whose chunk holds about
    ``ROW_CHUNK_BYTES`` of a row set's arrays (``row_bytes`` per row: X, and G per label draw),
    at least ``MIN_CHUNK_ROWS``, and at most an eighth of the train set, so that shards still
    spread over workers. Each row chunk is a file (or object) per array and a commit flag; a
    file's creation costs as much as writing megabytes on a local disk, so small chunks, not
    bytes, set a store's pace (docs/store.md, "Speed")."""
    want = max(1, ROW_CHUNK_BYTES // max(1, row_bytes))
    rows = 1 << max(0, round(math.log2(want)))
    eighth = 1 << max(0, (max(1, n // 8)).bit_length() - 1)
    return max(MIN_CHUNK_ROWS, min(rows, eighth))


def resolve_chunk_rows(
    chunk_rows: int | str,
    n: int,
    row_bytes: int,
    shard_rows: int | None = None,
    stored: Any = None,
) -> int:
    """``store.chunk_rows`` as a number: an int as given; ``auto``: the chunk rows of the store
    already there (``stored``, its FeatureSpec: a store written before keeps its layout), else
    ``auto_chunk_rows``, halved until it divides ``shard_rows`` where one is given (a
    multiple of 256 or a power of two keeps the whole rule)."""
    if chunk_rows != "auto":
        return int(chunk_rows)
    if stored is not None:
        return int(stored.chunk_rows)
    rows = auto_chunk_rows(n, row_bytes)
    while shard_rows and shard_rows % rows and rows > MIN_CHUNK_ROWS:
        rows //= 2
    return rows


def row_chunks(n: int, width: int, chunk_rows: int, itemsize: int) -> tuple[int, int]:
    """Chunk shape of a row set's ``X [n, width]``: ``min(chunk_rows, n)`` rows (the commit
    unit), columns bounded by ``CHUNK_BYTES``."""
    r, c = bounded_chunks((n, width), itemsize, rows=chunk_rows)
    return r, c


def chunk_coords(arr: zarr.Array[Any], row_chunk: int) -> list[tuple[int, ...]]:
    """The chunk coordinates of every chunk of ``arr`` in row chunk ``row_chunk``."""
    rest = [range(math.ceil(s / c)) for s, c in zip(arr.shape[1:], arr.chunks[1:], strict=True)]
    out: list[tuple[int, ...]] = [(row_chunk,)]
    for r in rest:
        out = [(*o, j) for o in out for j in r]
    return out


def column_blocks(arr: zarr.Array[Any]) -> list[slice]:
    """The column spans of ``arr``'s chunks (one slice for 1-D arrays or a single column chunk)."""
    if arr.ndim < 2:
        return [slice(None)]
    width, step = arr.shape[1], arr.chunks[1]
    return [slice(c, min(width, c + step)) for c in range(0, width, step)]
