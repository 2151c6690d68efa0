"""Tiny Hugging Face LLM checkpoints and text files, made locally (no download): a byte-level
BPE tokenizer trained with ``tokenizers`` on generated sentences, a ``LlamaForCausalLM`` or
``GPT2LMHeadModel`` built from a config, trained briefly, saved with ``save_pretrained`` (three
checkpoints, each with the tokenizer), and JSONL train / prompt-completion target files."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import torch

NAMES = ["zorb", "kip", "mava", "tulo", "fenn", "rask", "obi", "sela", "drun", "wex"]
COLORS = ["red", "blue", "green", "gold", "grey"]
FILLER = ["the", "a", "small", "old", "river", "stone", "bird", "sings", "runs", "near"]


def sentences(n: int, seed: int = 0) -> list[str]:
    """Training documents: one fact "the color of NAME is COLOR." per name, then filler."""
    rng = random.Random(seed)
    facts = [f"the color of {name} is {COLORS[k % len(COLORS)]}." for k, name in enumerate(NAMES)]
    filler = [" ".join(rng.choice(FILLER) for _ in range(rng.randint(4, 9))) for _ in range(n)]
    return (facts + filler)[:n]


def targets() -> list[dict[str, str]]:
    return [
        {"prompt": f"the color of {name} is", "completion": f" {COLORS[k % len(COLORS)]}."}
        for k, name in enumerate(NAMES[:6])
    ]


def tokenizer(vocab_size: int = 200):
    """A byte-level BPE tokenizer trained on the documents, as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<eos>"])
    texts = sentences(200) + [t["prompt"] + t["completion"] for t in targets()]
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def make_model(arch: str, vocab_size: int, seed: int = 0, dtype=torch.float32):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=1,
        )
        model = LlamaForCausalLM(config)
    else:
        config = GPT2Config(
            vocab_size=vocab_size,
            n_positions=64,
            n_embd=32,
            n_layer=2,
            n_head=2,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=1,
        )
        model = GPT2LMHeadModel(config)
    return model.to(dtype)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def checkpoints(
    root: Path,
    arch: str = "llama",
    num: int = 3,
    n_train: int = 40,
    dtype=torch.float32,
    docs: list[str] | None = None,
    steps: int = 15,
) -> list[Path]:
    """``num`` checkpoint directories (each a few more steps of training) under ``root``, with
    ``train.jsonl`` and ``targets.jsonl`` beside them."""
    tok = tokenizer()
    docs = docs or sentences(n_train)
    write_jsonl(root / "train.jsonl", [{"text": d} for d in docs])
    write_jsonl(root / "targets.jsonl", targets())
    model = make_model(arch, len(tok))
    enc = tok(docs, padding=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    out = []
    for k in range(num):
        model.train()
        for _ in range(steps):
            opt.zero_grad()
            model(**enc, labels=labels).loss.backward()
            opt.step()
        path = root / f"c{k}"
        model.to(dtype).save_pretrained(path)
        model.float()
        tok.save_pretrained(path)
        out.append(path)
    return out


def adapters(root: Path, base: Path, num: int = 2) -> list[Path]:
    """``num`` LoRA adapter directories (q/v projections, r=4) trained on top of ``base``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(base)
    model = LlamaForCausalLM.from_pretrained(base)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    with warnings.catch_warnings():
        # peft asks transformers 5 a deprecated question (is_gradient_checkpointing)
        warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
        model = get_peft_model(model, config)
    docs = sentences(40)
    enc = tok(docs, padding=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    out = []
    for k in range(num):
        for _ in range(5):
            opt.zero_grad()
            model(**enc, labels=labels).loss.backward()
            opt.step()
        path = root / f"lora{k}"
        model.save_pretrained(path)
        out.append(path)
    return out
