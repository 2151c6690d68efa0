"""``trak-dist store verify|repair``: check every committed chunk, staged row and reduction of a
local store; un-commit what is damaged and drop what was derived from it, so the next run
recomputes just that.

What counts as a problem, and what repair does with it:

- a committed chunk of X, Q or H that fails its checksum, is missing, or holds non-finite or
  unwritten values: the chunk is un-committed (the next run featurises exactly those rows, and
  rows of it still staged from before its commit are unflagged too), and the reductions built
  from its row set are dropped: XᵀX and factorisations of a train row set, and every score set
  that used its checkpoint;
- a commit flag that fails its checksum: the chunk's data decides. Whole and intact (X is only
  ever written whole, before its flag), the flag is rewritten; otherwise the chunk is
  un-committed as above;
- staged rows (``staged/<writer>/``, rows of chunks not committed yet) that fail a checksum or
  are missing or non-finite though flagged: that writer's shadow is dropped, and the next run
  featurises its rows again. Staged rows are in no reduction, so nothing else goes. Rows staged
  in chunks that are committed are garbage a fold never reads, and are not checked;
- a reduction (XᵀX, factorisation, score set) that is damaged, incomplete (a run stopped while
  writing it) or left over (a partial score set): dropped, the next run recomputes it;
- unreadable metadata (``zarr.json`` cut short or missing): the node it describes is dropped,
  with what was derived from it (a row set whose metadata is torn is featurised again, since
  the checkpoint it was bound to is unknown; a torn shadow only drops that shadow). The root's
  metadata holds the store's settings; without it the store cannot be repaired;
- a subset model of ``eval/<exp>`` (the LDS's ground truth) whose margins are damaged or missing
  though it is done, or whose mask fails its checksum or differs from the subset its settings
  define: the model is un-done (flag and margins removed, mask written again), and the next
  ``trak-dist eval`` trains exactly those models again. A done flag that fails its checksum is
  rewritten when the model's margins and mask are whole (margins are written before the flag),
  else the model is un-done. An ``eval/<exp>`` without its settings (an evaluation killed while
  creating it, before any model was trained) is dropped. Nothing is derived from subset models
  inside the store, so nothing else goes;
- rows of one checkpoint hashed from other items than another checkpoint's: not repairable
  (which data is right is the user's call).

Run repair while no job writes the store: it takes the store lock, which the pipeline's driver
holds while featurising, but TRAKer processes hold it only while folding.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr

from trak_dist.errors import StoreDamagedError, StoreStateError
from trak_dist.store._eval import EvalSet
from trak_dist.store._integrity import (
    CONTAINERS,
    EVAL,
    chunk_damage,
    delete_chunk,
    unreadable_metadata,
)
from trak_dist.store._lock import store_lock
from trak_dist.store._rows import RowSet
from trak_dist.store._scores import TOPK_ARRAYS, is_leftover
from trak_dist.store._staging import STAGED, Shadow
from trak_dist.store._store import FeatureStore
from trak_dist.store._zarr import array, group

ROW_ARRAYS = ("X", "Q", "H", "done")
EVAL_ARRAYS = ("masks", "margins", "done")


@dataclass(frozen=True)
class Problem:
    """Something wrong in the store and what repair does about it.

    Attributes:
        node: the node's path in the store (``train/0/X``).
        what: what is wrong, for people.
        uncommit: a damaged chunk of a row set: (row set path, chunk index); or a damaged
            subset model of an eval set: (``eval/<exp>``, model index).
        recommit: a chunk (subset model) whose flag is unreadable and whose data is whole:
            (path, chunk or model index).
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
    stray_files: list[Path] = field(default_factory=list)


def _children(base: Path, rel: str) -> list[str]:
    """Child nodes of ``rel``, from the file system (Zarr's listing reads their metadata)."""
    d = base / rel
    if not d.is_dir():
        return []
    return sorted(c.name for c in d.iterdir() if c.is_dir() and (c / "zarr.json").is_file())


def _attrs(base: Path, rel: str) -> dict[str, object]:
    try:
        meta = json.loads((base / rel / "zarr.json").read_bytes())
        attrs = meta.get("attributes", {})
        return attrs if isinstance(attrs, dict) else {}
    except (OSError, ValueError):
        return {}


