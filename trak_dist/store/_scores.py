"""Score arrays of one (experiment, proj_dim, λ) variant: S and per-target top-k."""

from __future__ import annotations

from typing import Any

import numpy as np
import zarr

from trak_dist.errors import StoreStateError
from trak_dist.store._zarr import array, attr_int

TOPK_ARRAYS = ("proponents_idx", "proponents_val", "opponents_idx", "opponents_val")


def variant_name(proj_dim: int, lambda_reg: float | str, kinv_scaling: str = "mean_abs") -> str:
    """``p512_lambda0.01`` or ``p512_lambdaauto``: the key of a scoring variant (``_rawkinv``
    appended without scaling)."""
    lam = lambda_reg if isinstance(lambda_reg, str) else f"{lambda_reg:g}"
    name = f"p{proj_dim}_lambda{lam}"
    return name if kinv_scaling == "mean_abs" else f"{name}_rawkinv"


class ScoreSet:
    """``S [n, m]`` float32 plus the ``k`` highest (proponents) and lowest (opponents) train
    examples of every target. Written by one process (the reducer); ``complete`` is set last.
    """

    def __init__(self, group: zarr.Group) -> None:
        self.group = group
        self.S = array(group, "S")
        self.topk = attr_int(group, "topk")

    @classmethod
    def create(
        cls,
        parent: zarr.Group,
        name: str,
        n: int,
        m: int,
        topk: int,
        chunk_rows: int,
        attrs: dict[str, Any],
    ) -> ScoreSet:
        group = parent.require_group(name)
        for key in list(group.keys()):
            del group[key]
        group.attrs.update({**attrs, "topk": int(topk), "complete": False})
        group.create_array(
            "S",
            shape=(n, m),
            chunks=(min(n, chunk_rows), min(m, 1024)),
            dtype="float32",
            compressors=None,
            fill_value=0,
        )
        k = min(topk, n)
        for key in TOPK_ARRAYS:
            dtype = "int64" if key.endswith("idx") else "float32"
            group.create_array(
                key,
                shape=(m, k),
                chunks=(min(m, 4096), max(k, 1)),
                dtype=dtype,
                compressors=None,
                fill_value=0,
            )
        return cls(group)

    @property
    def attrs(self) -> dict[str, Any]:
        """What defines the variant: proj_dim, lambda_reg, lambdas (per checkpoint), …"""
        return dict(self.group.attrs)

    @property
    def complete(self) -> bool:
        return bool(self.group.attrs.get("complete", False))

    def mark_complete(self) -> None:
        self.group.attrs["complete"] = True

    def write_block(self, r0: int, c0: int, block: np.ndarray) -> None:
        self.S[r0 : r0 + block.shape[0], c0 : c0 + block.shape[1]] = block

    def write_topk(self, c0: int, values: dict[str, np.ndarray]) -> None:
        for key in TOPK_ARRAYS:
            v = values[key]
            array(self.group, key)[c0 : c0 + v.shape[0]] = v

    def scores(self) -> np.ndarray:
        """S as one ``[n, m]`` array (reads it whole: mind its size)."""
        if not self.complete:
            raise StoreStateError("these scores were not completed; rerun finalize/score.")
        return np.asarray(self.S[:])

    def read_topk(self) -> dict[str, np.ndarray]:
        return {key: np.asarray(array(self.group, key)[:]) for key in TOPK_ARRAYS}
