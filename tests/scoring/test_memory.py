"""docs/design.md, invariant 5: the reducer's memory does not grow with n (fixed blocks)."""

import pytest

from benchmarks.reducer_memory import run


@pytest.mark.slow
def test_scoring_memory_stays_flat_as_n_grows():
    small, large = run([8192, 65536], m=1024, p=64, train_block=1024, target_block=256)
    dense_growth = large[3] - small[3]  # MiB a dense S + X would add: ~240
    assert large[4] - small[4] < 0.2 * dense_growth, (small, large)
