"""Causal-LM benchmarks for issue 29 (``benchmarks.lm_pipeline``): models from configs with random
init, synthetic or packaged text, targets with and without prompts, and one training recipe.

Each benchmark is an ``LMBench``: token ids (0 = padding) of n train documents and m targets,
the targets' labels (-100 where a token is not counted: padding, and the prompt of a prompted
target), a model factory, and ``train(indices, seed, epochs)``. Checkpoints are snapshots of one
run on all documents (seed 0) after each third of its epochs; a subset model is the same recipe
on a subset for all the epochs. A target's output is its mean log-likelihood per counted token.

- ``syn_llama``: ``LlamaForCausalLM`` (hidden 32, 2 layers) on documents from 4 topic-specific
  sparse bigram chains over 47 tokens (32 tokens each); targets are held-out documents.
- ``syn_llama_prompt``: a wider Llama (hidden 64) on more such documents; targets count only
  their last 16 tokens (the first 16 are a prompt).
- ``text_gpt2``: ``GPT2LMHeadModel`` (n_embd 48, 2 layers) on scikit-learn's dataset
  descriptions (``trak_dist.examples.tiny_lm``'s character pieces, ≤ 64 characters).
- ``text_gpt2_prompt``: the same text and model, targets count only their second half.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
from torch import Tensor, nn

IGNORE = -100


@dataclass(frozen=True)
class Corpus:
    """Token ids ``[n, T]`` / ``[m, T]`` (0 = padding) and the targets' labels ``[m, T]``."""

    train: Tensor
    targets: Tensor
    target_labels: Tensor

    def train_labels(self) -> Tensor:
        return self.train.masked_fill(self.train == 0, IGNORE)


@dataclass(frozen=True)
class LMBench:
    name: str
    arch: str  # "llama" or "gpt2"
    width: int
    layers: int
    corpus: Callable[[], Corpus]
    epochs: int
    lr: float = 3e-3
    batch: int = 32

    def vocab(self) -> int:
        c = self.corpus()
        return int(max(c.train.max(), c.targets.max())) + 1

    def model(self) -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

        c = self.corpus()
        v, t = self.vocab(), c.train.shape[1]
        if self.arch == "llama":
            cfg = LlamaConfig(
                vocab_size=v,
                hidden_size=self.width,
                intermediate_size=2 * self.width,
                num_hidden_layers=self.layers,
                num_attention_heads=4,
                num_key_value_heads=4,
                max_position_embeddings=t,
                pad_token_id=0,
                bos_token_id=0,
                eos_token_id=0,
                attn_implementation="eager",
            )
            return LlamaForCausalLM(cfg)
        cfg = GPT2Config(
            vocab_size=v,
            n_positions=t,
            n_embd=self.width,
            n_layer=self.layers,
            n_head=4,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
            attn_implementation="eager",
        )
        return GPT2LMHeadModel(cfg)

    def train(
        self, indices: np.ndarray, seed: int, snapshots: int = 1, moments: list | None = None
    ) -> list[dict[str, Tensor]]:
        """States after each ``1/snapshots`` of the epochs of AdamW on ``indices``; with
        ``moments``, AdamW's second moments (``exp_avg_sq`` by parameter name) at each snapshot
        are appended to it."""
        torch.manual_seed(seed)
        model = self.model().train()
        c = self.corpus()
        rows = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        ids, labels = c.train[rows], c.train_labels()[rows]
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr)
        gen = torch.Generator().manual_seed(seed)
        out = []
        for e in range(self.epochs):
            for idx in torch.randperm(len(ids), generator=gen).split(self.batch):
                opt.zero_grad()
                model(
                    input_ids=ids[idx], attention_mask=(ids[idx] != 0).long(), labels=labels[idx]
                ).loss.backward()
                opt.step()
            if (e + 1) * snapshots % self.epochs == 0:
                out.append({k: v.clone() for k, v in model.state_dict().items()})
                if moments is not None:
                    names = {id(p): n for n, p in model.named_parameters()}
                    moments.append(
                        {names[id(p)]: st["exp_avg_sq"].clone() for p, st in opt.state.items()}
                    )
        return out

    def outputs(self, state: dict[str, Tensor]) -> np.ndarray:
        """``[m]``: each target's mean log-likelihood per counted token."""
        model = self.model().eval()
        model.load_state_dict(state)
        c = self.corpus()
        with torch.no_grad():
            return mean_loglik(model, c.targets, c.target_labels).numpy()


def mean_loglik(model: nn.Module, ids: Tensor, labels: Tensor) -> Tensor:
    """``[B]`` mean log p of the counted next tokens (labels ≠ -100, shifted as HF does)."""
    z = model(input_ids=ids, attention_mask=(ids != 0).long()).logits[:, :-1].float()
    y = labels[:, 1:]
    counted = y != IGNORE
    logp = torch.log_softmax(z, -1).gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (logp * counted).sum(1) / counted.sum(1).clamp(min=1)


@cache
def _chains(topics: int, vocab: int, seed: int) -> np.ndarray:
    """``[topics, vocab, vocab]`` sparse bigram transition matrices (Dirichlet 0.03 rows)."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(vocab, 0.03), size=(topics, vocab))


@cache
def synthetic(n: int, m: int, length: int = 32, prompt: int = 0, seed: int = 0) -> Corpus:
    """n + m documents of ``length`` tokens (ids 1…47), each from one of 4 topic chains."""
    vocab, topics = 47, 4
    chains = _chains(topics, vocab, seed)
    rng = np.random.default_rng(seed + 1)
    docs = np.zeros((n + m, length), dtype=np.int64)
    for i in range(n + m):
        k, tok = rng.integers(topics), rng.integers(vocab)
        for t in range(length):
            docs[i, t] = tok + 1
            tok = rng.choice(vocab, p=chains[k, tok])
    ids = torch.as_tensor(docs)
    labels = ids[n:].clone()
    labels[:, :prompt] = IGNORE
    return Corpus(ids[:n], ids[n:], labels)


@cache
def text(n: int, m: int, prompt_half: bool = False) -> Corpus:
    """scikit-learn's dataset descriptions in character pieces (``tiny_lm``): n train pieces
    and m targets, evenly spaced; ``prompt_half``: a target counts only its second half."""
    from trak_dist.examples import tiny_lm

    train = tiny_lm.train_set(limit=n).input_ids
    targets = tiny_lm.target_set(limit=m).input_ids
    labels = targets.masked_fill(targets == 0, IGNORE)
    if prompt_half:
        lengths = (targets != 0).sum(1)
        pos = torch.arange(targets.shape[1])
        labels = labels.masked_fill(pos[None, :] < (lengths[:, None] // 2), IGNORE)
    return Corpus(train, targets, labels)


BENCHES = {
    b.name: b
    for b in [
        LMBench("syn_llama", "llama", 32, 2, lambda: synthetic(300, 48), epochs=12),
        LMBench(
            "syn_llama_prompt",
            "llama",
            64,
            2,
            lambda: synthetic(400, 48, prompt=16, seed=5),
            epochs=8,
        ),
        LMBench("text_gpt2", "gpt2", 48, 2, lambda: text(300, 48), epochs=9),
        LMBench("text_gpt2_prompt", "gpt2", 48, 2, lambda: text(300, 48, True), epochs=9),
    ]
}
