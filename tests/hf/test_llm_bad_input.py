"""Bad input to ``model=hf data=text``: one clear line (exit 2) and no store written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_llm_cli import SMALL, run_cli

from tests.fixtures import llm_models

BASE = [
    "task=causal_lm",
    "model=hf",
    "data=text",
    "data.train=train.jsonl",
    "data.targets=targets.jsonl",
    *SMALL,
]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("made")
    llama = llm_models.checkpoints(root, "llama", num=1)
    (root / "c0").rename(root / "llama")
    llm_models.checkpoints(root, "gpt2", num=1)
    (root / "c0").rename(root / "gpt2")
    adapter = llm_models.adapters(root, llama[0].parent / "llama", num=1)[0]
    # the adapter's own record must name the renamed base
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(root / "llama")
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    tok = llm_models.tokenizer()
    tok.add_tokens([f"extra{i}" for i in range(400)])
    tok.save_pretrained(root / "big_tokenizer")
    return root


def case(made: Path, tmp: Path, name: str) -> list[str]:
    """Copy the good files into ``tmp``, break one thing, return the extra overrides."""
    for f in ("train.jsonl", "targets.jsonl"):
        shutil.copy(made / f, tmp / f)
    train = (tmp / "train.jsonl").read_text().splitlines()
    ckpts = f"model.checkpoints=[{made / 'llama'}]"
    if name == "missing column":
        (tmp / "targets.jsonl").write_text(json.dumps({"question": "x", "answer": "y"}) + "\n")
    elif name == "empty text":
        train[3] = json.dumps({"text": "  "})
        (tmp / "train.jsonl").write_text("\n".join(train) + "\n")
    elif name == "over-long text":
        return [ckpts, "data.text.max_length=8"]
    elif name == "malformed line":
        train[4] = '{"text": "the river'
        (tmp / "train.jsonl").write_text("\n".join(train) + "\n")
    elif name == "foreign tokenizer":
        return [ckpts, f"data.text.tokenizer={made / 'big_tokenizer'}"]
    elif name == "other architecture":
        return [f"model.checkpoints=[{made / 'llama'},{made / 'gpt2'}]"]
    elif name == "adapter base":
        return [f"model.checkpoints=[{made / 'lora0'}]", f"model.base={made / 'gpt2'}"]
    return [ckpts]


CASES = {
    "missing column": "data.targets: no column for task causal_lm: expected 'messages' or "
    "'prompt'+'completion' or 'text'; the file has columns ['answer', 'question']",
    "empty text": "data.train: row 3 has an empty or missing 'text'",
    "over-long text": "row(s) are longer than max_length=8 tokens",
    "malformed line": "line 5 is not valid JSON",
    "foreign tokenizer": "tokens but the model's vocabulary is",
    "other architecture": "is not the same architecture as the first",
    "adapter base": "does not fit the base model",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_writes_nothing(made, tmp_path, name):
    out = run_cli([*BASE, *case(made, tmp_path, name), "hydra.run.dir=run"], tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, out.stderr[-3000:]
    assert errors[0].startswith("trak-dist: error: "), errors[0]
    assert CASES[name] in errors[0], errors[0]
    assert not (tmp_path / "trak_store.zarr").exists()
