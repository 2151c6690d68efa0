"""Compression ratio and write/read throughput of the store's codecs on real features.

    python -m benchmarks.store_codecs [--rows 60000] [--proj-dim 2048] [--cpu-time]

The rows are real projected gradients: the digits MLP's 1500 train examples featurised at
proj_dim (float16, as stored by default), tiled to ``--rows``. Each codec writes them through
``RowSet.write`` (whole 256-row chunks, as workers do) into a fresh store, then reads them back
whole; sizes are bytes on disk. All codecs run in this one invocation, three interleaved rounds
(medians), so their ratios compare. Every codec ends in the crc32c checksum the store always
writes; ``none, no crc32c`` is the same layout without it, to show what the checksum costs.
``--cpu-time`` times with the process's CPU time (all threads) instead of the wall clock: on a
machine shared with other jobs, wall-clock throughput measures the neighbours.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import zarr

from benchmarks._table import table
from tests.fixtures.synthetic import synthetic_spec
from trak_dist.featurize import Featurizer
from trak_dist.gradients import GradientComputer
from trak_dist.projection import TorchProjector
from trak_dist.store import CODECS, FeatureStore, RowSet
from trak_dist.store._zarr import compressors
from trak_dist.tasks import ImageClassification

CHUNK = 256
CLOCK = time.perf_counter
NO_CRC = "none, no crc32c"


def real_features(proj_dim: int, cache: Path) -> np.ndarray:
    from trak_dist.examples import digits

    model = digits.make_model()
    computer = GradientComputer(model, ImageClassification())
    computer.load_state_dict(torch.load(digits.checkpoints(cache_dir=str(cache))[0]))
    proj = TorchProjector(computer.layout.grad_dim, proj_dim)
    x, _ = Featurizer(computer, proj, 256).featurize(digits.train_set().tensors, 0)
    return x.numpy().astype(np.float16)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(codec: str, data: np.ndarray, root: Path) -> list[object]:
    n, p = data.shape
    spec = synthetic_spec(n, p, chunk_rows=CHUNK)
    path = root / f"{codec.replace(' ', '_').replace(',', '')}.zarr"
    if codec == NO_CRC:
        node = zarr.open_group(path, mode="a").require_group("train/0")
        chain = compressors("none", checksum=False)
        rows = RowSet.create(node, n, p, CHUNK, spec.dtype, chain, with_q=False)
    else:
        rows = FeatureStore.create_or_open(path, spec, codec).ensure_checkpoint(0)
    t0 = CLOCK()
    for s in range(0, n, 16 * CHUNK):
        rows.write(s, data[s : s + 16 * CHUNK])
    write_s = CLOCK() - t0
    t0 = CLOCK()
    back = rows.read(0, n)
    read_s = CLOCK() - t0
    if not np.array_equal(back, data):
        raise AssertionError(f"{codec}: rows read back differ from rows written")
    size = du(path / "train" / "0" / "X")
    shutil.rmtree(path)
    mb = data.nbytes / 2**20
    return [codec, data.nbytes / size, mb / write_s, mb / read_s]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--proj-dim", type=int, default=2048)
    parser.add_argument("--cpu-time", action="store_true", help="MB per CPU-second")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = real_features(args.proj_dim, root / "cache")
        data = np.resize(base, (args.rows, args.proj_dim))
        # three interleaved rounds, medians: the first pass over a fresh file is noisy
        codecs = (NO_CRC, *CODECS)
        rounds = [[measure(c, data, root) for c in codecs] for _ in range(3)]
        results = [
            [codec, *np.median([[r[i][k] for r in rounds] for k in (1, 2, 3)], axis=1)]
            for i, codec in enumerate(codecs)
        ]
    print(
        f"\nStore codecs: {args.rows} × {args.proj_dim} float16 real features "
        f"({data.nbytes / 2**20:.0f} MiB), chunks of {CHUNK} rows"
    )
    unit = "MB/CPU-s" if args.cpu_time else "MB/s"
    print(table(["codec", "ratio", f"write {unit}", f"read {unit}"], results))


if __name__ == "__main__":
    main()
