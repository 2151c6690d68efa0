"""Section ``featurize``: a GPT-2-small-size causal LM (``GPT2LMHeadModel`` from a config:
vocab 50257, 768 wide, 12 layers, 124M parameters, random init, bf16) featurised with the hook
engine and the ``causal_lm`` task, Kronecker and dense (the CUDA kernel) projection at
p = 4096, against one plain training step (forward + backward of the mean next-token loss, no
optimiser step) on the same batch: 16 rows of 512 tokens. Issue 29's cost goal on the GPU too:
the causal-LM default (Kronecker p = 2048 with the sampled-label Fisher's rows G, a second
backward) against the default it replaced (dense p = 512).

Each variant runs once to warm up (the hook engine's first micro-batch also checks its sums
against autograd), then in up to 3 interleaved rounds while the budget lasts; the median is
reported, with the peak GPU memory of a round. The dry run: a 0.1M-parameter GPT-2 on the CPU
(bf16, 2 rows of 16 tokens, p = 32, one round)."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

from benchmarks._gpt2 import TOKENS as SPECIAL_TOKENS
from benchmarks.device._section import Section, sync
from benchmarks.gpt2_featurize import featurize, train_step
from trak_dist.featurize import Featurizer, build_featurizer
from trak_dist.gradients import HookGradientComputer
from trak_dist.tasks import resolve_task

# (n_embd, n_layer, n_head, vocab, rows, tokens, p)
SIZES = {"gpu": (768, 12, 12, 50257, 16, 512, 4096), "dry": (64, 2, 2, 512, 2, 16, 32)}
# issue 29: the causal-LM default's p (Kronecker + Fisher) and the old default's (dense)
LM_P = {"gpu": (2048, 512), "dry": (32, 16)}
ROUNDS = {"gpu": 3, "dry": 1}  # bf16 on this CPU is slow: a 1M model's step takes seconds


def model(gpu: bool) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    embd, layers, heads, vocab, _, tokens, _ = SIZES["gpu" if gpu else "dry"]
    cfg = GPT2Config(
        vocab_size=vocab,
        n_positions=max(tokens, 1024 if gpu else tokens),
        n_embd=embd,
        n_layer=layers,
        n_head=heads,
        **SPECIAL_TOKENS,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).to(torch.bfloat16).eval()


def with_fisher(
    f: Featurizer, draws: int = 1
) -> Callable[[tuple[torch.Tensor, torch.Tensor]], None]:
    """X and Q, then the Fisher's rows G of each label draw: what a worker runs per
    micro-batch under ``featurize.curvature=fisher`` and ``featurize.fisher_draws=draws``."""

    def both(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        f.featurize(batch, 0)
        for d in range(draws):
            f.fisher(batch, 0, 0, d)

    return both


def main() -> int:
    s = Section()
    mode = "gpu" if s.gpu else "dry"
    _, _, _, vocab, rows, tokens, p = SIZES[mode]
    p_new, p_old = LM_P[mode]
    lm = model(s.gpu)
    d = sum(q.numel() for q in lm.parameters())
    gen = torch.Generator().manual_seed(0)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(2, vocab, (rows, tokens), generator=gen)
        return ids.to(s.device), torch.ones_like(ids).to(s.device)

    hooks = HookGradientComputer(lm, resolve_task("causal_lm"), device=s.device)
    kron = build_featurizer(hooks, "kronecker", p, micro_batch=rows)
    dense = build_featurizer(hooks, "rademacher", p, micro_batch=rows)
    lm_new = build_featurizer(hooks, "kronecker", p_new, micro_batch=rows, curvature="fisher")
    lm_old = build_featurizer(hooks, "rademacher", p_old, micro_batch=rows)
    s.write(
        f"- GPT-2, {d / 1e6:.1f}M parameters, bf16, on {s.device}; batch {rows} × {tokens} "
        f"tokens; p = {p}; dense projector: {type(dense.projector).__name__}"
    )
    # the row's name: (the key of its numbers, what it runs)
    variants: dict[str, tuple[str, Callable]] = {
        "train step": ("step", train_step(hooks.model)),
        "hooks + kronecker": ("kronecker", featurize(kron)),
        "hooks + dense": ("dense", featurize(dense)),
        f"LM default: kronecker p={p_new} + fisher": ("lm_default", with_fisher(lm_new)),
        f"old LM default: dense p={p_old}": ("old_lm_default", featurize(lm_old)),
        # the candidate default of RESULTS.md "Seventh session": 4 label draws
        "LM default + fisher_draws=4": ("lm_draws4", with_fisher(lm_new, 4)),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    memory: dict[str, float] = dict.fromkeys(variants, 0.0)
    for name, (_, fn) in variants.items():
        if s.out_of_time(f"the warm-up of {name} and what follows", 5):
            return s.done()
        fn(batch())
        sync(s.device)
    for _ in range(ROUNDS[mode]):
        for name, (_, fn) in variants.items():
            if s.left() < 5:
                break
            data = batch()
            if s.gpu:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            fn(data)
            sync(s.device)
            times[name].append(time.perf_counter() - t0)
            if s.gpu:
                memory[name] = max(memory[name], torch.cuda.max_memory_allocated() / 2**30)
    base = statistics.median(times["train step"]) if times["train step"] else None
    s.table(["variant", "rounds", "s / batch", "tokens/s", "× train step", "peak GPU GiB"], [])
    for name, ts in times.items():
        if not ts:
            s.row([name, 0, "-", "-", "-", "-"])
            continue
        sec = statistics.median(ts)
        ratio = sec / base if base else None
        s.row(
            [
                name,
                len(ts),
                sec,
                rows * tokens / sec,
                "-" if ratio is None else f"{ratio:.2f}",
                f"{memory[name]:.1f}" if s.gpu else "-",
            ]
        )
        key = variants[name][0]
        s.record(f"{key}_tokens_per_s", rows * tokens / sec)
        if ratio is not None and name != "train step":
            s.record(f"{key}_x_train", ratio)
    new, old = (s.numbers.get(f"{k}_tokens_per_s") for k in ("lm_default", "old_lm_default"))
    if new and old:
        s.write(f"- the LM default's featurisation ÷ the old LM default's: {old / new:.2f}×")
        s.record("lm_default_x_old", old / new)
    draws4 = s.numbers.get("lm_draws4_tokens_per_s")
    if draws4 and old:
        s.write(f"- with fisher_draws=4, ÷ the old LM default's: {old / draws4:.2f}×")
        s.record("lm_draws4_x_old", old / draws4)
    return s.done()


if __name__ == "__main__":
    sys.exit(main())
