"""A BERT sequence classifier on generated token data (no download).

One keyword token (1-3; label = keyword − 1) among random filler, 6 to ``SEQ_LEN`` tokens,
right-padded with 0, second half segment 1; checkpoints cached like ``examples/digits.py``.

    trak-dist model=custom data=custom task=text_classification \\
        model.factory=trak_dist.examples.tiny_bert:make_model \\
        model.checkpoints=trak_dist.examples.tiny_bert:checkpoints \\
        data.train=trak_dist.examples.tiny_bert:train_set \\
        data.targets=trak_dist.examples.tiny_bert:target_set"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from trak_dist.examples._cache import cached_state, example_dir

VOCAB = 32
SEQ_LEN = 16
CLASSES = 3
N_TRAIN = 256
N_TARGETS = 64
EPOCHS = 10
FILLER = 4  # tokens FILLER..VOCAB-1 are filler; 1..CLASSES are the keywords


def _generate(n: int, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(input_ids, token_type_ids, attention_mask, labels)``: ``[n, SEQ_LEN]`` × 3, ``[n]``."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, SEQ_LEN + 1, (n,), generator=g)
    ids = torch.randint(FILLER, VOCAB, (n, SEQ_LEN), generator=g)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    where = (torch.rand(n, generator=g) * lengths).long()
    ids[torch.arange(n), where] = labels + 1
    pos = torch.arange(SEQ_LEN)
    mask = (pos < lengths[:, None]).to(torch.int64)
    types = ((pos >= (lengths[:, None] + 1) // 2) & mask.bool()).to(torch.int64)
    return ids * mask, types, mask, labels


class KeywordSequences(Dataset):
    """Tuples ``(input_ids, token_type_ids, attention_mask, label)`` (traker's layout), or dicts
    ``{input_ids, token_type_ids, attention_mask, labels}`` with ``as_dicts``."""

    def __init__(self, n: int, seed: int, as_dicts: bool = False) -> None:
        self.tensors = _generate(n, seed)
        self.as_dicts = as_dicts

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, i: int) -> tuple[Tensor, ...] | dict[str, Tensor]:
        ids, types, mask, label = (t[i] for t in self.tensors)
        if self.as_dicts:
            return {
                "input_ids": ids,
                "token_type_ids": types,
                "attention_mask": mask,
                "labels": label,
            }
        return ids, types, mask, label


def train_set(n: int = N_TRAIN, as_dicts: bool = False) -> KeywordSequences:
    return KeywordSequences(n, seed=0, as_dicts=as_dicts)


def target_set(n: int = N_TARGETS, as_dicts: bool = False) -> KeywordSequences:
    return KeywordSequences(n, seed=1, as_dicts=as_dicts)


def make_model(
    hidden: int = 32, layers: int = 2, attn_implementation: str | None = None
) -> torch.nn.Module:
    """A ``BertForSequenceClassification`` from a config (random weights; transformers' default
    attention unless ``attn_implementation`` is given)."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=SEQ_LEN,
        type_vocab_size=2,
        # not in BertConfig's typed signature: generic PretrainedConfig keywords
        num_labels=CLASSES,  # type: ignore[call-arg]
        pad_token_id=0,
        attn_implementation=attn_implementation,
    )
    return BertForSequenceClassification(config)


def train_subset(
    indices: Sequence[int] | np.ndarray, seed: int, hidden: int = 32, epochs: int = EPOCHS
) -> dict[str, Tensor]:
    """The training recipe: a model trained on train examples ``indices`` from ``seed``
    (AdamW, lr 3e-3, batches of 32, ``epochs`` passes); ``trak_dist.evaluate``'s recipe."""
    torch.manual_seed(seed)
    model = make_model(hidden)
    rows = torch.as_tensor(np.asarray(indices, dtype=np.int64))
    return fit(model, tuple(t[rows] for t in train_set().tensors), seed, epochs)


def fit(
    model: torch.nn.Module, tensors: tuple[Tensor, ...], seed: int, epochs: int = EPOCHS
) -> dict[str, Tensor]:
    """Train ``model`` on ``(input_ids, token_type_ids, attention_mask, labels)`` ``[N, L]``
    (AdamW, lr 3e-3, batches of 32 in an order drawn from ``seed``); its state dict."""
    model.train()
    ids, types, mask, labels = tensors
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(ids), generator=gen).split(32):
            opt.zero_grad()
            out = model(
                input_ids=ids[idx],
                token_type_ids=types[idx],
                attention_mask=mask[idx],
                labels=labels[idx],
            )
            out.loss.backward()
            opt.step()
    return model.state_dict()


def checkpoints(
    num: int = 2, epochs: int = EPOCHS, cache_dir: str | None = None, hidden: int = 32
) -> list[Path]:
    """Paths of ``num`` trained checkpoints, training the ones not cached yet."""
    root = example_dir("tiny_bert", cache_dir)
    return [
        cached_state(
            root / f"bert{hidden}_seed{seed}_ep{epochs}.pt",
            partial(train_subset, np.arange(N_TRAIN), seed, hidden, epochs),
        )
        for seed in range(num)
    ]


def accuracy(path: Path, hidden: int = 32) -> float:
    """Target-set accuracy of a checkpoint."""
    model = make_model(hidden).eval()
    model.load_state_dict(torch.load(path, weights_only=True))
    ids, types, mask, labels = target_set().tensors
    with torch.no_grad():
        out = model(input_ids=ids, token_type_ids=types, attention_mask=mask)
    return float((out.logits.argmax(-1) == labels).float().mean())
