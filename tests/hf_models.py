"""Stock Hugging Face models from tiny configs (random weights, no download) and batches, for
every test that needs one (tasks, gradient engines, end-to-end runs).

``attn=None`` is transformers' default attention (sdpa in 5.x), which torch.func.vmap cannot
run; ``"eager"`` lets vmap run GPT-2 (not BERT).
"""

from __future__ import annotations

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
)

VOCAB = 40
PAD = 0


def _attn(attn: str | None) -> dict:
    return {} if attn is None else {"attn_implementation": attn}


def gpt2_config(attn: str | None = None, **kw) -> GPT2Config:
    base = dict(
        vocab_size=VOCAB,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=PAD,
        eos_token_id=PAD,
        pad_token_id=PAD,
    )
    return GPT2Config(**{**base, **kw}, **_attn(attn))


def gpt2_lm(attn: str | None = None, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(gpt2_config(attn)).eval()


def gpt2_classifier(attn: str | None = None, seed: int = 0) -> GPT2ForSequenceClassification:
    torch.manual_seed(seed)
    return GPT2ForSequenceClassification(gpt2_config(attn, num_labels=3)).eval()


def bert_classifier(attn: str | None = None, seed: int = 0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        num_labels=3,
        pad_token_id=PAD,
        **_attn(attn),
    )
    return BertForSequenceClassification(config).eval()


def padded_tokens(n: int, length: int = 10, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[n, length]``: real tokens 1..VOCAB-1 of random lengths
    ≥ min(3, length) (one sample uses the full length), right-padded with PAD."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min(3, length), length + 1, (n,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length) < lengths[:, None]).long()
    ids = torch.randint(1, VOCAB, (n, length), generator=g) * mask
    return ids, mask


def text_batch(n: int = 5, length: int = 8, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """``(input_ids, token_type_ids, attention_mask, label)`` (traker's text layout; ``[::2]``
    is a ``causal_lm`` batch), ``[n, length]`` and labels ``[n]`` in 0..2, from
    :func:`padded_tokens` (right-padded, random lengths)."""
    ids, mask = padded_tokens(n, length, seed)
    g = torch.Generator().manual_seed(seed + 1)
    return ids, torch.zeros_like(ids), mask, torch.randint(0, 3, (n,), generator=g)
