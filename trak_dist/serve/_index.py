"""What a query needs from the store, held for exact top-k by blocked matmul.

``compute_scores`` (scoring/_blocks.py) scores target t against train row i as

    S[i, t] = (Σ_c X_c[i] · Y_c[t] / C) · (Σ_c Q_c[i] / C),   Y_c = float32(X_tc K_c⁻¹)

with K_c⁻¹ the float64 inverse of checkpoint c (at its resolved λ, scaled as ``kinv_scaling``
says). The index keeps the train side of that formula, and nothing else: the rows of every
checkpoint side by side, ``X = [X_1 … X_C]`` ``[n, C·p]`` as stored (so a float16 store loses
nothing in a float16 index), ``qsum = Σ_c Q_c`` ``[n]`` (float32, summed in checkpoint order as
``compute_scores`` does) and each K_c⁻¹. A query applies K_c⁻¹ on its own side
(``target_side``) and then costs one pass over X, ``block_rows`` rows at a time, keeping only
the running top-k: memory O(block_rows · m) besides the index, whatever n.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trak_dist.errors import ConfigError, StoreStateError
from trak_dist.scoring import Factorization, ensure_factor, parse_lambda
from trak_dist.scoring._blocks import _merge_topk
from trak_dist.store import FeatureStore, RowSet

INDEX_DTYPES = ("float32", "float16")
READ_ROWS = 16384  # rows read from the store at a time while the index is built


def _factor(store: FeatureStore, model_id: int, p: int) -> Factorization:
    """The stored factorisation (never written here: the service opens the store read-only)."""
    if store.read_factor(model_id, p) is not None:
        return ensure_factor(store, model_id, p)
    xtx = store.read_xtx(model_id)
    if xtx is None:
        raise StoreStateError(
            f"model_id={model_id} has no XᵀX in {store.where}: its train features are not "
            "finalised. Run the batch job (`trak-dist` with the same overrides) first."
        )
    return Factorization.of(xtx[:p, :p], store.spec.train_size, "cpu", f"model_id={model_id}")


@dataclass(frozen=True)
class TopK:
    """Per target, the ``k`` highest (proponents) and lowest (opponents) scores, ``[m, k]``
    each; opponents' values ascend from the lowest."""

    proponents_idx: np.ndarray
    proponents_val: np.ndarray
    opponents_idx: np.ndarray
    opponents_val: np.ndarray


