"""The run report: phase times with the bytes and rates of each stage (``_pace.py``), where
results are, reuse counts, the λ used per checkpoint, how often proponents share their target's
label, top proponents of a few targets (as decoded text for text data; with a PNG of targets
beside their proponents and opponents for images), and the LDS when ``trak-dist eval`` has
stored subset models for the experiment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from trak_dist._method import describe, method_line, scaling_line
from trak_dist._pace import pace_table, stage_pace
from trak_dist._version import __version__
from trak_dist.config import JobConfig
from trak_dist.errors import StoreStateError
from trak_dist.explain import shorten
from trak_dist.pipeline import JobResult
from trak_dist.remote import is_url
from trak_dist.scoring import AUTO, auto_rule
from trak_dist.sources import build_dataset
from trak_dist.store import FeatureStore

SHOW_TARGETS = 3
AGREEMENT_TARGETS = 100
TEXT_WIDTH = 80  # characters of decoded text per example


def _label(dataset: Any, i: int) -> int | None:
    item = dataset[int(i)]
    last = item[-1] if isinstance(item, (tuple, list)) else None
    try:
        return int(last) if last is not None and np.ndim(last) == 0 else None
    except (TypeError, ValueError):
        return None


def _chance(train: Any, targets: Any, shown: int, sample: int = 5000) -> float:
    """The agreement random proponents would have: mean over targets of the share of train
    examples (up to ``sample`` of them, evenly spaced) with the target's label."""
    rows = np.unique(np.linspace(0, len(train) - 1, num=min(sample, len(train)), dtype=np.int64))
    labels = np.array([_label(train, i) for i in rows])
    return float(np.mean([np.mean(labels == _label(targets, t)) for t in range(shown)]))


def _lds(opened: FeatureStore, exp: str, variant: str) -> dict[str, Any]:
    """``{"lds": {...}}`` when the store has subset models for ``exp``, else ``{}``."""
    from trak_dist.lds import store_lds  # scipy: only when there is something to measure

    if opened.eval_set(exp) is None:
        return {}
    try:
        (row,) = store_lds(opened, exp, [variant])
    except StoreStateError as e:  # e.g. an eval killed before 3 models finished
        return {"lds_error": str(e)}
    return {"lds": row.result.to_json()}


def _figure(train: Any, targets: Any, top: Any, path: Path) -> dict[str, Any]:
    """``{"figure": file name}`` once the PNG is written, ``{"figure_error": why}`` when it
    cannot be, ``{}`` when the data are no images."""
    from trak_dist._figure import is_image_data, write_figure

    if not (is_image_data(train) and is_image_data(targets)):
        return {}
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return {"figure_error": "matplotlib is not installed (pip install 'trak_dist[plot]')"}
    write_figure(train, targets, top, path)
    return {"figure": path.name}


