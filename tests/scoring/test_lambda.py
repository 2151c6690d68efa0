"""λ = auto: the rule, never singular, recorded with the scores; bad λ values refused."""

import math

import numpy as np
import pytest
from test_blocks import dense, filled_store

from tests.fixtures.helpers import spec_of
from trak_dist.config import JobConfig
from trak_dist.errors import ConfigError, IllConditionedError
from trak_dist.scoring import (
    AUTO_SCALE,
    Factorization,
    ScoringConfig,
    auto_lambda,
    compute_scores,
    gram,
    parse_lambda,
    rank_bound,
)
from trak_dist.store import variant_name


def rule_from_rows(x: np.ndarray) -> float:
    """The documented rule from X itself: XᵀX's eigenvalues are X's singular values squared,
    at most min(n, p) of them non-zero (an SVD of X, not the eigendecomposition of XᵀX the
    code uses)."""
    sv = np.linalg.svd(x.astype(np.float64), compute_uv=False)
    return AUTO_SCALE * float((sv**2).sum()) / min(x.shape)


@pytest.mark.parametrize(("n", "p"), [(200, 30), (30, 200), (64, 64)])
def test_auto_lambda_is_the_rule_on_the_spectrum(n, p):
    x = np.random.default_rng(n + p).standard_normal((n, p)) * 3.0
    f = Factorization.of(gram(x), n)
    lam = f.resolve_lambda("auto")
    assert lam == pytest.approx(rule_from_rows(x), rel=1e-9)
    assert lam == auto_lambda(f.eigenvalues, n)
    # it moves with the spectrum's scale: λ of 10·X is 100·λ of X
    assert auto_lambda(100 * f.eigenvalues, n) == pytest.approx(100 * lam, rel=1e-12)
    assert f.resolve_lambda(0.25) == 0.25


@pytest.mark.parametrize(
    ("curvature", "task", "bound"),
    [
        ("xtx", "trak_dist.tasks:CausalLM", 300),  # XᵀX: one outer product per train row
        ("fisher", "trak_dist.tasks:CausalLM", 2048),  # a causal LM's Fisher: its tokens ≥ p
        ("fisher", "trak_dist.tasks:ImageClassification", 300),  # one drawn label per row
    ],
)
def test_auto_divides_by_the_outer_products_k_sums(curvature, task, bound):
    spec = spec_of(task, curvature, 2048, 300)
    assert rank_bound(spec) == bound
    # at a prefix p' = 512 of the store: tr / 512 for the causal LM's Fisher, tr / 300 otherwise
    e = np.linspace(0.0, 2.0, 512)
    assert auto_lambda(e, rank_bound(spec)) == pytest.approx(
        AUTO_SCALE * e.sum() / min(bound, 512), rel=1e-12
    )


def test_auto_is_never_singular_where_zero_is():
    x = np.random.default_rng(3).standard_normal((20, 64))  # p ≥ n: rank 20 < 64
    f = Factorization.of(gram(x), 20)
    with pytest.raises(IllConditionedError, match="lambda_reg=auto"):
        f.kinv(0.0)
    lam = f.resolve_lambda("auto")
    cond = f.check_conditioning(lam)
    # e_max ≤ tr(XᵀX) = λ · min(n, p) / AUTO_SCALE, and e_min is 0 up to rounding
    assert cond <= (1 + 20 / AUTO_SCALE) * (1 + 1e-9)
    kinv = f.kinv(lam, "none")
    np.testing.assert_allclose(kinv, np.linalg.inv(x.T @ x + lam * np.eye(64)), rtol=1e-8)
    # a zero XᵀX (e.g. zero gradients) still gets a usable λ
    zero = Factorization.of(np.zeros((8, 8)), 5)
    lam0 = zero.resolve_lambda("auto")
    assert lam0 > 0 and np.isfinite(zero.kinv(lam0)).all()


def test_auto_scores_equal_a_dense_solve_with_the_rule_per_checkpoint(store_path):
    store, data = filled_store(store_path)
    sset = compute_scores(store, ScoringConfig("t", topk=3), [0, 1], None, "auto")
    assert sset.group.basename == "p12_lambdaauto" == variant_name(12, "auto")
    lambdas = [rule_from_rows(x) for x, _, _ in data.values()]
    assert sset.attrs["lambda_reg"] == "auto"
    np.testing.assert_allclose(sset.attrs["lambdas"], lambdas, rtol=1e-9)
    assert lambdas[0] != pytest.approx(lambdas[1], rel=1e-6)  # really one λ per checkpoint
    s, qbar = 0, 0
    for (x, q, xt), lam in zip(data.values(), lambdas, strict=True):
        kinv = np.linalg.inv(x.T @ x + lam * np.eye(x.shape[1]))
        s = s + x @ (kinv / np.abs(kinv).mean()) @ xt.T
        qbar = qbar + q
    ref = s / 2 * (qbar / 2)[:, None]
    np.testing.assert_allclose(sset.scores(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    fixed = compute_scores(store, ScoringConfig("t"), [0, 1], None, 0.5)
    np.testing.assert_allclose(fixed.attrs["lambdas"], [0.5, 0.5])
    assert fixed.group.basename == "p12_lambda0.5"
    ref = dense(data, 12, 0.5)
    np.testing.assert_allclose(fixed.scores(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_a_failed_auto_rescoring_keeps_the_previous_set_and_its_lambdas(store_path, monkeypatch):
    from trak_dist.store import ScoreSet

    store, _ = filled_store(store_path)
    first = compute_scores(store, ScoringConfig("t", topk=3), [0, 1], None, "auto")
    before = first.scores()
    first.group.attrs["lambdas"] = [1.0, 2.0]  # marks the set in place before the rescoring

    def full_disk(self, c0, values):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ScoreSet, "write_topk", full_disk)
    with pytest.raises(OSError, match="No space left"):
        compute_scores(store, ScoringConfig("t", topk=3), [0, 1], None, "auto")
    # the λs of the new set went into its partial group, removed with it
    kept = store.score_set("t", "p12_lambdaauto")
    assert kept is not None and kept.complete
    assert kept.attrs["lambdas"] == [1.0, 2.0] and kept.attrs["lambda_rule"] != "fixed"
    np.testing.assert_array_equal(kept.scores(), before)
    assert sorted(store.root["scores/t"].group_keys()) == ["p12_lambdaauto"]


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), -1.0, "nan", "-0.1", "often", True, None, [0.1]]
)
def test_bad_lambda_values_are_config_errors_naming_the_value(value):
    with pytest.raises(ConfigError, match=r"lambda_reg=") as e:
        parse_lambda(value)
    shown = str(e.value)
    assert "auto" in shown and "≥ 0" in shown
    if isinstance(value, float) and math.isnan(value):
        assert "lambda_reg=nan" in shown
    with pytest.raises(ConfigError, match="lambda_reg="):
        JobConfig(lambda_reg=value)


@pytest.mark.parametrize(
    ("value", "parsed"), [("auto", "auto"), ("AUTO", "auto"), (0, 0.0), ("1e-2", 0.01), (3, 3.0)]
)
def test_good_lambda_values(value, parsed):
    assert parse_lambda(value) == parsed
    assert JobConfig(lambda_reg=value).lambda_reg == parsed
    assert JobConfig().lambda_reg == "auto"