def _scores_using(base: Path, model_id: int, exp: str | None = None) -> list[str]:
    """Score sets (of ``exp``, or of every experiment) computed with checkpoint ``model_id``."""
    out = []
    for e in _children(base, "scores") if exp is None else [exp]:
        for v in _children(base, f"scores/{e}"):
            ids = _attrs(base, f"scores/{e}/{v}").get("model_ids")
            if not isinstance(ids, list) or model_id in ids:
                out.append(f"scores/{e}/{v}")
    return out


def _for_torn(base: Path, rel: str) -> tuple[str, ...]:
    """What to drop when the metadata of node ``rel`` is unreadable."""
    parts = rel.split("/")
    top = parts[0]
    if STAGED in parts:  # one writer's shadow (or the staging area): only staged rows go
        i = parts.index(STAGED)
        return ("/".join(parts[: i + 2]),)
    if len(parts) == 1:
        return (rel, "scores") if top in ("train", "targets") else (rel,)
    if top == "train":
        mid = parts[1]
        if len(parts) == 2 or (len(parts) == 3 and parts[2] in ROW_ARRAYS):
            using = _scores_using(base, int(mid)) if mid.isdigit() else ["scores"]
            return (f"train/{mid}", *using)
        if parts[2] == "xtx":
            return (f"train/{mid}/xtx", f"train/{mid}/factor")
        return (f"train/{mid}/factor",)
    if top == "targets":
        exp = parts[1]
        if len(parts) == 2:
            return (f"targets/{exp}", f"scores/{exp}")
        mid = parts[2]
        using = _scores_using(base, int(mid), exp) if mid.isdigit() else [f"scores/{exp}"]
        return (f"targets/{exp}/{mid}", *using)
    if top == "scores":
        return ("/".join(parts[:3]),)
    if top == EVAL:  # the settings or a whole array are unknown: the experiment's models go
        return ("/".join(parts[:2]),)
    return ()


def _check_rows(store: FeatureStore, rel: str, report: Report, torn: set[str]) -> None:
    base = Path(store.where)
    rows = RowSet(group(store.root, rel))
    is_train = rel.startswith("train/")
    mid = int(rel.rsplit("/", 1)[1])
    exp = None if is_train else rel.split("/")[1]
    derived = (
        (f"{rel}/xtx", f"{rel}/factor", *_scores_using(base, mid))
        if is_train
        else tuple(_scores_using(base, mid, exp))
    )
    committed, unreadable = rows.commit_flags()
    for c in np.flatnonzero(committed | unreadable).tolist():
        report.chunks_checked += 1
        arrays = [rows.X, rows.H] + ([rows.Q] if rows.Q is not None else [])
        damage = []
        for arr in arrays:
            d = chunk_damage(arr, (c, 0) if arr.ndim == 2 else (c,))
            if d is not None:
                damage.append(Problem(arr.path, str(d), (rel, c), derived))
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
    return f"[{c * rows.chunk_rows}, {min(rows.n, (c + 1) * rows.chunk_rows)})"


def _spans(rows: RowSet, chunks: set[int]) -> str:
    return ", ".join(_span(rows, c) for c in sorted(chunks))


def _check_staged(
    base: Path, rows: RowSet, rel: str, committed: np.ndarray, report: Report, torn: set[str]
) -> None:
    """Every writer's staged rows in chunks not committed yet: flags readable, flagged rows
    present, intact and finite. A damaged shadow is dropped whole (its rows are featurised
    again); nothing was derived from staged rows."""
    for name in _children(base, f"{rel}/{STAGED}"):
        path = f"{rel}/{STAGED}/{name}"
        if any(t == path or t.startswith(path + "/") for t in torn):
            continue  # reported with its metadata; repair drops it
        node = group(rows.group, f"{STAGED}/{name}")
        if "has" not in node:
            continue  # a writer killed while creating it: never read, removed by a full fold
        shadow = Shadow(node)
        for c in np.flatnonzero(~committed).tolist():
            start, end = c * rows.chunk_rows, min(rows.n, (c + 1) * rows.chunk_rows)
            try:
                has = shadow.rows(start, end)
            except StoreDamagedError as e:
                report.problems += [Problem(path, str(d), drop=(path,)) for d in e.damage]
                break
            if not has.any():
                continue
            report.chunks_checked += 1
            arrays = [shadow.X, shadow.H] + ([shadow.Q] if shadow.Q is not None else [])
            found = [chunk_damage(a, (c, 0) if a.ndim == 2 else (c,), has) for a in arrays]
            problems = [Problem(path, str(d), drop=(path,)) for d in found if d]
            if problems:
                report.problems += problems
                break  # the whole shadow goes: one report per shadow is enough


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