class AttributionIndex:
    """The train side of the scores, for exact top-k over all n train rows.

    Build it with ``from_store``. Args of the constructor are the parts themselves:

    Args:
        x: ``[n, C·p]`` train rows of every checkpoint side by side (a tensor, or a memory-mapped
            array read block by block).
        qsum: ``[n]`` float32 Σ_c Q_c.
        kinvs: per checkpoint, ``[p, p]`` float64 K_c⁻¹ as ``compute_scores`` applies it.
        lambdas: the λ used per checkpoint (as the score set records it).
        block_rows: train rows per matmul block.
        device: where the matmuls run.
    """

    def __init__(
        self,
        x: torch.Tensor | np.ndarray,
        qsum: torch.Tensor,
        kinvs: Sequence[torch.Tensor],
        lambdas: Sequence[float],
        block_rows: int = 65536,
        device: torch.device | str = "cpu",
    ) -> None:
        self.x = x
        self.device = torch.device(device)
        self.qsum = qsum.to(self.device, torch.float32)
        self.kinvs = [k.to(self.device, torch.float64) for k in kinvs]
        self.lambdas = list(lambdas)
        self.block_rows = block_rows
        self.num_checkpoints = len(self.kinvs)
        self.proj_dim = int(self.kinvs[0].shape[0])
        self.train_size = int(x.shape[0])

    @classmethod
    def from_store(
        cls,
        store: FeatureStore,
        model_ids: Sequence[int],
        proj_dim: int | None = None,
        lambda_reg: float | str = "auto",
        kinv_scaling: str = "mean_abs",
        dtype: str = "float32",
        mmap_dir: str | Path | None = None,
        block_rows: int = 65536,
        device: torch.device | str = "cpu",
    ) -> AttributionIndex:
        """The index of ``store``'s train features of ``model_ids`` at ``proj_dim`` (None: the
        stored width), with the λ ``compute_scores`` would use for ``lambda_reg``.

        ``mmap_dir``: write X there once as ``.npy`` (reused while the store's metadata and these
        settings match) and memory-map it instead of holding it in memory.

        Raises:
            ConfigError: a bad dtype or proj_dim.
            StoreStateError: a checkpoint's train features are incomplete or not finalised.
        """
        if dtype not in INDEX_DTYPES:
            raise ConfigError(f"serve.index_dtype={dtype!r}; expected one of {INDEX_DTYPES}.")
        spec, ids = store.spec, [int(c) for c in model_ids]
        p = spec.proj_dim if proj_dim is None else proj_dim
        if not 1 <= p <= spec.proj_dim:
            raise ConfigError(
                f"proj_dim={p}; the store at {store.where} holds features of width "
                f"{spec.proj_dim}, so any proj_dim in [1, {spec.proj_dim}] can be served."
            )
        if not ids:
            raise ConfigError("no checkpoints to serve: model.checkpoints is empty.")
        lam = parse_lambda(lambda_reg)
        rows = []
        for c in ids:
            rs = store.train_rows(c)
            if not rs.is_complete():
                raise StoreStateError(
                    f"model_id={c}: the train features in {store.where} are incomplete. Run "
                    "the batch job (`trak-dist` with the same overrides) to finish them first."
                )
            rows.append(rs)
        store.check_same_items(list(zip(ids, rows, strict=True)), "train")
        kinvs, lambdas = [], []
        for c in ids:
            factor = _factor(store, c, p)
            lam_c = factor.resolve_lambda(lam, f"model_id={c}")
            kinvs.append(torch.as_tensor(factor.kinv(lam_c, kinv_scaling, f"model_id={c}")))
            lambdas.append(lam_c)
        n = spec.train_size
        qsum = torch.zeros(n, dtype=torch.float32)
        for rs in rows:
            for r0 in range(0, n, READ_ROWS):
                qsum[r0 : r0 + READ_ROWS] += torch.as_tensor(rs.read_q(r0, min(n, r0 + READ_ROWS)))
        width = p * len(ids)
        if mmap_dir is None:
            x: torch.Tensor | np.ndarray = torch.empty((n, width), dtype=getattr(torch, dtype))
            _fill(x, rows, p)
        else:
            key = {"store": str(store.where), "spec": spec.to_json(), "ids": ids, "p": p}
            x = _mapped(Path(mmap_dir), key, dtype, (n, width), rows, p)
        return cls(x, qsum, kinvs, lambdas, block_rows, device)

    def target_side(self, xt: Sequence[np.ndarray | torch.Tensor]) -> torch.Tensor:
        """``[m, C·p]`` float32 Y: per checkpoint ``float32(float64(x_tc) K_c⁻¹)``, the
        computation (and rounding) of ``compute_scores``.

        Args:
            xt: per checkpoint, ``[m, p]`` target rows rounded to the store's dtype.
        """
        if len(xt) != self.num_checkpoints:
            raise ConfigError(f"{len(xt)} target row sets for {self.num_checkpoints} checkpoints.")
        ys = [
            (torch.as_tensor(x, device=self.device).double()[:, : self.proj_dim] @ k).float()
            for x, k in zip(xt, self.kinvs, strict=True)
        ]
        return torch.cat(ys, dim=1)

    def _rows(self, r0: int, r1: int) -> torch.Tensor:
        """Train rows ``[r0, r1)`` of X as float32 on the index's device."""
        xb = self.x[r0:r1]  # a row range: contiguous, also in a memory map
        block = torch.from_numpy(xb) if isinstance(xb, np.ndarray) else xb
        return block.to(self.device, torch.float32)

    def _block(self, y: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        """Scores ``[r1 - r0, m]`` of train rows ``[r0, r1)``: ``compute_scores``' formula."""
        c = self.num_checkpoints
        return (self._rows(r0, r1) @ y.T / c) * (self.qsum[r0:r1] / c)[:, None]

    def scores(self, y: torch.Tensor) -> torch.Tensor:
        """``[n, m]`` float32 scores of targets ``y`` (from ``target_side``); small n only."""
        n, step = self.train_size, self.block_rows
        return torch.cat([self._block(y, r0, min(n, r0 + step)) for r0 in range(0, n, step)])

    def topk(self, y: torch.Tensor, k: int) -> TopK:
        """Exact top-``k`` proponents and opponents of targets ``y`` (from ``target_side``)."""
        k = min(k, self.train_size)
        best = worst = None
        for r0 in range(0, self.train_size, self.block_rows):
            block = self._block(y, r0, min(self.train_size, r0 + self.block_rows))
            best = _merge_topk(best, block, r0, k)
            worst = _merge_topk(worst, -block, r0, k)
        assert best is not None and worst is not None  # n ≥ 1
        return TopK(
            best[1].T.cpu().numpy(),
            best[0].T.cpu().numpy(),
            worst[1].T.cpu().numpy(),
            (-worst[0]).T.cpu().numpy(),
        )


def _fill(x: torch.Tensor | np.ndarray, rows: Sequence[RowSet], p: int) -> None:
    """Copy every checkpoint's first ``p`` columns into its slot of ``x``."""
    n = x.shape[0]
    for j, rs in enumerate(rows):
        for r0 in range(0, n, READ_ROWS):
            r1 = min(n, r0 + READ_ROWS)
            block = rs.read(r0, r1, p)
            if isinstance(x, torch.Tensor):
                x[r0:r1, j * p : (j + 1) * p] = torch.from_numpy(block)
            else:
                x[r0:r1, j * p : (j + 1) * p] = block


def _mapped(
    folder: Path,
    key: dict[str, object],
    dtype: str,
    shape: tuple[int, int],
    rows: Sequence[RowSet],
    p: int,
) -> np.ndarray:
    """X memory-mapped from ``folder``: written once (to a temporary name, then renamed, so a
    killed build leaves no half file that looks whole) and reused while ``key`` matches."""
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = folder / f"index-{digest}-{dtype}.npy"
    if not path.is_file():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
        _fill(out, rows, p)
        out.flush()
        del out
        os.replace(tmp, path)
    # copy-on-write: torch takes its blocks without a copy (it refuses read-only memory), and
    # the file is never written
    mapped = np.load(path, mmap_mode="c")
    if mapped.shape != shape or mapped.dtype != np.dtype(dtype):
        raise StoreStateError(
            f"the memory-mapped index {path} holds {mapped.shape} {mapped.dtype}, expected "
            f"{shape} {dtype}. Delete it (it is rebuilt from the store)."
        )
    return mapped
