"""RequestParser: bodies against a template item, for tuple and dict (token) items."""

from __future__ import annotations

import pytest
import torch

from trak_dist.serve import BadRequest, RequestParser


def test_tuple_items() -> None:
    parser = RequestParser((torch.zeros(2, 3), torch.tensor(1)), 100, 4, 50)
    q = parser.parse({"targets": [[[[1, 2, 3], [4, 5, 6]], 7]], "k": 3})
    x, y = q.targets[0]
    assert x.dtype == torch.float32 and x.shape == (2, 3) and y.dtype == torch.int64
    assert int(y) == 7 and q.k == 3
    assert parser.parse({"targets": [[[[0] * 3] * 2, 0]]}).k == 10  # default k
    with pytest.raises(BadRequest, match=r"k=51; expected an integer in \[1, 50\]"):
        parser.parse({"targets": [[[[0] * 3] * 2, 0]], "k": 51})
    with pytest.raises(BadRequest, match=r"targets\[0\]\[0\] has shape \[3, 2\]") as e:
        parser.parse({"targets": [[[[0] * 2] * 3, 0]]})
    assert e.value.status == 400
    with pytest.raises(BadRequest, match=r"at most serve\.max_targets=4") as e:
        parser.parse({"targets": [[[[0] * 3] * 2, 0]] * 5})
    assert e.value.status == 413
    with pytest.raises(BadRequest, match="the body is a JSON list"):
        parser.parse([1, 2])
    with pytest.raises(BadRequest, match="expected numbers"):
        parser.parse({"targets": [[[[0] * 3] * 2, True]]})


def test_dict_items_with_token_ids_of_any_length() -> None:
    template = {"input_ids": torch.tensor([1, 2, 3]), "attention_mask": torch.tensor([1, 1, 1])}
    parser = RequestParser(template, 10, 8, 10)
    q = parser.parse({"targets": [{"input_ids": [5, 6], "attention_mask": [1, 1]}], "k": 1})
    assert q.targets[0]["input_ids"].tolist() == [5, 6]  # type: ignore[call-overload]
    with pytest.raises(BadRequest, match="differ in length"):
        parser.parse({"targets": [{"input_ids": [5, 6], "attention_mask": [1]}]})
    with pytest.raises(BadRequest, match=r"has fields \['input_ids'\]; expected"):
        parser.parse({"targets": [{"input_ids": [5]}]})
    with pytest.raises(BadRequest, match="is empty"):
        parser.parse({"targets": [{"input_ids": [], "attention_mask": []}]})
    assert "input_ids: int64 [3]" in parser.describe()
