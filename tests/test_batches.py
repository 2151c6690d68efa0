import pytest
import torch

from trak_dist.batches import batch_size, micro_batches, select, slice_batch
from trak_dist.errors import ConfigError


def test_tuple_and_dict_batches_slice_alike():
    x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    for batch in ((x, y), {"x": x, "y": y}):
        assert batch_size(batch) == 5
        pieces = micro_batches(batch, 2)
        assert [batch_size(p) for p in pieces] == [2, 2, 1]
        last = slice_batch(batch, 4, 5)
        tail = last["y"] if isinstance(last, dict) else last[1]
        assert tail.tolist() == [4]
        picked = select(batch, torch.tensor([True, False, True, False, False]))
        ys = picked["y"] if isinstance(picked, dict) else picked[1]
        assert ys.tolist() == [0, 2]


def test_mismatched_sample_dims_are_a_clear_error():
    with pytest.raises(ConfigError, match="first \\(sample\\) dimension"):
        batch_size((torch.zeros(3, 2), torch.zeros(4)))
    with pytest.raises(ConfigError, match="tensors"):
        batch_size([])
