"""Fixtures of the LDS tests."""

import logging

import pytest
import torch

from trak_dist import TRAKer
from trak_dist.examples import digits


@pytest.fixture(scope="module")
def digits_store(tmp_path_factory, digits_checkpoints):
    """The digits example featurised at p=64 by TRAKer and scored at λ=auto and λ=1."""
    path = tmp_path_factory.mktemp("lds") / "store.zarr"
    train, targets = digits.train_set(), digits.target_set()
    states = [torch.load(c, weights_only=True) for c in digits_checkpoints]
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
        for i, st in enumerate(states):
            t.load_checkpoint(st, model_id=i)
            t.featurize(train.tensors, num_samples=len(train))
        t.finalize_features()
        for i, st in enumerate(states):
            t.start_scoring_checkpoint("targets", st, model_id=i, num_targets=len(targets))
            t.score(targets.tensors, num_samples=len(targets))
        t.finalize_scores("targets")
    return path
