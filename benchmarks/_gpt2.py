"""GPT-2-architecture language models from configs (random init, no download), text that ships
with Python, and a next-token output for the benchmarks.

The ``causal_lm`` task is another stream's; until it is on main these benchmarks use
:class:`NextTokenMargins`, TRAK's sequence output written out here.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
from torch import Tensor, nn

from trak_dist.tasks import ModelOutput, margin

# (n_embd, n_layer, n_head, vocab): about 1M, 25M and 100M parameters at 128 positions
SIZES = {
    "1M": (128, 4, 4, 2048),
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


class NextTokenMargins(ModelOutput):
    """f = Σ_t log p(y_t)/(1 − p(y_t)) over next-token positions with a mask (TRAK's output for
    a sequence: the sum of per-token margins); Q = mean_t (1 − p(y_t)). A sample is
    ``(input_ids, attention_mask)``."""

    @staticmethod
    def _margins(logits: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
        b, t, v = logits.shape
        per = margin(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1)).reshape(b, t - 1)
        return (per * mask[:, 1:].to(per.dtype)).sum(1)

    def get_output(self, model: Any, weights: Any, buffers: Any, *sample: Tensor) -> Tensor:
        ids, mask = sample
        kwargs = {"input_ids": ids[None], "attention_mask": mask[None]}
        out = torch.func.functional_call(model, (weights, buffers), args=(), kwargs=kwargs)
        return self._margins(out.logits, ids[None], mask[None]).sum()

    def get_outputs(self, model: nn.Module, batch: Any) -> Tensor:
        ids, mask = batch
        return self._margins(model(input_ids=ids, attention_mask=mask).logits, ids, mask)

    def get_out_to_loss_grad(self, model: Any, weights: Any, buffers: Any, batch: Any) -> Tensor:
        ids, mask = batch
        kwargs = {"input_ids": ids, "attention_mask": mask}
        logits = torch.func.functional_call(model, (weights, buffers), args=(), kwargs=kwargs)
        logits = logits.logits[:, :-1]
        p = torch.softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
        m = mask[:, 1:].to(p.dtype)
        return ((1 - p) * m).sum(1) / m.sum(1).clamp_min(1)


def lm_loss(model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    """The training loss: mean next-token cross-entropy."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
