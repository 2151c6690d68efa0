"""GPT-2-architecture language models from configs (random init, no download), text that ships
with Python, and their training loss, for the benchmarks (which attribute them with the
``causal_lm`` task, as users do)."""

from __future__ import annotations

import importlib
import inspect

import torch
from torch import Tensor, nn

# (n_embd, n_layer, n_head, vocab): about 1M, 6M, 25M and 100M parameters at 128 positions
SIZES = {
    "1M": (128, 4, 4, 2048),
    "6M": (256, 6, 8, 4096),
    "25M": (512, 6, 8, 12288),
    "100M": (768, 12, 12, 16384),
}
TOKENS = dict(bos_token_id=1, eos_token_id=1, pad_token_id=0)


def gpt2(size: str, positions: int = 128, seed: int = 0, attn: str = "eager") -> nn.Module:
    """A ``GPT2LMHeadModel`` (tied lm_head = wte) of about ``size`` parameters.

    ``eager`` attention by default so that torch.func's vmap can run it too (transformers' sdpa
    path branches on tensor values, which vmap cannot trace); every variant uses the same model.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    embd, layers, heads, vocab = SIZES[size]
    cfg = GPT2Config(
        vocab_size=vocab,
        n_positions=positions,
        n_embd=embd,
        n_layer=layers,
        n_head=heads,
        attn_implementation=attn,
        **TOKENS,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(cfg).eval()


def tiny_gpt2(positions: int = 64, seed: int = 0) -> nn.Module:
    """A byte-level GPT-2 (vocab 256, 64 wide, 2 layers: ~120k parameters) for quality runs."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=256, n_positions=positions, n_embd=64, n_layer=2, n_head=4, **TOKENS
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(cfg).eval()


def stdlib_text(modules: tuple[str, ...] = ("argparse", "inspect", "textwrap", "pathlib")) -> bytes:
    """Source code of a few standard-library modules: text that ships with Python."""
    return b"\n".join(inspect.getsource(importlib.import_module(m)).encode() for m in modules)


def byte_sequences(n: int, length: int, offset: int = 0) -> Tensor:
    """``[n, length]`` int64 windows of the stdlib text, consecutive from window ``offset``."""
    data = torch.frombuffer(bytearray(stdlib_text()), dtype=torch.uint8).long()
    count = data.numel() // length
    if offset + n > count:
        raise ValueError(f"only {count} windows of {length} bytes; asked for {offset + n}")
    return data[: count * length].reshape(count, length)[offset : offset + n]


def lm_loss(model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    """The training loss: mean next-token cross-entropy."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
