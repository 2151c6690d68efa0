"""A GPT-2-architecture language model on text that ships with scikit-learn (no download).

scikit-learn's dataset descriptions (~43 kB of English), cut at word boundaries into pieces of
at most ``SEQ_LEN`` characters, right-padded, character vocabulary (0: padding); every 8th
piece is a target. Checkpoints are trained on first use and cached like ``examples/digits.py``.

    trak-dist model=custom data=custom task=causal_lm \\
        model.factory=trak_dist.examples.tiny_lm:make_model \\
        model.checkpoints=trak_dist.examples.tiny_lm:checkpoints \\
        data.train=trak_dist.examples.tiny_lm:train_set \\
        data.targets=trak_dist.examples.tiny_lm:target_set \\
        proj_dim=256 lambda_reg=1e-2"""

from __future__ import annotations

import hashlib
import textwrap
from functools import cache, partial
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from trak_dist.examples._cache import cached_state, example_dir

SEQ_LEN = 64
TARGET_EVERY = 8
PAD = 0


@cache
def _corpus() -> tuple[tuple[str, str], ...]:
    """``(file stem, text with whitespace collapsed)`` for every description, sorted by name."""
    descr = resources.files("sklearn.datasets.descr")
    files = sorted((f for f in descr.iterdir() if f.name.endswith(".rst")), key=lambda f: f.name)
    return tuple((f.name[: -len(".rst")], " ".join(f.read_text("utf-8").split())) for f in files)


@cache
def vocabulary() -> str:
    """The characters of the text in code-point order; character k has id k + 1."""
    return "".join(sorted({c for _, text in _corpus() for c in text}))


def corpus_hash() -> str:
    """Identifies the text (it comes from the installed scikit-learn), for the cache's names."""
    h = hashlib.blake2b(digest_size=6)
    for name, text in _corpus():
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()


def _pieces() -> list[tuple[str, str]]:
    """``(file stem, piece)``: each text wrapped at spaces into pieces of ≤ SEQ_LEN chars."""
    return [
        (name, piece)
        for name, text in _corpus()
        for piece in textwrap.wrap(text, width=SEQ_LEN)
        if len(piece) >= 2
    ]


class Sequences(Dataset):
    """Padded character sequences: dicts ``{input_ids, attention_mask}`` (each ``[SEQ_LEN]``
    int64), or tuples ``(input_ids, attention_mask)`` with ``as_tuples``."""

    def __init__(self, texts: list[str], sources: list[str], as_tuples: bool = False) -> None:
        ids = {c: k + 1 for k, c in enumerate(vocabulary())}
        self.input_ids = torch.full((len(texts), SEQ_LEN), PAD, dtype=torch.int64)
        for i, text in enumerate(texts):
            self.input_ids[i, : len(text)] = torch.tensor([ids[c] for c in text])
        self.attention_mask = (self.input_ids != PAD).to(torch.int64)
        self.texts = texts
        self.sources = sources
        self.as_tuples = as_tuples

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> dict[str, Tensor] | tuple[Tensor, Tensor]:
        if self.as_tuples:
            return self.input_ids[i], self.attention_mask[i]
        return {"input_ids": self.input_ids[i], "attention_mask": self.attention_mask[i]}


def _split(targets: bool, limit: int | None, as_tuples: bool) -> Sequences:
    chosen = [
        (name, p)
        for k, (name, p) in enumerate(_pieces())
        if (k % TARGET_EVERY == TARGET_EVERY - 1) == targets
    ]
    if limit is not None and limit < len(chosen):
        # evenly spaced, so that a small subset still covers every document
        step = len(chosen) / limit
        chosen = [chosen[int(k * step)] for k in range(limit)]
    return Sequences([p for _, p in chosen], [name for name, _ in chosen], as_tuples)


def train_set(limit: int | None = None, as_tuples: bool = False) -> Sequences:
    """The train pieces (587 with scikit-learn 1.x's texts), or ``limit`` of them, evenly
    spaced."""
    return _split(False, limit, as_tuples)


def target_set(limit: int | None = None, as_tuples: bool = False) -> Sequences:
    """Every 8th piece (83), or ``limit`` of them, evenly spaced."""
    return _split(True, limit, as_tuples)


def make_model(
    n_embd: int = 64, n_layer: int = 2, n_head: int = 2, attn_implementation: str | None = None
) -> nn.Module:
    """A ``GPT2LMHeadModel`` from a config (random weights; transformers' default attention
    unless ``attn_implementation`` is given, e.g. ``"eager"``, which also runs under vmap)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(vocabulary()) + 1,
        n_positions=SEQ_LEN,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=PAD,
        eos_token_id=PAD,
        pad_token_id=PAD,
        # a generic PretrainedConfig keyword, not in GPT2Config's typed signature
        attn_implementation=attn_implementation,  # type: ignore[call-arg]
    )
    return GPT2LMHeadModel(config)


def _next_token_loss(model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    """Mean cross-entropy of the real next tokens (padding left out)."""
    z = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]), targets.reshape(-1))


def _train(seed: int, epochs: int, n_embd: int) -> dict[str, Tensor]:
    torch.manual_seed(seed)
    model = make_model(n_embd)
    model.train()
    data = train_set()
    ids, mask = data.input_ids, data.attention_mask
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(ids), generator=gen).split(32):
            opt.zero_grad()
            _next_token_loss(model, ids[idx], mask[idx]).backward()
            opt.step()
    return model.state_dict()


def checkpoints(
    num: int = 3, epochs: int = 4, cache_dir: str | None = None, n_embd: int = 64
) -> list[Path]:
    """Paths of ``num`` trained checkpoints, training (a few seconds each) the ones not cached."""
    root = example_dir("tiny_lm", cache_dir)
    stem = f"gpt2_e{n_embd}_{corpus_hash()}"
    return [
        cached_state(
            root / f"{stem}_seed{seed}_ep{epochs}.pt", partial(_train, seed, epochs, n_embd)
        )
        for seed in range(num)
    ]