def _nodes(base: Path, torn: set[str]) -> Iterator[tuple[str, str]]:
    """(kind, path) of every row set and reduction whose metadata is readable."""

    def ok(rel: str) -> bool:
        parts = rel.split("/")
        return not any("/".join(parts[: i + 1]) in torn for i in range(len(parts)))

    for mid in _children(base, "train") if ok("train") else []:
        rel = f"train/{mid}"
        if ok(rel) and not any(f"{rel}/{a}" in torn for a in ROW_ARRAYS):
            yield "rows", rel
        if (base / rel / "xtx").is_dir() and ok(f"{rel}/xtx"):
            yield "xtx", f"{rel}/xtx"
        for p in _children(base, f"{rel}/factor") if ok(f"{rel}/factor") else []:
            if ok(f"{rel}/factor/{p}"):
                yield "factor", f"{rel}/factor/{p}"
    for exp in _children(base, "targets") if ok("targets") else []:
        for mid in _children(base, f"targets/{exp}") if ok(f"targets/{exp}") else []:
            rel = f"targets/{exp}/{mid}"
            if ok(rel) and not any(f"{rel}/{a}" in torn for a in ROW_ARRAYS):
                yield "rows", rel
    for exp in _children(base, "scores") if ok("scores") else []:
        for v in _children(base, f"scores/{exp}") if ok(f"scores/{exp}") else []:
            if ok(f"scores/{exp}/{v}"):
                yield "scores", f"scores/{exp}/{v}"
    for exp in _children(base, EVAL) if ok(EVAL) else []:
        rel = f"{EVAL}/{exp}"
        if ok(rel) and not any(f"{rel}/{a}" in torn for a in EVAL_ARRAYS):
            yield "eval", rel


def verify(path: str | Path) -> Report:
    """Check every committed chunk, reduction and metadata file of the local store ``path``.

    Raises:
        StoreStateError: no store there, or its root metadata is unreadable (not repairable).
        StoreMismatchError: a store of another format version.
    """
    where = str(path)
    base = Path(where)
    if "://" in where or not base.is_dir():
        raise StoreStateError(
            f"no local trak_dist store at {where} (verify and repair read a directory)."
        )
    report = Report(where)
    torn = set(unreadable_metadata(base))
    if "" in torn:
        raise StoreStateError(
            f"the store's root metadata {base / 'zarr.json'} is unreadable: it holds the store's "
            "settings, which cannot be rebuilt. Featurise into a new store path."
        )
    for rel in sorted(torn):
        report.problems.append(
            Problem(
                rel,
                f"{base / rel / 'zarr.json'} is unreadable (cut short, missing or not Zarr JSON)",
                drop=_for_torn(base, rel),
            )
        )
    store = FeatureStore.open(where, mode="r", check=False)
    train_sets: list[tuple[int, RowSet]] = []
    for kind, rel in _nodes(base, torn):
        if kind == "rows":
            _check_rows(store, rel, report, torn)
            if rel.startswith("train/"):
                train_sets.append((int(rel.split("/")[1]), RowSet(group(store.root, rel))))
        elif kind == "xtx":
            parent = rel.rsplit("/", 1)[0]
            _check_reduction(store, parent, ("xtx",), (rel, f"{parent}/factor"), report)
        elif kind == "factor":
            _check_reduction(store, rel, ("eigenvalues", "eigenvectors"), (rel,), report)
        elif kind == "eval":
            _check_eval(store, rel, report)
        elif is_leftover(rel.rsplit("/", 1)[1]):
            report.problems.append(
                Problem(rel, f"{rel} was left by a scoring that stopped", drop=(rel,))
            )
        else:
            ys = tuple(f"Y/{c}" for c in _children(base, f"{rel}/Y"))
            _check_reduction(store, rel, ("S", *TOPK_ARRAYS, *ys), (rel,), report)
    _check_same_items(store, train_sets, report)
    # only inside the store's own groups: a traker save_dir holds traker's files beside them
    report.stray_files = [
        p for name in CONTAINERS for p in (base / name).rglob("*.partial") if p.is_file()
    ]
    return report


