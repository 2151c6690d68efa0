"""``trak-dist show …``: targets with their top proponents and opponents as decoded text.

Takes the run's own overrides (so it finds the same store, score variant and data), plus
``show.json=true`` (JSON for scripts), ``show.targets=N``, ``show.k=K``, ``show.width=CHARS``,
and ``show.tokens=N`` (causal LMs: each shown example's N highest-scoring tokens, see
``trak_dist.explain._tokens``; in JSON every token's score).
"""

from __future__ import annotations

import json
from typing import Any

from trak_dist.errors import ConfigError

OPTIONS = {"json": "false", "targets": "10", "k": "3", "width": "80", "tokens": "0"}


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    opts, rest = dict(OPTIONS), []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if key.startswith("show."):
            name = key[len("show.") :]
            if name not in OPTIONS or not sep:
                raise ConfigError(
                    f"trak-dist show: unknown option {arg!r}; expected show.KEY=VALUE with KEY "
                    f"among {sorted(OPTIONS)}."
                )
            opts[name] = value
        else:
            rest.append(arg)
    return opts, rest


def _int(opts: dict[str, str], name: str, least: int = 1) -> int:
    try:
        value = int(opts[name])
    except ValueError:
        value = least - 1
    if value < least:
        raise ConfigError(f"show.{name}={opts[name]!r}; expected a positive integer.")
    return value


def _job(overrides: list[str]) -> Any:
    from trak_dist._compose import compose_job
    from trak_dist.pipeline import resolve_inputs

    return resolve_inputs(compose_job(overrides))


def shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def collect(job: Any, targets: int, k: int, width: int, tokens: int = 0) -> list[dict[str, Any]]:
    """One entry per target: its text and its top ``k`` proponents and opponents."""
    from trak_dist.explain._tokens import job_score_set
    from trak_dist.sources import build_dataset

    top = job_score_set(job).read_topk()
    train = build_dataset(job.data.train, job.data.kwargs, "data.train")
    tgt = build_dataset(job.data.targets, job.data.kwargs, "data.targets")

    def text(ds: Any, i: int) -> str:
        return shorten(ds.decode(i), width) if hasattr(ds, "decode") else f"row {i}"

    out = []
    for t in range(min(targets, top["proponents_idx"].shape[0])):
        entry: dict[str, Any] = {"target": t, "text": text(tgt, t)}
        for side in ("proponents", "opponents"):
            idx, val = top[f"{side}_idx"][t, :k], top[f"{side}_val"][t, :k]
            entry[side] = [
                {"index": int(i), "score": float(s), "text": text(train, int(i))}
                for i, s in zip(idx, val, strict=True)
            ]
        out.append(entry)
    if tokens:
        _add_tokens(job, train, out, width)
    return out


def _add_tokens(job: Any, train: Any, rows: list[dict[str, Any]], width: int) -> None:
    """Each shown example's per-token scores (``tokens``: position, token text, score)."""
    from trak_dist.explain._tokens import TokenExplainer

    pairs = [
        (p["index"], r["target"]) for r in rows for s in ("proponents", "opponents") for p in r[s]
    ]
    found = TokenExplainer(job, train).explain(pairs)
    for r in rows:
        for side in ("proponents", "opponents"):
            for p in r[side]:
                positions, scores = found[(p["index"], r["target"])]
                ids = train[p["index"]]["input_ids"]
                p["tokens"] = [
                    {
                        "position": int(j),
                        "token": shorten(train.tokenizer.decode([int(ids[j])]), width),
                        "score": float(s),
                    }
                    for j, s in zip(positions, scores, strict=True)
                ]


def to_text(rows: list[dict[str, Any]], top: int = 3) -> str:
    lines = []
    for row in rows:
        lines.append(f"target {row['target']}: {row['text']}")
        for side, mark in (("proponents", "+"), ("opponents", "-")):
            for p in row[side]:
                lines.append(f"  {mark} {p['index']:>6}  {p['score']:+.4g}  {p['text']}")
                if "tokens" in p:
                    best = sorted(p["tokens"], key=lambda x: -abs(x["score"]))[:top]
                    shown = ", ".join(f"{x['token']!r} {x['score']:+.3g}" for x in best)
                    lines.append(f"           tokens: {shown}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``trak-dist show OVERRIDES [show.json=true] …``; returns the exit code."""
    opts, overrides = _options(argv)
    flag = opts["json"].lower()
    if flag not in ("true", "false"):
        raise ConfigError(f"show.json={opts['json']!r}; expected true or false.")
    tokens = _int(opts, "tokens", least=0)
    job = _job(overrides)
    rows = collect(job, _int(opts, "targets"), _int(opts, "k"), _int(opts, "width"), tokens)
    print(json.dumps(rows, indent=1) if flag == "true" else to_text(rows, tokens))
    return 0