def summarize(
    result: JobResult,
    train_ref: Any = None,
    target_ref: Any = None,
    data_kwargs: dict[str, Any] | None = None,
    figure: str | Path | None = None,
) -> dict[str, Any]:
    """A JSON-able summary of ``result``; with the datasets, labels of targets and proponents,
    the share of top-k proponents sharing their target's label and, for text datasets, the
    decoded text of targets, proponents and opponents. With ``figure`` (a ``.png`` path) and
    image targets, the picture of ``trak_dist._figure`` is written there (matplotlib needed:
    else the summary says so). The store is opened only to look for ``trak-dist eval``'s
    subset models."""
    out: dict[str, Any] = {
        "trak_dist_version": __version__,
        "store": result.store if is_url(result.store) else str(Path(result.store).resolve()),
        "store_format_version": result.format_version,
        "exp": result.exp,
        "n": result.n,
        "m": result.m,
        "checkpoints": result.checkpoints,
        "feature_dim": result.proj_dim,
        "phases_s": {k: round(v, 3) for k, v in result.phases.items()},
        "rows_computed": result.rows_computed,
        "rows_reused": result.rows_reused,
        "worker_restarts": result.worker_restarts,
        "task_retries": result.task_retries,
        "variants": [],
    }
    opened = FeatureStore.open(result.store, mode="r", options=result.store_options)
    out["method"] = describe(opened.spec)
    out["pace"] = stage_pace(result, opened)
    train = targets = None
    if train_ref is not None and target_ref is not None:
        train = build_dataset(train_ref, data_kwargs or {}, "data.train")
        targets = build_dataset(target_ref, data_kwargs or {}, "data.targets")
    for v in result.scores:
        top = v.top
        entry: dict[str, Any] = {
            "variant": v.variant,
            "proj_dim": v.proj_dim,
            "lambda_reg": v.lambda_reg,
            "path": v.path,
            "lambdas": [float(f"{x:.4g}") for x in v.lambdas],
            "seconds": round(v.seconds, 3),
            "kinv_scaling": v.kinv_scaling,
            "scoring": {
                "write_scores": v.write_scores,
                "super_block": v.super_block,
                "x_passes": v.x_passes,
                "blocks": v.blocks,
                "blocks_computed": v.blocks_computed,
                "blocks_reused": v.blocks_reused,
                "worker_restarts": v.worker_restarts,
                "bytes_read": v.bytes_read,
                "bytes_written": v.bytes_written,
            },
            "examples": [],
        }
        entry.update(_lds(opened, result.exp, v.variant))
        for t in range(min(SHOW_TARGETS, result.m)):
            ex: dict[str, Any] = {
                "target": t,
                "proponents": top.proponents_idx[t, :5].tolist(),
                "proponent_scores": [float(f"{s:.4g}") for s in top.proponents_val[t, :5]],
                "opponents": top.opponents_idx[t, :5].tolist(),
                "opponent_scores": [float(f"{s:.4g}") for s in top.opponents_val[t, :5]],
            }
            if train is not None and targets is not None:
                ex["target_label"] = _label(targets, t)
                ex["proponent_labels"] = [_label(train, i) for i in ex["proponents"]]
                if hasattr(train, "decode") and hasattr(targets, "decode"):
                    ex["target_text"] = shorten(targets.decode(t), TEXT_WIDTH)
                    for side in ("proponents", "opponents"):
                        ex[f"{side[:-1]}_texts"] = [
                            shorten(train.decode(int(i)), TEXT_WIDTH) for i in ex[side]
                        ]
            entry["examples"].append(ex)
        if figure is not None and "figure" not in out and train is not None:
            out.update(_figure(train, targets, top, Path(figure)))
        if train is not None and targets is not None and _label(targets, 0) is not None:
            shown = min(AGREEMENT_TARGETS, result.m, len(top.proponents_idx))
            same = [
                _label(train, i) == _label(targets, t)
                for t in range(shown)
                for i in top.proponents_idx[t]
            ]
            entry["proponent_label_agreement"] = round(float(np.mean(same)), 4)
            entry["label_agreement_chance"] = round(_chance(train, targets, shown), 4)
        out["variants"].append(entry)
    return out


def to_markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# trak_dist run: {summary['exp']}",
        "",
        f"- store: `{summary['store']}` (n={summary['n']} train, m={summary['m']} targets, "
        f"{summary['checkpoints']} checkpoints, features of width {summary['feature_dim']}, "
        f"format version {summary['store_format_version']})",
        *method_line(summary.get("method")),
        f"- trak_dist {summary['trak_dist_version']}",
        f"- rows computed: {summary['rows_computed']}, reused from the store: "
        f"{summary['rows_reused']}; worker restarts {summary['worker_restarts']}, "
        f"shard retries {summary['task_retries']}",
        "",
        *pace_table(summary["phases_s"], summary.get("pace", {})),
    ]
    if "figure" in summary:
        lines += [
            "",
            f"![targets (left), their top proponents (green) and opponents (red), with labels "
            f"and scores]({summary['figure']})",
        ]
    elif "figure_error" in summary:
        lines += ["", f"(no picture of targets and proponents: {summary['figure_error']})"]
    for v in summary["variants"]:
        lines += ["", f"## scores `{v['variant']}`: `{v['path']}`", "", *_quality(v)]
        if "scoring" in v:
            sc = v["scoring"]
            lines.append(
                f"- scoring: {sc['write_scores']} (S written whole or top-k only); X read "
                f"{sc['x_passes']}× (super-blocks of {sc['super_block']} targets); blocks "
                f"computed {sc['blocks_computed']}, reused {sc['blocks_reused']} of "
                f"{sc['blocks']}; {sc['bytes_read']} bytes read, {sc['bytes_written']} written"
                + (f"; score workers replaced {n}" if (n := sc.get("worker_restarts")) else "")
            )
        lines.append("")
        if v["examples"] and "target_text" in v["examples"][0]:
            lines += _text_examples(v["examples"])
            continue
        lines += [
            "Example targets and their strongest proponents (the train examples whose presence "
            "most raises the model's output on the target), as train index (label):",
            "",
            "| target | label | top proponents (label) | scores |",
            "| --- | --- | --- | --- |",
        ]
        for ex in v["examples"]:
            labels = ex.get("proponent_labels") or [None] * len(ex["proponents"])
            props = ", ".join(
                f"{i}" + ("" if lab is None else f" ({lab})")
                for i, lab in zip(ex["proponents"], labels, strict=True)
            )
            lines.append(
                f"| {ex['target']} | {ex.get('target_label', '')} | {props} | "
                f"{', '.join(map(str, ex['proponent_scores']))} |"
            )
    return "\n".join(lines) + "\n"