def _check_same_items(
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
                    f"train/{c}",
                    f"train/{c} and train/{ref[0]} were featurised from different items at "
                    f"{len(diff)} rows (first: {diff[:5].tolist()}); not repairable: featurise "
                    "every checkpoint from the same data into a new store path",
                )
            )


def repair(path: str | Path) -> tuple[Report, list[str]]:
    """Un-commit damaged chunks and drop damaged, incomplete or derived reductions; returns the
    report it acted on and what it did."""
    where = str(path)
    base = Path(where)
    with store_lock(where):
        report = verify(where)
        actions: list[str] = []
        uncommit: dict[str, set[int]] = {}
        drops: set[str] = set()
        recommit: dict[str, set[int]] = {}
        for p in report.problems:
            if p.uncommit is not None:
                uncommit.setdefault(p.uncommit[0], set()).add(p.uncommit[1])
            if p.recommit is not None:
                recommit.setdefault(p.recommit[0], set()).add(p.recommit[1])
            drops.update(p.drop)
        # drops first: a torn shadow must be gone before un-committing lists its row set's
        for rel in sorted(drops):
            if any(rel.startswith(d + "/") for d in drops):
                continue  # inside something dropped whole
            target = base / rel
            if target.exists():
                shutil.rmtree(target)
                actions.append(f"dropped {rel}")
        root = zarr.open_group(where, mode="r+")
        for rel, chunks in sorted(uncommit.items()):
            if any(rel == d or rel.startswith(d + "/") for d in drops):
                continue  # the whole row set went
            if rel.startswith(f"{EVAL}/"):
                EvalSet(group(root, rel)).uncommit(np.array(sorted(chunks)))
                actions.append(
                    f"un-did {len(chunks)} subset model(s) of {rel} ({sorted(chunks)}): "
                    "`trak-dist eval` trains them again"
                )
                continue
            rows = RowSet(group(root, rel))
            rows.uncommit_chunks(np.array(sorted(chunks)))
            for c in chunks:
                # the damaged bytes go too: a missing chunk reads as "not written", never as
                # data, whoever reads it before the rerun
                for arr in (rows.X, rows.H, *([rows.Q] if rows.Q is not None else [])):
                    delete_chunk(arr, (c, 0) if arr.ndim == 2 else (c,))
            actions.append(
                f"un-committed {len(chunks)} chunk(s) of {rel} (rows {_spans(rows, chunks)})"
            )
        for rel, chunks in sorted(recommit.items()):
            if any(rel == d or rel.startswith(d + "/") for d in drops):
                continue
            if rel.startswith(f"{EVAL}/"):
                EvalSet(group(root, rel)).recommit(np.array(sorted(chunks)))
                actions.append(
                    f"rewrote the done flags of {len(chunks)} whole subset model(s) of {rel} "
                    f"({sorted(chunks)})"
                )
                continue
            rows = RowSet(group(root, rel))
            rows.recommit_chunks(np.array(sorted(chunks)))
            actions.append(
                f"rewrote the commit flags of {len(chunks)} whole chunk(s) of {rel} "
                f"(rows {_spans(rows, chunks)})"
            )
        for name in CONTAINERS:
            if name != EVAL:  # made by the first `trak-dist eval`, not with the store
                root.require_group(name)
        for f in report.stray_files:
            f.unlink(missing_ok=True)
        if report.stray_files:
            actions.append(f"removed {len(report.stray_files)} temporary file(s) of killed writes")
    return report, actions
