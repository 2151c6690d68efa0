"""``trak-dist store verify PATH`` and ``trak-dist store repair PATH`` (a directory or an object
store URL, ``-o KEY=VALUE`` for its ``store.options``).

Exit codes: 0 sound (verify) or repaired (repair); 1 problems found (verify) or some not
repairable (repair); 2 not a store we can check."""

from __future__ import annotations

import argparse
import sys

from trak_dist.errors import ConfigError, TrakDistError
from trak_dist.remote import check_options
from trak_dist.store.verify._repair import repair
from trak_dist.store.verify._verify import Report, verify


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trak-dist store",
        description="Check a trak_dist store's chunks, reductions and metadata, or repair it so "
        "that the next run recomputes exactly what was damaged.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    for run, text in (
        (_verify, "read every committed chunk and reduction; list what is damaged"),
        (_repair, "un-commit damaged chunks and drop what was derived from them"),
    ):
        cmd = sub.add_parser(run.__name__.lstrip("_"), help=text)
        cmd.add_argument("path", help="the store: a directory or an object store URL (s3://…)")
        cmd.add_argument(
            "-o",
            "--option",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="an object store's store.options entry (endpoint, region, …); credentials "
            "come from the environment (AWS_ACCESS_KEY_ID, …)",
        )
        cmd.set_defaults(run=run)
    return p


def _options(pairs: list[str], path: str) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {pair!r}; expected KEY=VALUE (e.g. region=us-east-1).")
        options[key] = value
    check_options(path, options)
    return options


def _print_problems(report: Report) -> None:
    for p in report.problems:
        print(f"  - {p.what}")


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args.path, _options(args.option, args.path)))
    except TrakDistError as e:
        print(f"trak-dist store: error: {e}", file=sys.stderr)
        return 2


def _verify(path: str, options: dict[str, str]) -> int:
    report = verify(path, options)
    if not report.problems:
        print(
            f"{report.where}: sound ({report.chunks_checked} committed chunks and every "
            "reduction read back intact)."
        )
        return 0
    print(f"{report.where}: {len(report.problems)} problem(s):")
    _print_problems(report)
    if any(p.repairable for p in report.problems):
        print(
            f"Run `trak-dist store repair {report.where}`, then rerun the job: only the "
            "damaged chunks are featurised again."
        )
    return 1


def _repair(path: str, options: dict[str, str]) -> int:
    report, actions = repair(path, options)
    if not report.problems and not actions:
        print(f"{report.where}: nothing to repair ({report.chunks_checked} chunks checked).")
        return 0
    print(f"{report.where}: {len(report.problems)} problem(s):")
    _print_problems(report)
    for a in actions:
        print(f"repair: {a}")
    left = [p for p in report.problems if not p.repairable]
    if left:
        print(f"{len(left)} problem(s) cannot be repaired (see above).")
        return 1
    print("Rerun the same command (or TRAKer calls): it recomputes what was dropped.")
    return 0
