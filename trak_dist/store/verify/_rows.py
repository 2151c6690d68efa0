"""``store verify`` of row sets: every committed chunk (each of its column chunks) and every
writer's staged rows of chunks not committed yet; and the problems verify reports."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trak_dist.errors import StoreDamagedError
from trak_dist.store import _layout as layout
from trak_dist.store._integrity import chunk_damage
from trak_dist.store._layout import STAGED
from trak_dist.store._rows import RowSet
from trak_dist.store._staging import Shadow
from trak_dist.store._store import FeatureStore
from trak_dist.store._tree import Tree
from trak_dist.store._zarr import group


@dataclass(frozen=True)
class Problem:
    """Something wrong in the store and what repair does about it.

    Attributes:
        node: the node's path (``train/0/X``); ``what``: what is wrong, for people.
        uncommit: (row set path, chunk) or (``eval/<exp>``, model) to un-commit.
        recommit: (path, chunk or model) whose flag is unreadable but data whole.
        drop: node paths repair removes (the next run recomputes them).
    """

    node: str
    what: str
    uncommit: tuple[str, int] | None = None
    drop: tuple[str, ...] = ()
    recommit: tuple[str, int] | None = None

    @property
    def repairable(self) -> bool:
        return self.uncommit is not None or self.recommit is not None or bool(self.drop)


@dataclass
class Report:
    where: str
    problems: list[Problem] = field(default_factory=list)
    chunks_checked: int = 0
    stray_files: list[str] = field(default_factory=list)


def children(base: Tree, rel: str) -> list[str]:
    """Child nodes of ``rel``, from the store's listing (Zarr's reads their metadata)."""
    return base.children(rel)


def attrs(base: Tree, rel: str) -> dict[str, object]:
    meta = base.metadata(rel) or {}
    found = meta.get("attributes", {})
    return found if isinstance(found, dict) else {}


def scores_using(base: Tree, model_id: int, exp: str | None = None) -> list[str]:
    """Score sets (of ``exp``, or of every experiment) computed with checkpoint ``model_id``."""
    out = []
    for e in children(base, layout.SCORES) if exp is None else [exp]:
        for v in children(base, layout.scores(e)):
            ids = attrs(base, layout.scores(e, v)).get("model_ids")
            if not isinstance(ids, list) or model_id in ids:
                out.append(layout.scores(e, v))
    return out


def check_rows(store: FeatureStore, rel: str, report: Report, torn: set[str]) -> None:
    base = Tree(store.root.store)
    rows = RowSet(group(store.root, rel))
    node = layout.parse(rel)
    mid = int(node.model_id or 0)
    derived = (
        (layout.xtx(mid), layout.factors(mid), *scores_using(base, mid))
        if node.is_train
        else tuple(scores_using(base, mid, node.exp))
    )
    committed, unreadable = rows.flags.with_unreadable()
    for c in np.flatnonzero(committed | unreadable).tolist():
        report.chunks_checked += 1
        damage = []
        for arr in rows.arrays():
            for coords in layout.chunk_coords(arr, c):  # every column chunk of a wide X
                d = chunk_damage(arr, coords)
                if d is not None:
                    damage.append(Problem(arr.path, str(d), (rel, c), derived))
                    break
        if not unreadable[c]:
            report.problems += damage
            continue
        flag = f"{rel}/done chunk {c} (rows {_span(rows, c)}) fails its checksum"
        if damage:  # not whole: whatever the flag said, the chunk is featurised again
            report.problems.append(Problem(f"{rel}/done", f"{flag}; its data is not whole"))
            # un-committed, with what may have been derived from it (if it never was committed,
            # nothing was: reductions need every chunk)
            report.problems += damage
        else:
            report.problems.append(
                Problem(f"{rel}/done", f"{flag}; its data is whole", recommit=(rel, c))
            )
    _check_staged(base, rows, rel, committed, report, torn)


def _span(rows: RowSet, c: int) -> str:
    return "[{}, {})".format(*rows.flags.span(c))


def spans(rows: RowSet, chunks: set[int]) -> str:
    """``[0, 256), [512, 768)``: the rows of ``chunks``, for messages."""
    return ", ".join(_span(rows, c) for c in sorted(chunks))


def _check_staged(
    base: Tree, rows: RowSet, rel: str, committed: np.ndarray, report: Report, torn: set[str]
) -> None:
    """Every writer's staged rows in chunks not committed yet: flags readable, flagged rows
    present, intact and finite. A damaged shadow is dropped whole (its rows are featurised
    again); nothing was derived from staged rows."""
    for name in children(base, f"{rel}/{STAGED}"):
        path = layout.shadow(rel, name)
        if any(t == path or t.startswith(path + "/") for t in torn):
            continue  # reported with its metadata; repair drops it
        node = group(rows.group, f"{STAGED}/{name}")
        if "has" not in node:
            continue  # a writer killed while creating it: never read, removed by a full fold
        shadow = Shadow(node)
        for c in np.flatnonzero(~committed).tolist():
            start, end = rows.flags.span(c)
            try:
                has = shadow.rows(start, end)
            except StoreDamagedError as e:
                report.problems += [Problem(path, str(d), drop=(path,)) for d in e.damage]
                break
            if not has.any():
                continue
            report.chunks_checked += 1
            arrays = [shadow.X, shadow.H, *shadow.g_draws]
            arrays += [shadow.Q] if shadow.Q is not None else []
            found = [chunk_damage(a, xy, has) for a in arrays for xy in layout.chunk_coords(a, c)]
            problems = [Problem(path, str(d), drop=(path,)) for d in found if d]
            if problems:
                report.problems += problems
                break  # the whole shadow goes: one report per shadow is enough


def check_same_items(
    store: FeatureStore, train_sets: list[tuple[int, RowSet]], report: Report
) -> None:
    ref: tuple[int, np.ndarray] | None = None
    for c, rows in train_sets:
        h = rows.read_hashes(slice(0, rows.n))
        if ref is None:
            ref = (c, h)
            continue
        both = (h != 0) & (ref[1] != 0)
        diff = np.flatnonzero(both & (h != ref[1]))
        if len(diff):
            report.problems.append(
                Problem(
                    layout.train(c),
                    f"{layout.train(c)} and {layout.train(ref[0])} were featurised from "
                    f"different items at {len(diff)} rows (first: {diff[:5].tolist()}); not "
                    "repairable: featurise every checkpoint from the same data into a new store "
                    "path",
                )
            )
