"""Featurisation cost on GPT-2-architecture models against their own training step, one process.

    python -m benchmarks.gpt2_featurize [--sizes 1M,25M,100M] [--proj-dim 2048] [--micro-batch 8]
    python -m benchmarks.gpt2_featurize --sizes 1M,6M --lm-defaults --dense-rounds 3

For each model (``GPT2LMHeadModel`` from a config, random init, eager attention, 128 tokens a
row; see ``benchmarks/_gpt2.py``) and each variant, micro-batches of ``--micro-batch`` rows are
timed in ``--rounds`` interleaved rounds after one warm-up micro-batch (the hook engine's first
micro-batch also runs its sum check); the median is reported:

- ``train step``: forward + backward of the mean next-token cross-entropy (train mode, no
  optimiser step), the yardstick;
- ``hooks + kronecker``, ``hooks + dense``, ``vmap + dense``: ``Featurizer.featurize`` (X and Q)
  with the ``causal_lm`` task (the sum of next-token margins; the hook engine takes Q from the
  same forward pass, vmap runs one more), proj_dim ``--proj-dim``; dense = the torch
  Rademacher projector, whose P is generated once into a 512 MiB cache at one bit per entry
  and regenerated every micro-batch beyond it (d·p > 4.3·10⁹);
- ``hooks + kronecker, Q apart``: the same X, with Q from a forward pass of its own (as for a
  task without ``get_outputs_and_q``).

With ``--lm-defaults`` the variants are instead issue 29's: the causal-LM default (Kronecker
p = 2048 and the sampled-label Fisher's rows G, a second backward), the same with
``fisher_draws=4``, and the default it replaced (dense p = 512), each as a worker runs it per
micro-batch; the last column gives each default's time over the old one's.

Dense variants run only where d ≤ ``--dense-max-d``: beyond it, regenerating P costs d·p hash
evaluations per micro-batch; the table then says so with the time that would take at the hash
rate measured here. Peak RSS is sampled (psutil, every 5 ms) during each variant and reported
above the RSS at its start, after the warm-up (so the Kronecker factors cached per checkpoint are
in the baseline; their size is listed apart).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import statistics
import threading
import time
from collections.abc import Callable

import psutil
import torch

from benchmarks._gpt2 import SIZES, gpt2, lm_loss
from benchmarks._table import table
from trak_dist.featurize import Featurizer, build_featurizer
from trak_dist.gradients import GradientComputer, HookGradientComputer
from trak_dist.projection import KroneckerProjector, rademacher_block
from trak_dist.tasks import resolve_task

TOKENS = 128
MB = 2**20
LM_P = (2048, 512)  # --lm-defaults: the causal-LM default's p, and the old default's
DENSE_CACHE_ENTRIES = 512 * 2**20 * 8  # the torch projector's packed P cache, one bit an entry


class PeakRSS:
    """Samples this process's RSS in a thread while the ``with`` block runs."""

    def __init__(self) -> None:
        self.proc = psutil.Process()

    def __enter__(self) -> PeakRSS:
        gc.collect()
        _trim()
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def above_start(self) -> float:
        return (self.peak - self.start) / MB


