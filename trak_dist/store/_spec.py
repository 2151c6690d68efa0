"""What defines a store's features (docs/design.md, invariant 4): the ``FeatureSpec`` a store
is created with and opened against. The fingerprints that tie it to its inputs are
``_fingerprints.py``'s."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trak_dist.errors import ConfigError, StoreMismatchError

# 2: checksummed chunks with sentinel fills, row hashes H, staged shadows, checkpoint binding,
# complete flags, λ per checkpoint, eval/<exp> and projection_params (issues 9-12); version 1
# stores are refused. Chunk shapes are read from each array's metadata, so older layouts read.
FORMAT_VERSION = 2
DTYPES = ("float16", "float32")
CURVATURES = ("xtx", "fisher")  # what the stored K is the Gram of


@dataclass(frozen=True)
class FeatureSpec:
    """Everything that changes the projected gradients X a store holds.

    Attributes:
        proj_dim: p the features were computed at; any p' ≤ p can be scored (prefix property).
        projection: ``rademacher``, ``normal``, ``identity`` or ``kronecker``.
        seed: projector seed.
        grad_wrt: parameter names differentiated, or None for all.
        model_output: the task's ``module:Class``.
        grad_dim: d, the number of gradient entries.
        train_size: n.
        dataset_fingerprint: ``dataset_fingerprint()`` of the train set.
        dtype: storage dtype of X, ``float16`` or ``float32``.
        chunk_rows: rows per Zarr chunk; the unit of work and of commits.
        format_version: layout version of the store.
        projection_params: what else defines P (the Kronecker projector's ``spec_params``:
            column sharing, pair order, digest of the parameter views); empty for the others.
        curvature: what K's Gram (the ``xtx`` node) is: ``xtx`` (XᵀX of the rows) or
            ``fisher`` (GᵀG of the sampled-label Fisher's rows G, stored beside X; their
            labels are drawn with ``seed``: ``tasks/_sampled.py``).
        fisher_draws: D, label draws per row for ``fisher``: G holds D rows per example and K
            is the mean of the D draws' Grams (1 with ``xtx``).
    """

    proj_dim: int
    projection: str
    seed: int
    grad_wrt: tuple[str, ...] | None
    model_output: str
    grad_dim: int
    train_size: int
    dataset_fingerprint: str
    dtype: str = "float16"
    chunk_rows: int = 256
    format_version: int = FORMAT_VERSION
    projection_params: str = ""
    curvature: str = "xtx"
    fisher_draws: int = 1

    def __post_init__(self) -> None:
        for name in ("proj_dim", "grad_dim", "train_size", "chunk_rows"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r}; expected a positive integer.")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r}; expected one of {DTYPES}.")
        if self.curvature not in CURVATURES:
            raise ConfigError(f"curvature={self.curvature!r}; expected one of {CURVATURES}.")
        if not isinstance(self.fisher_draws, int) or self.fisher_draws < 1:
            raise ConfigError(f"fisher_draws={self.fisher_draws!r}; expected a positive integer.")
        if self.fisher_draws > 1 and self.curvature != "fisher":
            raise ConfigError(
                f"fisher_draws={self.fisher_draws} draws labels for the sampled-label Fisher; "
                f"with curvature={self.curvature!r} there are none to draw (use 1, or "
                "featurize.curvature=fisher)."
            )

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["grad_wrt"] = None if self.grad_wrt is None else list(self.grad_wrt)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FeatureSpec:
        d = dict(d)
        if d.get("grad_wrt") is not None:
            d["grad_wrt"] = tuple(d["grad_wrt"])
        return cls(**d)

    def check_compatible(self, stored: FeatureSpec, where: str) -> None:
        """Raise StoreMismatchError unless features ``stored`` can serve this request: every
        field must match, except a smaller proj_dim (served by the stored prefix)."""
        diffs = []
        for f in dataclasses.fields(self):
            mine, theirs = getattr(self, f.name), getattr(stored, f.name)
            if f.name == "proj_dim" and mine <= theirs:
                continue
            if mine != theirs:
                diffs.append(f"{f.name}: store has {theirs!r}, requested {mine!r}")
        if diffs:
            raise StoreMismatchError(
                f"the store at {where} was written with different settings:\n  - "
                + ";\n  - ".join(diffs)
                + ".\nUse a new store path for the new settings, or open it with the stored "
                "ones (a smaller proj_dim is fine: it reuses the prefix of the stored features)."
            )
