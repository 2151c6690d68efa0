"""``data=text``: file formats, the modes the columns pick, masking, truncation, padding."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from tests.fixtures import llm_models
from trak_dist.config import TextConfig
from trak_dist.errors import DataError
from trak_dist.hf import TextSource
from trak_dist.store import dataset_row_hashes

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A GPT-2 checkpoint directory (untrained) with the tokenizer, label names and a chat
    template."""
    root = tmp_path_factory.mktemp("ckpt")
    tok = llm_models.tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<eos>{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    model = llm_models.make_model("gpt2", len(tok))
    model.config.label2id = {"neg": 0, "pos": 1}
    model.config.id2label = {0: "neg", 1: "pos"}
    model.save_pretrained(root)
    tok.save_pretrained(root)
    return root


def source(ckpt: Path, path: Path, task: str = "causal_lm", **text) -> TextSource:
    return TextSource(str(path), "data.train", TextConfig(**text), [str(ckpt)], None, task)


def test_prompt_completion_masks_the_prompt(ckpt, tmp_path):
    rows = [
        {"prompt": "the color of zorb is", "completion": " red."},
        {"prompt": "a bird", "completion": " sings near the river stone."},
    ]
    ds = source(ckpt, llm_models.write_jsonl(tmp_path / "t.jsonl", rows))()
    tok = ds.tokenizer
    for i, r in enumerate(rows):
        p = tok(r["prompt"])["input_ids"]
        c = tok(r["completion"], add_special_tokens=False)["input_ids"]
        item = ds[i]
        k = len(p) + len(c)
        assert item["input_ids"][:k].tolist() == p + c
        assert item["labels"][:k].tolist() == [-100] * len(p) + c
        assert item["attention_mask"].sum() == k and (item["labels"][k:] == -100).all()
    # padded to the longest row, not to max_length
    assert ds.tensors["attention_mask"].sum(1).max() == ds.tensors["input_ids"].shape[1]


def test_messages_count_only_assistant_turns(ckpt, tmp_path):
    chat = [
        {"role": "user", "content": "color of zorb?"},
        {"role": "assistant", "content": "red"},
        {"role": "user", "content": "and kip?"},
        {"role": "assistant", "content": "blue"},
    ]
    ds = source(ckpt, llm_models.write_jsonl(tmp_path / "c.jsonl", [{"messages": chat}]))()
    item = ds[0]
    counted = item["input_ids"][item["labels"] != -100]
    text = ds.tokenizer.decode(counted.tolist())
    assert "red" in text and "blue" in text
    assert "zorb" not in text and "kip" not in text


def test_classification_maps_label_names(ckpt, tmp_path):
    rows = [{"text": "a bird sings", "label": "pos"}, {"text": "old stone", "label": "neg"}]
    ds = source(ckpt, llm_models.write_jsonl(tmp_path / "l.jsonl", rows), "text_classification")()
    assert ds.tensors["labels"].tolist() == [1, 0]
    ids = [{"text": "a bird sings", "text_pair": "old stone", "label": 1}]
    ds = source(ckpt, llm_models.write_jsonl(tmp_path / "i.jsonl", ids), "text_classification")()
    assert ds.tensors["labels"].tolist() == [1]
    assert ds.decode(0) == "a bird singsold stone"
    bad = [{"text": "a bird", "label": "neutral"}]
    with pytest.raises(DataError, match=r"label 'neutral'.*label2id names \['neg', 'pos'\]"):
        source(ckpt, llm_models.write_jsonl(tmp_path / "b.jsonl", bad), "text_classification")()


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "save_to_disk"])
def test_every_format_gives_the_same_rows_in_file_order(ckpt, tmp_path, fmt):
    import datasets

    texts = llm_models.sentences(12)
    reference = source(
        ckpt, llm_models.write_jsonl(tmp_path / "r.jsonl", [{"text": t} for t in texts])
    )()
    table = datasets.Dataset.from_dict({"text": texts})
    path = tmp_path / f"d.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps([{"text": t} for t in texts]))
    elif fmt == "csv":
        table.to_csv(str(path), index=False)
    elif fmt == "parquet":
        table.to_parquet(str(path))
    elif fmt == "save_to_disk":
        table.save_to_disk(str(path))
    else:
        llm_models.write_jsonl(path, [{"text": t} for t in texts])
    ds = source(ckpt, path)()
    for k in reference.tensors:
        assert torch.equal(ds.tensors[k], reference.tensors[k])
    assert [ds.decode(i) for i in range(len(ds))] == texts


def test_truncation_is_counted_and_the_fingerprint_covers_tokens(ckpt, tmp_path, caplog):
    rows = [{"text": t} for t in llm_models.sentences(12)]
    path = llm_models.write_jsonl(tmp_path / "t.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="trak_dist.hf._text"):
        ds = source(ckpt, path, max_length=5, truncate=True)()
    assert ds.tensors["input_ids"].shape[1] == 5
    long = sum(len(ds.tokenizer(r["text"])["input_ids"]) > 5 for r in rows)
    assert long > 0
    assert f"{long} of 12 rows truncated to max_length=5 tokens" in caplog.text
    # a different tokenisation of the same file is a different dataset
    full = source(ckpt, path)()
    assert (dataset_row_hashes(full) != dataset_row_hashes(ds)).any()


def test_columns_are_renamed_by_role(ckpt, tmp_path):
    rows = [{"question": "the color of zorb is", "answer": " red."}]
    path = llm_models.write_jsonl(tmp_path / "q.jsonl", rows)
    renamed = source(ckpt, path, columns={"prompt": "question", "completion": "answer"})()
    plain = source(
        ckpt,
        llm_models.write_jsonl(
            tmp_path / "p.jsonl", [{"prompt": rows[0]["question"], "completion": rows[0]["answer"]}]
        ),
    )()
    for k in plain.tensors:
        assert torch.equal(renamed.tensors[k], plain.tensors[k])
    with pytest.raises(DataError, match=r"expected 'messages' or 'prompt'\+'completion' or 'text'"):
        source(ckpt, path)()
