"""``trak-dist store verify|repair``: check every committed chunk, staged row and reduction of a
local store; un-commit what is damaged and drop what was derived from it, so the next run
recomputes just that.

- a damaged committed chunk of X, Q or H (checksum, missing, non-finite): un-committed, with
  the reductions built from its row set (XᵀX, factors, score sets using its checkpoint);
- a damaged commit flag: rewritten if the chunk's data is whole, else un-committed;
- damaged staged rows: that writer's shadow is dropped (staged rows are in no reduction);
- a damaged, incomplete or left-over reduction: dropped and recomputed;
- unreadable metadata: the node is dropped with what was derived from it (not the root's);
- a damaged subset model of ``eval/<exp>``: un-done (the next ``trak-dist eval`` retrains it);
  a bad done flag is rewritten when margins and mask are whole; a settings-less group is dropped;
- rows of one checkpoint hashed from other items than another's: not repairable (user's call).

``repair`` (``_repair.py``) acts on the report. Run it while no job writes the store: it takes
the store lock, which the driver holds while featurising but TRAKer only while folding.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from zarr.core.sync import sync

from trak_dist.errors import StoreStateError
from trak_dist.remote import is_url
from trak_dist.store import _layout as layout
from trak_dist.store._eval import EvalSet
from trak_dist.store._integrity import chunk_damage
from trak_dist.store._layout import CONTAINERS, EVAL, EVAL_ARRAYS, ROW_ARRAYS, TOPK_ARRAYS
from trak_dist.store._metadata import unreadable_metadata
from trak_dist.store._object_store import open_zarr
from trak_dist.store._rows import RowSet
from trak_dist.store._store import FeatureStore
from trak_dist.store._tree import Tree
from trak_dist.store._zarr import array, group
from trak_dist.store.verify._rows import (
    Problem,
    Report,
    check_rows,
    check_same_items,
    children,
    scores_using,
)


def _for_torn(base: Tree, rel: str) -> tuple[str, ...]:
    """What to drop when the metadata of node ``rel`` is unreadable."""
    node = layout.parse(rel)
    mid, exp = node.model_id, node.exp
    if node.kind in ("staged", "xtx", "factors", "score_set", "eval", "scores"):
        # one writer's shadow (only staged rows go), a reduction, or what an eval holds;
        # a torn XᵀX takes its factorisations along
        if node.kind == "xtx" and mid is not None:
            return (node.path, layout.factors(mid))
        return (node.path,)
    if node.kind == "container":
        return (rel, layout.SCORES) if rel in layout.ROW_GROUPS else (rel,)
    if node.kind == "experiment":
        return (node.path, layout.scores(str(exp)))
    if node.kind == "rows":  # its checkpoint binding is unknown: featurised again
        if mid is None:
            return (node.path, layout.SCORES if node.is_train else layout.scores(str(exp)))
        return (node.path, *scores_using(base, mid, exp))
    return ()


def _check_reduction(
    store: FeatureStore, rel: str, names: tuple[str, ...], drop: tuple[str, ...], report: Report
) -> None:
    """The arrays ``names`` of node ``rel`` (XᵀX, a factorisation, a score set): complete
    (data written before the flag), present and intact; else repair drops ``drop``."""
    node = group(store.root, rel)

    def problem(what: str) -> None:
        report.problems.append(Problem(drop[0], what, drop=drop))

    if node.attrs.get("complete") is False:
        return problem(f"{rel} is incomplete (a run stopped writing it)")
    for name in names:
        if name not in node:
            return problem(f"{rel}/{name} is absent")
        arr = array(node, name)
        if arr.attrs.get("complete") is False:
            return problem(f"{arr.path} is incomplete (a run stopped writing it)")
        spans = [range(-(-s // c)) for s, c in zip(arr.shape, arr.chunks, strict=True)]
        for coords in itertools.product(*spans):
            d = chunk_damage(arr, coords)
            if d is not None:
                return problem(str(d))
    return None


def _check_eval(store: FeatureStore, rel: str, report: Report) -> None:
    """Every subset model of ``eval/<exp>``: its mask intact and the one its settings define,
    and, once done, its margins present, intact and finite (see the module docstring)."""
    node = group(store.root, rel)
    if "num_targets" not in node.attrs:
        what = f"{rel} is incomplete (an evaluation stopped while creating it)"
        report.problems.append(Problem(rel, what, drop=(rel,)))
        return
    missing = [a for a in EVAL_ARRAYS if a not in node]
    if missing:
        report.problems.append(Problem(rel, f"{rel}/{missing[0]} is absent", drop=(rel,)))
        return
    ev = EvalSet(node)
    done, unreadable = ev.done_flags()
    for j in range(ev.num_models):
        report.chunks_checked += 1
        found = [ev.mask_damage(j)]
        if done[j] or unreadable[j]:
            found.append(chunk_damage(ev.margins, (j, 0)))
        damage = [Problem(d.array, str(d), uncommit=(rel, j)) for d in found if d is not None]
        if unreadable[j]:
            flag = f"{rel}/done of subset model {j} fails its checksum"
            if damage:
                report.problems.append(Problem(f"{rel}/done", f"{flag}; its margins are not whole"))
            else:
                report.problems.append(
                    Problem(f"{rel}/done", f"{flag}; its margins are whole", recommit=(rel, j))
                )
        report.problems += damage


def _nodes(base: Tree, torn: set[str]) -> Iterator[tuple[str, str]]:
    """(kind, path) of every row set and reduction whose metadata is readable."""

    def ok(rel: str) -> bool:
        parts = rel.split("/")
        return not any("/".join(parts[: i + 1]) in torn for i in range(len(parts)))

    for mid in children(base, layout.TRAIN) if ok(layout.TRAIN) else []:
        rel = f"{layout.TRAIN}/{mid}"
        if ok(rel) and not any(f"{rel}/{a}" in torn for a in ROW_ARRAYS):
            yield "rows", rel
        if base.metadata(f"{rel}/{layout.XTX}") is not None and ok(f"{rel}/{layout.XTX}"):
            yield "xtx", f"{rel}/{layout.XTX}"
        factors = f"{rel}/{layout.FACTOR}"
        for p in children(base, factors) if ok(factors) else []:
            if ok(f"{factors}/{p}"):
                yield "factor", f"{factors}/{p}"
    for exp in children(base, layout.TARGETS) if ok(layout.TARGETS) else []:
        node = layout.experiment(exp)
        for mid in children(base, node) if ok(node) else []:
            rel = f"{node}/{mid}"
            if ok(rel) and not any(f"{rel}/{a}" in torn for a in ROW_ARRAYS):
                yield "rows", rel
    for exp in children(base, layout.SCORES) if ok(layout.SCORES) else []:
        node = layout.scores(exp)
        for v in children(base, node) if ok(node) else []:
            if ok(layout.scores(exp, v)):
                yield "scores", layout.scores(exp, v)
    for exp in children(base, EVAL) if ok(EVAL) else []:
        rel = layout.eval_set(exp)
        if ok(rel) and not any(f"{rel}/{a}" in torn for a in EVAL_ARRAYS):
            yield "eval", rel


def verify(path: str | Path, options: Mapping[str, Any] | None = None) -> Report:
    """Check every committed chunk, reduction and metadata file of the store ``path`` (a
    directory or an object store URL with its ``options``; StoreStateError: no store or
    unreadable root metadata; StoreMismatchError: other version)."""
    where = str(path)
    zstore = open_zarr(where, options, read_only=True)
    base = Tree(zstore)
    if not _holds_anything(base):
        kind = "object store prefix" if is_url(where) else "directory"
        raise StoreStateError(f"no trak_dist store at {where} (an empty or missing {kind}).")
    report = Report(where)
    torn = set(unreadable_metadata(zstore))
    if "" in torn:
        raise StoreStateError(
            f"the store's root metadata {where}/zarr.json is unreadable: it holds the store's "
            "settings, which cannot be rebuilt. Featurise into a new store path."
        )
    for rel in sorted(torn):
        report.problems.append(
            Problem(
                rel,
                f"{where}/{rel}/zarr.json is unreadable (cut short, missing or not Zarr JSON)",
                drop=_for_torn(base, rel),
            )
        )
    store = FeatureStore.open(where, mode="r", check=False, options=options)
    train_sets: list[tuple[int, RowSet]] = []
    for kind, rel in _nodes(base, torn):
        if kind == "rows":
            check_rows(store, rel, report, torn)
            node = layout.parse(rel)
            if node.is_train and node.model_id is not None:
                train_sets.append((node.model_id, RowSet(group(store.root, rel))))
        elif kind == "xtx":
            mid = int(layout.parse(rel).model_id or 0)
            parent = layout.train(mid)
            _check_reduction(store, parent, (layout.XTX,), (rel, layout.factors(mid)), report)
        elif kind == "factor":
            _check_reduction(store, rel, ("eigenvalues", "eigenvectors"), (rel,), report)
        elif kind == "eval":
            _check_eval(store, rel, report)
        elif layout.is_leftover(rel.rsplit("/", 1)[1]):
            report.problems.append(
                Problem(
                    rel,
                    f"{rel} was left by a scoring that stopped (rerunning the same scoring "
                    "resumes it from its committed blocks)",
                    drop=(rel,),
                )
            )
        else:
            ys = tuple(layout.y(int(c)) for c in children(base, f"{rel}/{layout.Y}") if c.isdigit())
            # a top-k-only set (scoring.write_scores) has no S to check
            full = group(store.root, rel).attrs.get("write_scores") != "topk"
            names = ("S", *TOPK_ARRAYS, *ys) if full else (*TOPK_ARRAYS, *ys)
            _check_reduction(store, rel, names, (rel,), report)
    check_same_items(store, train_sets, report)
    # only inside the store's own groups: a traker save_dir holds traker's files beside them
    report.stray_files = [
        key for name in CONTAINERS for key in base.files(name) if key.endswith(".partial")
    ]
    return report


def _holds_anything(base: Tree) -> bool:
    folders, files = sync(base.entries(""))
    return bool(folders or files)