def _text_examples(examples: list[dict[str, Any]]) -> list[str]:
    """Targets with their top proponents (+) and opponents (−) as decoded text."""
    lines = [
        "Example targets, their strongest proponents (+: the train examples whose presence "
        "most raises the model's output on the target) and opponents (−), as train index, "
        "score and text:",
    ]
    for ex in examples:
        lines += ["", f"**target {ex['target']}**: `{_code(ex['target_text'])}`", ""]
        for side, mark in (("proponent", "+"), ("opponent", "−")):
            idx = ex[f"{side}s"]
            vals = ex.get(f"{side}_scores") or [None] * len(idx)
            for i, val, text in zip(idx, vals, ex[f"{side}_texts"], strict=True):
                score = "" if val is None else f" {val:+.4g}"
                lines.append(f"- {mark} {i}{score}: `{_code(text)}`")
    return lines


def _code(text: str) -> str:
    """Text safe inside a Markdown code span."""
    return text.replace("`", "'")


def _quality(v: dict[str, Any]) -> list[str]:
    """The λ used, the LDS (or how to get it) and the label agreement, as Markdown bullets."""
    per = ", ".join(f"{x:.3g}" for x in v.get("lambdas", []))
    if v["lambda_reg"] == AUTO:
        lines = [f"- λ: auto ({auto_rule()}); per checkpoint: {per}"]
    else:
        lines = [f"- λ: {v['lambda_reg']} (fixed){'; per checkpoint: ' + per if per else ''}"]
    lines += scaling_line(v.get("kinv_scaling"))
    if "lds" in v:
        d = v["lds"]
        lines.append(
            f"- LDS (linear datamodeling score: rank correlation between what the scores "
            f"predict and what {d['models']} retrained subset models output): {d['lds']:.3f}, "
            f"{100 * d['level']:.0f} % interval [{d['low']:.3f}, {d['high']:.3f}]"
        )
    elif "lds_error" in v:
        lines.append(f"- LDS: not available ({v['lds_error']})")
    else:
        lines.append("- LDS: not measured; `trak-dist eval` retrains subset models to measure it")
    if "proponent_label_agreement" in v:
        lines.append(
            f"- Top-k proponents sharing their target's label: "
            f"{100 * v['proponent_label_agreement']:.1f} % (random train examples: "
            f"{100 * v['label_agreement_chance']:.1f} %)"
        )
    return lines


def report_job(
    job: JobConfig, result: JobResult, stem: Path | None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The summary of ``job``'s ``result`` (with its datasets' labels and texts), ``extra``
    entries added; with ``stem``, written there as Markdown, JSON and (image data) a PNG, and
    ``summary["report"]`` the Markdown file. The one way every front door reports a run."""
    figure = None
    if stem is not None:
        stem.parent.mkdir(parents=True, exist_ok=True)
        figure = stem.with_suffix(".png")
    summary = summarize(result, job.data.train, job.data.targets, job.data.kwargs, figure)
    summary.update(extra or {})
    if stem is not None:
        md, _ = write(summary, stem)
        summary["report"] = str(md)
    return summary


def write(summary: dict[str, Any], stem: str | Path) -> tuple[Path, Path]:
    stem = Path(stem)
    md, js = stem.with_suffix(".md"), stem.with_suffix(".json")
    md.write_text(to_markdown(summary))
    js.write_text(json.dumps(summary, indent=2))
    return md, js
