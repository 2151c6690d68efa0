"""Planted facts: is the training document that states a fact the top proponent of the target
that asks it? A small Llama-architecture model, attributed from the command-line inputs
(``model=hf``, ``data=text``) through ``trak_dist.run`` with default settings.

    python -m benchmarks.planted_facts [--facts 40] [--filler 160] [--epochs 60] [--seed 0]
                                       [--proj-dim 512]

Each fact "the password of NAME is WORD." (NAME and WORD made-up, used once) is stated once, at
the start of a document that goes on with filler; the other documents are filler. Targets are
prompt/completion rows ("the password of NAME is" / " WORD."). A tokenizer is trained locally
(byte-level BPE), the model is trained on every document, and three checkpoints (after each
third of training)
are attributed with dense (Rademacher) and Kronecker projections. Reported: top-1 accuracy (the
stating document is the top proponent), MRR and recall@10 of the stating document, with a TF-IDF
ranking (cosine of the target's text to each document) as context.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks._table import table

SYLLABLES = ["ka", "lo", "mi", "ru", "te", "zo", "pa", "ne", "vi", "su", "do", "ga", "fi", "xu"]
WORDS = [
    "the",
    "a",
    "small",
    "old",
    "river",
    "stone",
    "bird",
    "sings",
    "runs",
    "near",
    "over",
    "under",
    "green",
    "quiet",
    "field",
]


def corpus(facts: int, filler: int, seed: int = 0) -> tuple[list[str], list[dict], list[int]]:
    """Documents, targets and the index of each target's stating document."""
    rng = random.Random(seed)
    made: set[str] = set()

    def word() -> str:
        while True:
            w = "".join(rng.choice(SYLLABLES) for _ in range(3))
            if w not in made:
                made.add(w)
                return w

    def fill() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 8)))

    docs = [fill() for _ in range(facts + filler)]
    where = rng.sample(range(len(docs)), facts)
    targets = []
    for i in where:
        name, secret = word(), word()
        # the fact opens its document, so the target asks it at the positions it was learnt at
        docs[i] = f"the password of {name} is {secret}. {fill()}"
        targets.append({"prompt": f"the password of {name} is", "completion": f" {secret}."})
    return docs, targets, where


def build(
    root: Path, docs: list[str], targets: list[dict], epochs: int, seed: int = 0
) -> list[str]:
    """Tokenizer, model and three checkpoint directories under ``root``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    texts = docs + [t["prompt"] + t["completion"] for t in targets]
    raw.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=["<pad>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<pad>")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = LlamaForCausalLM(config)
    enc = tok(docs, padding=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for k in range(3):
        model.train()
        for _ in range(epochs // 3):
            for idx in torch.randperm(len(docs), generator=gen).split(32):
                opt.zero_grad()
                batch = {key: v[idx] for key, v in enc.items()}
                model(**batch, labels=labels[idx]).loss.backward()
                opt.step()
        path = root / f"c{k}"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        out.append(str(path))
    model.eval()
    with torch.no_grad():
        losses = []
        for t in targets:
            p = tok(t["prompt"])["input_ids"]
            c = tok(t["completion"])["input_ids"]
            ids = torch.tensor([p + c])
            lab = torch.tensor([[-100] * len(p) + c])
            losses.append(float(model(input_ids=ids, labels=lab).loss))
    print(
        f"completion loss of the targets at the last checkpoint: {np.mean(losses):.3f} nats/token"
    )
    (root / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (root / "targets.jsonl").write_text("".join(json.dumps(t) + "\n" for t in targets))
    return out


def metrics(scores: np.ndarray, where: list[int]) -> tuple[float, float, float]:
    """Top-1, MRR and recall@10 of the stating documents; ``scores`` is [n_train, m]."""
    ranks = np.array([int((scores[:, t] > scores[i, t]).sum()) for t, i in enumerate(where)])
    return float((ranks == 0).mean()), float((1 / (ranks + 1)).mean()), float((ranks < 10).mean())


def tfidf(docs: list[str], targets: list[dict]) -> np.ndarray:
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer().fit(docs)
    queries = [t["prompt"] + t["completion"] for t in targets]
    return (vec.transform(docs) @ vec.transform(queries).T).toarray()


def main() -> None:
    import trak_dist
    from trak_dist.config import ProjectionConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--facts", type=int, default=40)
    ap.add_argument("--filler", type=int, default=160)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0, help="of the corpus, the model and training")
    ap.add_argument("--proj-dim", type=int, default=512)
    args = ap.parse_args()
    docs, targets, where = corpus(args.facts, args.filler, args.seed)
    rows = [["TF-IDF", *metrics(tfidf(docs, targets), where), 0.0]]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpts = build(root, docs, targets, args.epochs, args.seed)
        for kind in ("rademacher", "kronecker"):
            t0 = time.perf_counter()
            result = trak_dist.run(
                model="hf",
                checkpoints=ckpts,
                train=str(root / "train.jsonl"),
                targets=str(root / "targets.jsonl"),
                task="causal_lm",
                store=str(root / f"{kind}.zarr"),
                proj_dim=args.proj_dim,
                projection=ProjectionConfig(kind=kind),
                progress=False,
                report=None,
            )
            rows.append(
                [f"TRAK {kind}", *metrics(result.scores(), where), time.perf_counter() - t0]
            )
    print(
        f"{args.facts} facts, {args.facts + args.filler} documents, {args.epochs} epochs, "
        f"seed {args.seed}, 3 checkpoints, proj_dim {args.proj_dim}, lambda auto"
    )
    print(table(["ranking", "top-1", "MRR", "recall@10", "seconds"], rows))


if __name__ == "__main__":
    main()
