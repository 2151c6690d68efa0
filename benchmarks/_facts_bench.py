"""``benchmarks.planted_facts``'s corpus and Llama as a benchmark object for ``lm_pipeline``:
fact retrieval (MRR of the stating document) instead of the LDS, no subset models.

The corpus, tokenizer and three checkpoints are ``planted_facts.corpus`` / ``build`` (seed 0,
60 epochs), cached under ``<out>/facts``; documents and targets are tokenised with the trained
tokenizer, right-padded with its ``<pad>`` (id 0), the targets' prompts labelled -100."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from benchmarks import planted_facts
from benchmarks._lm_benches import IGNORE, Corpus

FACTS, FILLER, EPOCHS, SEED = 40, 160, 60, 0


class FactsBench:
    """What ``lm_pipeline`` and the peers read of a benchmark: ``model()``, ``corpus()``."""

    name = "facts"

    def __init__(self, out: Path) -> None:
        self.root = out / "facts"
        self.docs, self.targets, self.where = planted_facts.corpus(FACTS, FILLER, SEED)

    @cache  # noqa: B019 (one instance per run)
    def checkpoint_dirs(self) -> list[Path]:
        dirs = [self.root / f"c{k}" for k in range(3)]
        if not all((d / "config.json").exists() for d in dirs):
            self.root.mkdir(parents=True, exist_ok=True)
            planted_facts.build(self.root, self.docs, self.targets, EPOCHS, SEED)
        return dirs

    def states(self) -> list[dict[str, Tensor]]:
        from transformers import LlamaForCausalLM

        return [
            LlamaForCausalLM.from_pretrained(str(d)).state_dict() for d in self.checkpoint_dirs()
        ]

    def model(self) -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig.from_pretrained(str(self.checkpoint_dirs()[0]))
        cfg._attn_implementation = "eager"
        return LlamaForCausalLM(cfg)

    @cache  # noqa: B019
    def corpus(self) -> Corpus:
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(str(self.checkpoint_dirs()[0]))
        docs = [tok(d)["input_ids"] for d in self.docs]
        prompts = [tok(t["prompt"])["input_ids"] for t in self.targets]
        comps = [tok(t["completion"])["input_ids"] for t in self.targets]
        width = max(
            max(map(len, docs)), max(len(a) + len(b) for a, b in zip(prompts, comps, strict=True))
        )
        train = torch.zeros(len(docs), width, dtype=torch.int64)
        for i, d in enumerate(docs):
            train[i, : len(d)] = torch.tensor(d)
        tgt = torch.zeros(len(prompts), width, dtype=torch.int64)
        labels = torch.full_like(tgt, IGNORE)
        for i, (a, b) in enumerate(zip(prompts, comps, strict=True)):
            tgt[i, : len(a) + len(b)] = torch.tensor(a + b)
            labels[i, len(a) : len(a) + len(b)] = torch.tensor(b)
        return Corpus(train, tgt, labels)

    def mrr(self, scores: np.ndarray) -> float:
        return planted_facts.metrics(scores, self.where)[1]