def _trim() -> None:
    """Give freed heap back to the OS so one variant's leftovers do not hide the next's peak."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def hash_rate() -> float:
    """Rademacher entries of P generated per second here (the dense projector's inner cost)."""
    rademacher_block(0, 0, 0, 1024, 0, 2048)
    t0 = time.perf_counter()
    rademacher_block(0, 0, 0, 16384, 0, 2048)
    return 16384 * 2048 / (time.perf_counter() - t0)


def train_step(model: torch.nn.Module) -> Callable[[tuple[torch.Tensor, torch.Tensor]], None]:
    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        lm_loss(model, *batch).backward()
        model.zero_grad(set_to_none=True)
        model.eval()

    return step


def featurize(f: Featurizer) -> Callable[[tuple[torch.Tensor, torch.Tensor]], None]:
    return lambda batch: f.featurize(batch, 0)


def featurize_q_apart(f: Featurizer) -> Callable[[tuple[torch.Tensor, torch.Tensor]], None]:
    """X, then Q from a forward pass of its own (the path of a task without
    ``get_outputs_and_q``): what the fused Q saves."""
    return lambda batch: (f.project(batch, 0), f.computer.out_to_loss(batch))


def run_size(size: str, args: argparse.Namespace, rate: float) -> list[list[object]]:
    model = gpt2(size, TOKENS)
    d = sum(p.numel() for p in model.parameters())
    task = resolve_task("causal_lm")
    gen = torch.Generator().manual_seed(0)
    vocab = SIZES[size][3]

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(2, vocab, (args.micro_batch, TOKENS), generator=gen)
        return ids, torch.ones_like(ids)

    p, b = args.proj_dim, args.micro_batch
    hooks = HookGradientComputer(model, task)
    kron = build_featurizer(hooks, "kronecker", p, micro_batch=b)
    variants: dict[str, Callable | None] = {"train step": train_step(model)}
    if args.lm_defaults:
        variants.update(lm_default_variants(hooks, d, b))
        return timed(size, d, variants, batch, args, rate, kron, p_dense=LM_P[1])
    variants["hooks + kronecker"] = featurize(kron)
    variants["hooks + kronecker, Q apart"] = featurize_q_apart(kron)
    dense_ok = d <= args.dense_max_d
    variants["hooks + dense"] = (
        featurize(build_featurizer(hooks, "rademacher", p, micro_batch=b)) if dense_ok else None
    )
    variants["vmap + dense"] = (
        featurize(build_featurizer(GradientComputer(model, task), "rademacher", p, micro_batch=b))
        if dense_ok
        else None
    )
    return timed(size, d, variants, batch, args, rate, kron, p_dense=p)


def lm_default_variants(hooks: HookGradientComputer, d: int, b: int) -> dict[str, Callable | None]:
    """Issue 29's cost goal: the causal-LM default (Kronecker p = 2048 with the sampled-label
    Fisher's rows G, a second backward), with 4 label draws, and the default it replaced
    (dense p = 512, XᵀX), each as a worker runs it per micro-batch."""
    from benchmarks.device.featurize import with_fisher

    new_p, old_p = LM_P
    lm_new = build_featurizer(hooks, "kronecker", new_p, micro_batch=b, curvature="fisher")
    old_ok = d * old_p <= DENSE_CACHE_ENTRIES
    return {
        f"LM default: kronecker {new_p} + fisher": with_fisher(lm_new),
        "LM default + fisher_draws=4": with_fisher(lm_new, 4),
        f"old LM default: dense {old_p}": (
            featurize(build_featurizer(hooks, "rademacher", old_p, micro_batch=b))
            if old_ok
            else None
        ),
    }


def timed(
    size: str,
    d: int,
    variants: dict[str, Callable | None],
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    args: argparse.Namespace,
    rate: float,
    kron: Featurizer,
    p_dense: int,
) -> list[list[object]]:
    """Warm-up, interleaved rounds (``--rounds``; dense ones ``--dense-rounds``), table rows."""
    p, b = p_dense, args.micro_batch
    times: dict[str, list[float]] = {k: [] for k in variants}
    peaks: dict[str, float] = dict.fromkeys(variants, 0.0)
    for fn in variants.values():  # warm-up: first-call costs, the hook sum check
        if fn is not None:
            fn(batch())
    rounds = {k: (args.dense_rounds if "dense" in k else args.rounds) for k in variants}
    for r in range(max(rounds.values())):
        for name, fn in variants.items():
            if fn is None or r >= rounds[name]:
                continue
            data = batch()
            with PeakRSS() as rss:
                t0 = time.perf_counter()
                fn(data)
                times[name].append((time.perf_counter() - t0) / b)
            peaks[name] = max(peaks[name], rss.above_start)
        # each round's s/row, to see the noise of a shared machine behind the medians
        done = ", ".join(f"{k} {v[r]:.3g}" for k, v in times.items() if len(v) > r)
        print(f"  {size}: round {r + 1} s/row: {done}", flush=True)
    base = statistics.median(times["train step"])
    assert isinstance(kron.projector, KroneckerProjector)
    factors = sum(a.numel() + c.numel() for a, c in kron.projector._factors.values()) * 4 / MB
    rows: list[list[object]] = []
    for name in variants:
        if not times[name]:
            minutes = d * p / rate / 60
            note = (
                f"not run: d·p = {d * p:.2g} entries, over the packed P cache's 512 MiB: "
                f"regenerated every micro-batch ≈ {minutes:.0f} min"
            )
            rows.append([size, d, name, "-", "-", "-", "-", note])
            continue
        s = statistics.median(times[name])
        extra = f"factors {factors:.1f} MB" if name == "hooks + kronecker" else ""
        rows.append([size, d, name, 1 / s, TOKENS / s, s / base, peaks[name], extra])
    old = next((r for r in rows if str(r[2]).startswith("old LM default") and r[3] != "-"), None)
    for r in rows:
        if old is not None and str(r[2]).startswith("LM default"):
            r[7] = f"{float(old[3]) / float(r[3]):.2f} × the old default's time"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="1M,25M,100M")
    ap.add_argument("--proj-dim", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dense-rounds", type=int, default=1)
    ap.add_argument("--dense-max-d", type=int, default=2_000_000)
    ap.add_argument(
        "--lm-defaults",
        action="store_true",
        help="time the causal-LM default (and 4 label draws) against the old default instead",
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: steady timings on a shared CPU)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rate = hash_rate()
    rows = []
    for size in args.sizes.split(","):
        rows += run_size(size, args, rate)
    print(
        f"\nGPT-2 featurisation, {TOKENS} tokens/row, proj_dim={args.proj_dim}, micro-batch "
        f"{args.micro_batch}, torch threads {torch.get_num_threads()}, hash rate "
        f"{rate / 1e6:.0f} M entries/s\n"
    )
    headers = ["model", "d", "variant", "rows/s", "tokens/s", "× train step", "peak RSS +MB", ""]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
