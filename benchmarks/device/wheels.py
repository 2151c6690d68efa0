"""The wheel set that travels to a GPU machine: what trak_dist needs beyond the machine's image.

    python -m benchmarks.device.wheels select RESOLVED DEST [--python 3.12]
    python -m benchmarks.device.wheels same DEST_A DEST_B
    python -m benchmarks.device.wheels summary DEST [--limit-mib 60]

``select`` copies from ``RESOLVED`` (pip's resolution of wheels.txt, dependencies included) the
wheels whose distribution the image (image_packages.txt) lacks, and checks the set is closed:
every requirement of a wheel kept (markers evaluated for that Python on Linux x86-64) is another
wheel kept or a distribution of the image, at a version its specifier allows where the version
is known. ``same`` checks two sets hold the same distributions at the same versions (the GPU set
for 3.12 and the dry run's for the local Python). ``summary`` prints the files and the total and
fails over the limit. Used by ``make device-wheels`` (benchmarks/device_wheels.sh)."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.version import Version

HERE = Path(__file__).resolve().parent
IMAGE = HERE / "image_packages.txt"
MIB = 2**20


def normalize(name: str) -> str:
    """PEP 503's normal form of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_image(path: Path = IMAGE) -> dict[str, str | None]:
    """The image's distributions: normalised name → version (None where not known)."""
    image: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, version = line.partition("==")
        image[normalize(name)] = version or None
    return image


def wheel_metadata(path: Path) -> tuple[str, str, list[str]]:
    """(normalised name, version, Requires-Dist lines) read from a wheel's METADATA."""
    with zipfile.ZipFile(path) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        msg = Parser().parsestr(zf.read(meta).decode())
    return normalize(msg["Name"]), msg["Version"], msg.get_all("Requires-Dist") or []


def marker_env(python: str | None) -> dict[str, str]:
    """Marker variables of CPython ``python`` (e.g. ``3.12``) on Linux x86-64; None: this one."""
    env = dict(default_environment())
    if python:
        env.update(
            python_version=python,
            python_full_version=f"{python}.0",
            implementation_name="cpython",
            platform_python_implementation="CPython",
            sys_platform="linux",
            platform_system="Linux",
            platform_machine="x86_64",
            os_name="posix",
        )
    return env


def select(resolved: Path, dest: Path, python: str | None) -> list[str]:
    """Copy the wheels the image lacks from ``resolved`` to ``dest``; the problems found."""
    image = read_image()
    dest.mkdir(parents=True, exist_ok=True)
    kept: dict[str, tuple[str, list[str]]] = {}
    problems = []
    for whl in sorted(resolved.glob("*.whl")):
        name, version, requires = wheel_metadata(whl)
        if name in image:
            print(f"  in the image, not carried: {name} (resolved {version})")
            continue
        if name in kept:
            problems.append(f"two versions of {name}: {kept[name][0]} and {version}")
        kept[name] = (version, requires)
        shutil.copy2(whl, dest / whl.name)
    env = marker_env(python)
    for name, (_, requires) in sorted(kept.items()):
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            dep = normalize(req.name)
            have = kept[dep][0] if dep in kept else image.get(dep, "")
            if have == "":
                problems.append(f"{name} needs {req}, which neither the set nor the image has")
            elif have is not None and not req.specifier.contains(Version(have), prereleases=True):
                problems.append(f"{name} needs {req}; the set or the image has {dep} {have}")
    return problems


def listing(dest: Path) -> dict[str, str]:
    """Distribution → version of every wheel in ``dest``."""
    return dict(wheel_metadata(w)[:2] for w in sorted(dest.glob("*.whl")))


def summary(dest: Path, limit_mib: float) -> bool:
    """Print the set's files and total; False when over ``limit_mib``."""
    files = sorted(p for p in dest.iterdir() if p.is_file())
    total = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"  {p.stat().st_size / MIB:7.2f} MiB  {p.name}")
    print(f"  {total / MIB:7.2f} MiB  total in {dest} ({len(files)} files; limit {limit_mib} MiB)")
    return total <= limit_mib * MIB


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sel = sub.add_parser("select")
    sel.add_argument("resolved", type=Path)
    sel.add_argument("dest", type=Path)
    sel.add_argument("--python", default=None, help="target CPython, e.g. 3.12 (default: this)")
    same = sub.add_parser("same")
    same.add_argument("a", type=Path)
    same.add_argument("b", type=Path)
    summ = sub.add_parser("summary")
    summ.add_argument("dest", type=Path)
    summ.add_argument("--limit-mib", type=float, default=60.0)
    args = ap.parse_args(argv)
    if args.cmd == "select":
        problems = select(args.resolved, args.dest, args.python)
        for p in problems:
            print(f"device-wheels: error: {p}", file=sys.stderr)
        return 1 if problems else 0
    if args.cmd == "same":
        a, b = listing(args.a), listing(args.b)
        if a != b:
            print(f"device-wheels: error: {args.a} holds {a}, {args.b} holds {b}", file=sys.stderr)
            return 1
        print(f"  the same {len(a)} distributions at the same versions in {args.a} and {args.b}")
        return 0
    if not summary(args.dest, args.limit_mib):
        print(f"device-wheels: error: {args.dest} is over {args.limit_mib} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
