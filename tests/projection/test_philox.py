import pytest
import torch

from tests.fixtures.helpers import philox_scalar
from trak_dist.projection._philox import philox4x32

# Random123 kat_vectors, philox4x32 with 10 rounds.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("ctr", "key", "expected"), KAT)
def test_known_answers(ctr, key, expected):
    out = philox4x32(*[torch.tensor([c]) for c in ctr], *key)
    assert tuple(int(o) for o in out) == expected
    assert philox_scalar(ctr, key) == expected


def test_tensor_matches_scalar_on_random_counters():
    g = torch.Generator().manual_seed(1)
    ctrs = torch.randint(0, 2**32, (4, 200), generator=g, dtype=torch.int64)
    key = (0x12345678, 0x9ABCDEF0)
    out = torch.stack(philox4x32(*ctrs, *key))
    for k in range(200):
        assert tuple(out[:, k].tolist()) == philox_scalar(tuple(ctrs[:, k].tolist()), key)
