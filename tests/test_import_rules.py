"""Which way the imports run (docs/design.md, "Import rules"), checked on the source with ``ast``:
every ``import`` and ``from … import`` of ``trak_dist/**/*.py`` and ``launch/**/*.py``, at any
depth (lazy imports inside functions and ``TYPE_CHECKING`` blocks count too). Beside the rules
below: packages are closed (from outside, only a package's ``__init__``) and no two packages
import each other, however indirectly. Last, the rule that shapes the modules themselves: one
module, one job (``test_one_module_one_job``).

To add a rule (a new package, a new executor), add a :class:`Rule` to ``RULES``; a rule whose
modules or exemptions name nothing that exists fails, so the table follows renames.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# source folder → the module name it has in a checkout (launch/ is `trak_dist.launch` once
# installed; it is named `launch` here, as the checkout imports it)
SOURCES = {"trak_dist": ROOT / "trak_dist", "launch": ROOT / "launch"}


@dataclass(frozen=True)
class Rule:
    """Modules under ``modules`` (a name covers its submodules; ``"*"``: every module) must not
    import anything under ``forbidden``, except the modules under ``exempt``."""

    name: str
    modules: tuple[str, ...]
    forbidden: tuple[str, ...]
    exempt: tuple[str, ...] = ()


# the math and the store, and the LDS measurement: no orchestration, no CLI, no launcher
MATH_AND_STORE = (
    "trak_dist.gradients",
    "trak_dist.projection",
    "trak_dist.scoring",
    "trak_dist.store",
    "trak_dist.remote",
    "trak_dist.tasks",
    "trak_dist.lds",
    "trak_dist.featurize",
    "trak_dist.batches",
    "trak_dist.sources",
    "trak_dist.config",
    "trak_dist._config_services",
    "trak_dist._validate",
    "trak_dist.errors",
)
ORCHESTRATION = (
    "ray",
    "hydra",
    "omegaconf",
    "submitit",
    "trak_dist.distributed",
    "trak_dist.pipeline",
    "trak_dist.evaluation",
    "trak_dist.cli",
    "trak_dist._compose",
    "trak_dist._eval_cli",
    "launch",
    "trak_dist.launch",
)

RULES = [
    Rule("the math and the store know nothing of orchestration", MATH_AND_STORE, ORCHESTRATION),
    Rule(
        "lds is the measurement: the eval driver imports lds, never the reverse",
        ("trak_dist.lds",),
        ("trak_dist.distributed", "trak_dist.evaluation", "trak_dist._eval_cli"),
    ),
    Rule(
        "no module imports the CLI module (sub-commands and launchers compose configs through "
        "trak_dist._compose); `python -m trak_dist` is the CLI's own entry",
        ("*",),
        ("trak_dist.cli",),
        exempt=("trak_dist.cli", "trak_dist.__main__"),
    ),
    Rule("only launch/ imports submitit", ("*",), ("submitit",), exempt=("launch",)),
    Rule(
        "only the CLI and its config composition import Hydra",
        ("*",),
        ("hydra", "omegaconf"),
        exempt=("trak_dist.cli", "trak_dist._compose"),
    ),
    Rule(
        "only the Ray executor and the Ray Serve app import Ray",
        ("*",),
        ("ray",),
        exempt=("trak_dist.distributed", "trak_dist.serve"),
    ),
    Rule(
        "the pipeline (stages, Worker and Reducer as plain classes) is backend-neutral: Ray, "
        "SLURM and the CLI only run it",
        ("trak_dist.pipeline",),
        tuple(m for m in ORCHESTRATION if m != "trak_dist.pipeline"),
    ),
]


def module_name(path: Path) -> str:
    for top, folder in SOURCES.items():
        if path.is_relative_to(folder):
            parts = [top, *path.relative_to(folder).with_suffix("").parts]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise AssertionError(path)


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, absolute; ``from a import b`` yields ``a`` and ``a.b``
    (``b`` may be a submodule: ``from trak_dist import cli``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return "*" in prefixes or any(name == p or name.startswith(p + ".") for p in prefixes)


MODULES = {
    module_name(p): p
    for folder in SOURCES.values()
    for p in sorted(folder.rglob("*.py"))
    if "__pycache__" not in p.parts
}
IMPORTS = {name: imports_of(path) for name, path in MODULES.items()}


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_import_rule(rule: Rule):
    broken = {
        f"{name} imports {imported}"
        for name, imported_set in IMPORTS.items()
        if under(name, rule.modules) and not under(name, rule.exempt)
        for imported in imported_set
        if under(imported, rule.forbidden)
    }
    assert not broken, f"{rule.name}:\n" + "\n".join(sorted(broken))


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_every_rule_names_modules_that_exist(rule: Rule):
    """A renamed or moved package must be renamed in the table too, not silently unchecked."""
    for prefix in (*rule.modules, *rule.exempt):
        if prefix != "*":
            assert any(under(m, (prefix,)) for m in MODULES), f"{rule.name}: no module {prefix}"


def package_of(module: str) -> str:
    """The unit a module belongs to: its subpackage of ``trak_dist`` (``trak_dist.store`` for
    ``trak_dist.store._rows``), ``launch``, or, for a module at ``trak_dist``'s root, itself
    (``trak_dist.config``; the root's private modules, ``trak_dist._compose``, are shared by
    the whole package)."""
    parts = module.split(".")
    if parts[0] != "trak_dist":
        return parts[0]
    return ".".join(parts[:2])


PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def deep_imports(imports: dict[str, set[str]], packages: set[str]) -> set[str]:
    """``A imports P.x`` for every module ``P.x`` of a package P (other than ``A``'s own) that
    a module A imports by more than P itself: a package is closed, its ``__init__`` is its API
    (so no module reaches another package's private modules)."""
    modules = set(imports)
    return {
        f"{name} imports {imported}"
        for name, found in imports.items()
        for imported in found
        if imported in modules
        and package_of(imported) in packages
        and package_of(imported) != package_of(name)
        and imported != package_of(imported)
    }


def package_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles between units (``package_of``), each as a path ``[a, b, …, a]``; edges
    into the root package (every ``from trak_dist import x`` names it) are left out."""
    modules = set(imports)
    graph: dict[str, set[str]] = {}
    for name, found in imports.items():
        for imported in found:
            # an imported name is a module, or a name inside one (the longest module prefix)
            target = next(
                (m for m in (imported, imported.rpartition(".")[0]) if m in modules), None
            )
            if target is None or target == "trak_dist":
                continue
            a, b = package_of(name), package_of(target)
            if a != b:
                graph.setdefault(a, set()).add(b)
    cycles = []
    for start in sorted(graph):  # one shortest cycle through each unit, breadth first
        paths = [[start]]
        while paths:
            path = paths.pop(0)
            nxt = sorted(graph.get(path[-1], ()))
            if start in nxt:
                cycles.append([*path, start])
                break
            paths += [[*path, n] for n in nxt if n not in path and n > start]
    return cycles


def test_packages_are_closed():
    """From outside a package only its ``__init__`` is imported: no reaching into
    ``trak_dist.store._zarr`` (or any module of another package), lazily or for type checking."""
    found = deep_imports(IMPORTS, PACKAGES)
    assert not found, "import the package, not its modules:\n" + "\n".join(sorted(found))


def test_no_import_cycle_between_packages():
    """Counting lazy and ``TYPE_CHECKING`` imports: a cycle means two packages that cannot be
    understood (or changed) one without the other."""
    cycles = package_cycles(IMPORTS)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_package_checks_can_fail():
    """Both checks on made-up sources: a deep import and a cycle are found."""
    fake = {
        "trak_dist.a": {"trak_dist.b"},
        "trak_dist.a._x": {"trak_dist.b._y", "trak_dist.c.f"},
        "trak_dist.b": {"trak_dist.b._y"},
        "trak_dist.b._y": {"trak_dist.c"},
        "trak_dist.c": {"trak_dist.a._x", "trak_dist"},
        "trak_dist": {"trak_dist.c"},
    }
    packages = {"trak_dist.a", "trak_dist.b"}
    assert deep_imports(fake, packages) == {
        "trak_dist.a._x imports trak_dist.b._y",
        "trak_dist.c imports trak_dist.a._x",
    }
    assert package_cycles(fake)[0] == ["trak_dist.a", "trak_dist.c", "trak_dist.a"]  # via c.f
    longer = {**fake, "trak_dist.a._x": {"trak_dist.b._y"}}
    assert package_cycles(longer)[0] == ["trak_dist.a", "trak_dist.b", "trak_dist.c", "trak_dist.a"]
    assert not package_cycles({k: v for k, v in fake.items() if k != "trak_dist.c"})


def test_the_checker_sees_lazy_relative_and_from_imports():
    """The walk itself: an import inside a function or a ``TYPE_CHECKING`` block, a relative
    import and ``from pkg import submodule`` are all found (else every rule above would pass
    vacuously)."""
    assert "trak_dist.distributed" in IMPORTS["trak_dist.evaluation"]  # lazy, in a function
    assert "trak_dist.distributed.driver" in IMPORTS["trak_dist.distributed"]  # TYPE_CHECKING
    assert "launch.slurm" in IMPORTS["launch"]  # `from . import slurm`, inside main()
    assert "trak_dist.lds.SubsetTrainer" in IMPORTS["trak_dist.distributed.eval_driver"]
    assert under("trak_dist.cli.main", ("trak_dist.cli",))
    assert not under("trak_dist.client", ("trak_dist.cli",))


LONG_LINES = 600  # generous: a module's length follows its job (STYLE.md, "Layout")
# modules past LONG_LINES, each with the reason its one job needs the length
LONG_MODULES: dict[str, str] = {}


def first_sentence(doc: str) -> str:
    """A docstring's first sentence, its whitespace collapsed (up to the first ``.``, ``!`` or
    ``?`` that ends a word, or the whole text)."""
    text = " ".join(doc.split())
    end = re.search(r"[.!?](?=\s|$)", text)
    return text[: end.end()] if end else text


def job_problems(
    sources: dict[str, str], long_ok: dict[str, str], bound: int = LONG_LINES
) -> list[str]:
    """What breaks "one module, one job" in ``sources`` (path → text): a module whose docstring
    does not open with a sentence stating its job (none, or under four words), two modules
    stating the same job, a module past ``bound`` lines not in ``long_ok`` (path → why), and an
    entry of ``long_ok`` that names no module past ``bound``."""
    problems = []
    jobs: dict[str, list[str]] = {}
    for path, text in sorted(sources.items()):
        doc = ast.get_docstring(ast.parse(text, path))
        job = first_sentence(doc or "")
        if len(job.split()) < 4:
            problems.append(f"{path}: its docstring does not open with a sentence stating its job")
        else:
            jobs.setdefault(job.lower(), []).append(path)
        lines = len(text.splitlines())
        if lines > bound and path not in long_ok:
            problems.append(
                f"{path}: {lines} lines, past {bound}: list it in LONG_MODULES with the reason "
                "its one job needs them, or split it where it does two"
            )
    problems += [
        f"{', '.join(paths)} state the same job: {job!r}"
        for job, paths in sorted(jobs.items())
        if len(paths) > 1
    ]
    problems += [
        f"LONG_MODULES names {path}, which is not past {bound} lines (drop it)"
        for path in sorted(long_ok)
        if path not in sources or len(sources[path].splitlines()) <= bound
    ]
    return problems


def test_one_module_one_job():
    """STYLE.md: one job per module, its length following the job. Every module opens with a
    docstring whose first sentence states its job, no two state the same one, and a module far
    past the usual length says why (``LONG_MODULES``)."""
    sources = {str(path.relative_to(ROOT)): path.read_text() for path in MODULES.values()}
    problems = job_problems(sources, LONG_MODULES)
    assert not problems, "one module, one job:\n" + "\n".join(problems)


def test_the_one_job_check_can_fail():
    """The check on made-up sources: each way of breaking the rule is found, and only those."""
    fine = '"""Reads the rows of a store back. More detail."""\n'
    sources = {
        "a.py": fine,
        "b.py": fine.replace("More", "Other"),  # the same first sentence
        "c.py": "x = 1\n",  # no docstring
        "d.py": '"""Helpers."""\n',  # no job stated
        "e.py": '"""Writes one long table of things."""\n' + "x = 1\n" * 20,
        "f.py": '"""Writes another long table of things."""\n' + "x = 1\n" * 20,
    }
    problems = job_problems(sources, {"f.py": "a table", "g.py": "gone"}, bound=10)
    assert [p.split(":")[0].split(",")[0] for p in problems] == [
        "c.py",
        "d.py",
        "e.py",
        "a.py",
        "LONG_MODULES names g.py",
    ]
    assert "b.py" in problems[3]
    assert not job_problems({"a.py": fine}, {})
