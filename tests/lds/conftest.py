"""Fixtures of the LDS tests."""

import logging

import pytest

from tests.fixtures.pipeline import traker_digits
from trak_dist import TRAKer
from trak_dist.examples import digits


@pytest.fixture(scope="module")
def digits_store(tmp_path_factory, digits_checkpoints):
    """The digits example featurised at p=64 by TRAKer and scored at λ=auto and λ=1."""
    path = tmp_path_factory.mktemp("lds") / "store.zarr"
    train = digits.train_set()
    for lam in ("auto", 1.0):
        t = TRAKer(
            model=digits.make_model(),
            task="image_classification",
            train_set_size=len(train),
            save_dir=path,
            device="cpu",
            proj_dim=64,
            lambda_reg=lam,
            logging_level=logging.ERROR,
        )
        traker_digits(t, digits_checkpoints)
    return path
