import logging

import numpy as np
import pytest

from tests.fixtures.helpers import spec_of
from trak_dist.errors import IllConditionedError
from trak_dist.scoring import Factorization, gram


def test_kinv_matches_a_direct_inverse_for_every_lambda():
    x = np.random.default_rng(0).standard_normal((200, 30))
    f = Factorization.of(gram(x), 200)
    for lam in (0.0, 1e-3, 1.0):
        k = x.T @ x + lam * np.eye(30)
        np.testing.assert_allclose(f.kinv(lam, "none"), np.linalg.inv(k), rtol=1e-9, atol=1e-12)
        inv = np.linalg.inv(k)
        np.testing.assert_allclose(f.kinv(lam), inv / np.abs(inv).mean(), rtol=1e-9)


def test_singular_gram_is_a_loud_error():
    x = np.random.default_rng(1).standard_normal((20, 50))  # n < p: rank ≤ 20
    f = Factorization.of(gram(x), 20)
    with pytest.raises(IllConditionedError) as e:
        f.kinv(0.0, context="model_id=0")
    msg = str(e.value)
    assert "n=20" in msg and "proj_dim=50" in msg and "lambda_reg" in msg and "model_id=0" in msg
    f.kinv(1e-2)  # regularised: fine


def test_ill_conditioned_gram_warns(caplog):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((100, 10))
    x[:, 9] = x[:, 8] + 1e-6 * rng.standard_normal(100)
    f = Factorization.of(gram(x), 100)
    with caplog.at_level(logging.WARNING, logger="trak_dist"):
        f.kinv(0.0)
    assert "ill-conditioned" in caplog.text


def test_non_finite_lambda_or_gram_is_refused():
    from trak_dist.errors import ConfigError, NonFiniteError

    x = np.random.default_rng(3).standard_normal((50, 8))
    f = Factorization.of(gram(x), 50)
    for bad in (float("nan"), float("inf"), -1e-3):
        with pytest.raises(ConfigError, match=f"lambda_reg={bad}; expected a finite value"):
            f.kinv(bad)
    xtx = gram(x)
    xtx[2, 2] = np.nan
    with pytest.raises(NonFiniteError, match=r"XᵀX \(model_id=4\) or its eigenvalues hold NaN"):
        Factorization.of(xtx, 50, context="model_id=4")


@pytest.mark.parametrize(
    ("curvature", "task", "resolved"),
    [
        ("fisher", "trak_dist.tasks:CausalLM", "per_target"),  # the causal-LM default
        ("xtx", "trak_dist.tasks:CausalLM", "mean_abs"),  # TRAK's XᵀX keeps traker's weights
        ("fisher", "trak_dist.tasks:ImageClassification", "mean_abs"),
    ],
)
def test_kinv_scaling_auto_is_per_target_only_for_a_causal_lms_fisher(curvature, task, resolved):
    """``auto`` as the store's spec says; an explicit value is kept, ``kinv`` refuses an
    unresolved ``auto``, and an unknown value names the choices."""
    from trak_dist.errors import ConfigError
    from trak_dist.scoring import resolve_kinv_scaling

    spec = spec_of(task, curvature, 8, 4)
    assert resolve_kinv_scaling("auto", spec) == resolved
    assert resolve_kinv_scaling("none", spec) == "none"
    with pytest.raises(ConfigError, match="kinv_scaling='mean'; expected one of"):
        resolve_kinv_scaling("mean", spec)
    f = Factorization.of(gram(np.eye(8)), 8)
    with pytest.raises(ConfigError, match="resolve auto"):
        f.kinv(1.0, "auto")
