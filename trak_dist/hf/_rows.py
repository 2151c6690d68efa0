"""Read a table of text rows: JSONL/JSON, CSV, Parquet, or a ``datasets.save_to_disk``
directory, into a ``datasets.Dataset`` (in memory: nothing is cached or written)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trak_dist.errors import ConfigError, DataError
from trak_dist.remote import local_copy


def read_rows(path: str | Path, what: str) -> Any:
    """The rows of ``path`` in file order (row i of the store is row i of the file).

    Raises:
        ConfigError: a missing path or an unknown file type.
        DataError: a malformed JSONL line (with its line number), an empty table.
    """
    import datasets

    p = local_copy(path, what).expanduser()  # a URL: this node's copy
    if not p.exists():
        raise ConfigError(f"{what}={str(path)!r} does not exist; give a data file or directory.")
    suffix = p.suffix.lower()
    try:
        if p.is_dir():
            ds = datasets.load_from_disk(str(p), keep_in_memory=True)
            if isinstance(ds, datasets.DatasetDict):
                raise ConfigError(
                    f"{what}={str(path)!r} holds several splits {list(ds)}; give one split's "
                    f"directory, e.g. {p / next(iter(ds))}."
                )
        elif suffix == ".jsonl":
            ds = datasets.Dataset.from_list(_jsonl(p, what))
        elif suffix == ".json":
            ds = _json(p, what)
        elif suffix in (".csv", ".parquet"):
            ds = datasets.Dataset(_arrow(p, suffix))
        else:
            raise ConfigError(
                f"{what}={str(path)!r}: unknown file type {suffix!r}; expected .jsonl, .json, "
                ".csv, .parquet or a datasets.save_to_disk directory."
            )
    except (ConfigError, DataError):
        raise
    except (datasets.exceptions.DatasetGenerationError, ValueError, TypeError) as e:
        raise DataError(f"{what}={str(path)!r} cannot be read as a table: {e}") from e
    if len(ds) == 0:
        raise DataError(f"{what}={str(path)!r} has no rows.")
    return ds


def _jsonl(path: Path, what: str) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{what}={str(path)!r}: line {number} is not valid JSON ({e.msg} at column "
                    f"{e.colno}); every line must be one JSON object."
                ) from e
            if not isinstance(row, dict):
                raise DataError(
                    f"{what}={str(path)!r}: line {number} is a JSON {type(row).__name__}, not an "
                    "object with named columns."
                )
            rows.append(row)
    return rows


def _json(path: Path, what: str) -> Any:
    import datasets

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(
            f"{what}={str(path)!r} is not valid JSON ({e.msg} at line {e.lineno}, column "
            f"{e.colno})."
        ) from e
    if isinstance(data, list):
        return datasets.Dataset.from_list(data)
    if isinstance(data, dict):
        return datasets.Dataset.from_dict(data)
    raise DataError(f"{what}={str(path)!r} holds a JSON {type(data).__name__}; expected rows.")


def _arrow(path: Path, suffix: str) -> Any:
    if suffix == ".csv":
        from pyarrow import csv

        return csv.read_csv(path)
    from pyarrow import parquet

    return parquet.read_table(path)
