"""Length grouping (``trak_dist._padding``): the featuriser orders a right-padded token batch by
length and cuts each micro-batch to its longest row; its rows must equal each row featurised
alone, unpadded, in the batch's order."""

import pytest
import torch

from tests.fixtures.hf_models import bert_classifier, gpt2_lm, padded_tokens
from trak_dist._padding import length_order, trim
from trak_dist.errors import LabelError
from trak_dist.featurize import build_featurizer
from trak_dist.gradients import make_computer
from trak_dist.tasks import resolve_task


def test_order_is_longest_first_and_only_for_right_padding():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]])
    ids = torch.arange(16).reshape(4, 4) * mask
    assert length_order({"input_ids": ids, "attention_mask": mask}).tolist() == [1, 0, 3, 2]
    left = mask.flip(1)
    assert length_order({"input_ids": ids, "attention_mask": left}) is None
    assert length_order((ids, mask)) is None  # tuples: their columns have no names
    assert length_order({"input_ids": ids}) is None
    cut = trim({"input_ids": ids[[0, 2]], "attention_mask": mask[[0, 2]], "labels": torch.ones(2)})
    assert cut["input_ids"].shape == (2, 2) and cut["attention_mask"].shape == (2, 2)
    assert cut["labels"].shape == (2,)  # class labels [B] are not columns
    one = trim({"input_ids": ids[[2]], "attention_mask": mask[[2]]})
    assert one["input_ids"].shape == (1, 2)  # a causal LM needs two columns


def alone(featurizer, batch, i):
    """Row i featurised by itself, cut to its real tokens (no padding at all)."""
    n = int(batch["attention_mask"][i].sum())
    row = {k: v[i : i + 1, :n] if v.dim() == 2 else v[i : i + 1] for k, v in batch.items()}
    return featurizer.featurize(row, 0)


@pytest.mark.parametrize(
    ("model", "task", "engine"),
    [
        (lambda: gpt2_lm(attn="eager").double(), "causal_lm", "vmap"),
        (lambda: gpt2_lm().double(), "causal_lm", "hooks"),
        (lambda: bert_classifier().double(), "text_classification", "hooks"),
    ],
    ids=["gpt2-vmap", "gpt2-hooks", "bert-hooks"],
)
def test_grouped_rows_equal_each_row_alone(model, task, engine):
    ids, mask = padded_tokens(7, length=10, seed=3)
    # dataset-wide padding wider than any row of this batch, as data=text pads
    pad = torch.zeros(7, 4, dtype=ids.dtype)
    batch = {"input_ids": torch.cat([ids, pad], 1), "attention_mask": torch.cat([mask, pad], 1)}
    if task == "text_classification":
        batch["labels"] = torch.arange(7) % 3
    computer = make_computer(model(), resolve_task(task), None, "cpu", engine)
    featurizer = build_featurizer(computer, "rademacher", 32, micro_batch=3)
    widths = [int(mb["input_ids"].shape[1]) for _, mb in featurizer._pieces(batch)]
    lengths = sorted(mask.sum(1).tolist(), reverse=True)
    assert widths == [lengths[0], lengths[3], lengths[6]]  # each piece cut to its longest row
    x, q = featurizer.featurize(batch, 0)
    want = [alone(featurizer, batch, i) for i in range(7)]
    torch.testing.assert_close(x, torch.cat([w[0] for w in want]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(q, torch.cat([w[1] for w in want]), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(featurizer.project(batch, 0), x, rtol=0, atol=0)


def test_a_bad_label_is_named_at_its_batch_position():
    ids, mask = padded_tokens(5, length=8, seed=1)
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 7, 2, 0])}
    computer = make_computer(bert_classifier(), resolve_task("text_classification"), None)
    featurizer = build_featurizer(computer, "rademacher", 16, micro_batch=2)
    with pytest.raises(LabelError) as caught:
        featurizer.featurize(batch, 0)
    assert caught.value.positions == [2]
