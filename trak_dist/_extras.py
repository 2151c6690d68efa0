"""Optional extras (``[project.optional-dependencies]`` in pyproject.toml): which module comes
with which extra. A feature whose extra is missing stops with one line naming the ``pip
install`` to run (``failures.describe``), wherever the import happens: lazily, in a worker, in
a Ray task. A new extra adds its modules here."""

from __future__ import annotations

EXTRAS = {
    "transformers": "hf",
    "tokenizers": "hf",
    "datasets": "hf",
    "peft": "hf",
    "matplotlib": "plot",
    "faiss": "ann",
}


def missing_extra(error: BaseException) -> str | None:
    """The line for an import of a module an extra provides that failed, else None."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    module = error.name.split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    return (
        f"{module} is not installed; this needs trak_dist's {extra!r} extra: run "
        f"`pip install 'trak_dist[{extra}]'` (in a clone: `pip install '.[{extra}]'`), then rerun."
    )
