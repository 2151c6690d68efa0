"""Bergson 2.5.1 on the ``_lm_benches`` checkpoints: its EK-FAC, TrackStar and TRAK pipelines.

Not a dependency of trak_dist: installed for the benchmark only, ``--no-deps`` so that pip keeps
the project's torch (``benchmarks/requirements-peers.txt``). Bergson reads what its users have,
an HF model directory with a tokenizer and a ``datasets`` dataset, so each benchmark is handed
over that way:

- every checkpoint is saved with ``save_pretrained``, next to a ``tokenizers`` WordLevel
  tokenizer over the benchmark's token ids (Bergson loads one; it never encodes with it, because
  the datasets already carry ``input_ids``, which Bergson then does not tokenise);
- the train documents and the targets are saved with ``save_to_disk``, padding stripped, with
  ``labels`` = -100 where a token is not counted (a target's prompt).

Each pipeline runs as its own command line (``python -m bergson <method> …``) in a subprocess,
once per checkpoint, with Bergson's defaults except where a flag is listed in ``METHODS``; its
score file ([n train rows] × [m queries]) is read back. Bergson's scores are higher-is-better
(positive: the train document lowers the query's loss), the sign of trak_dist's scores.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks._facts_bench import FactsBench
from benchmarks._lm_benches import LMBench

# The flags each pipeline needs beyond Bergson's defaults, and why:
# - ekfac: ``--method`` is required; ``ev_correction`` makes KFAC EK-FAC.
# - trak: Bergson's TRAK refuses other settings (log-odds features, one global projection);
#   its damping defaults to 0, which inverts a singular Gram here (p > n: NaN scores), so
#   0.1 × the mean eigenvalue, Bergson's own default for every other inversion. p = 512, the
#   trak_dist default's p: at p = 2048 its CPU projection took 11 minutes a checkpoint.
# - every query is scored on its own (``aggregation none``), as trak_dist and kronfluence do.
TRAK_P = 512
METHODS = {
    "ekfac": ["ekfac", "--method", "kfac", "--hessian_cfg.ev_correction"],
    "trackstar": ["trackstar"],
    "trak": [
        "trak",
        "--loss_fn",
        "log_odds",
        "--projection_target",
        "global",
        "--projection_dim",
        str(TRAK_P),
        "--damping_factor",
        "0.1",
    ],
}
# What each pipeline keeps of a gradient (its "p"): EK-FAC full gradients, TrackStar its
# default 16 × 16 projection per module, TRAK one TRAK_P-column projection.
SKETCH = {"ekfac": "full", "trackstar": "16² / module", "trak": str(TRAK_P)}


def _tokenizer(vocab: int, length: int):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0")
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(words),
        pad_token="t0",
        unk_token="t0",
        eos_token="t0",
        model_max_length=length,
    )


def _dataset(ids: torch.Tensor, labels: torch.Tensor, path: Path) -> None:
    from datasets import Dataset

    keep = [int((row != 0).nonzero().max()) + 1 for row in ids]  # right padding stripped
    Dataset.from_dict(
        {
            "input_ids": [r[:k] for r, k in zip(ids.tolist(), keep, strict=True)],
            "labels": [r[:k] for r, k in zip(labels.tolist(), keep, strict=True)],
        }
    ).save_to_disk(str(path))


def inputs(bench: LMBench | FactsBench, states: list, root: Path) -> Path:
    """``root/bergson``: the checkpoints as model directories, the train set and the targets
    as datasets on disk (made once)."""
    out = root / "bergson"
    done = out / "inputs.done"
    if done.exists():
        return out
    c = bench.corpus()
    for i, st in enumerate(states):
        model = bench.model()
        model.load_state_dict(st)
        model.save_pretrained(out / f"model_c{i}")
        _tokenizer(model.config.vocab_size, c.train.shape[1]).save_pretrained(out / f"model_c{i}")
    _dataset(c.train, c.train_labels(), out / "train")
    _dataset(c.targets, c.target_labels, out / "query")
    done.write_text("")
    return out


def _read_scores(run: Path) -> np.ndarray:
    info = json.loads((run / "scores" / "info.json").read_text())
    rows = np.memmap(run / "scores" / "scores.bin", dtype=info["dtype"], mode="r")
    return np.stack([rows[f"score_{q}"] for q in range(info["num_scores"])], 1).astype(np.float64)


def _run(method: str, inp: Path, ckpt: int, run: Path, length: int) -> float:
    """One pipeline on one checkpoint; its wall seconds. Its log goes to ``<run>.log``."""
    # The run path comes right after the command: after a bare boolean flag it would be
    # read as the flag's value.
    command, *flags = METHODS[method]
    cmd = [sys.executable, "-m", "bergson", command, str(run.resolve()), *flags]
    cmd += ["--model", str(inp / f"model_c{ckpt}"), "--overwrite"]
    cmd += ["--data.dataset", str(inp / "train"), "--query.dataset", str(inp / "query")]
    # One token batch holds at most the model's context (Bergson checks it).
    cmd += ["--query.aggregation", "none", "--token_batch_size", str(length)]
    log = run.with_suffix(".log")
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = log.read_text()[-2000:]
        raise RuntimeError(f"bergson {method} failed (rc {rc}); the end of {log}:\n{tail}")
    return time.perf_counter() - t0


def scores(
    bench: LMBench | FactsBench, states: list, root: Path, method: str
) -> tuple[list[np.ndarray], float]:
    """Bergson ``method``'s ``[n, m]`` scores per checkpoint (cached under ``root``) and the
    mean wall seconds of one checkpoint's pipeline (model load, curvature, queries, scoring)."""
    inp = inputs(bench, states, root)
    length = bench.corpus().train.shape[1]
    mats, secs = [], []
    for i in range(len(states)):
        path, info = root / f"bg_{method}_c{i}.npy", root / f"bg_{method}_c{i}.json"
        if not path.exists():
            run = inp / f"{method}_c{i}"
            # A run takes seconds (EK-FAC) to minutes (TRAK on the CPU): say which one is on.
            print(
                f"bergson {method}, checkpoint {i + 1}/{len(states)} (log: {run}.log)", flush=True
            )
            s = _run(method, inp, i, run, length)
            np.save(path, _read_scores(run))
            info.write_text(json.dumps({"seconds": s}))
        mats.append(np.load(path))
        secs.append(json.loads(info.read_text())["seconds"])
    return mats, float(np.mean(secs))
