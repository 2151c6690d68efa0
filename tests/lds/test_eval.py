"""trak_dist.evaluate's parts: subset training, the LDS of stored scores, resuming on Ray."""

import dataclasses
import logging

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from trak_dist.config import ClusterConfig, EvalConfig, JobConfig, StoreConfig
from trak_dist.errors import ConfigError, StoreDamagedError
from trak_dist.examples import digits
from trak_dist.lds import store_lds
from trak_dist.lds._retrain import SubsetTrainer
from trak_dist.store import FeatureStore
from trak_dist.store.verify import repair, verify

QUICK = {"epochs": 2}  # recipe_kwargs: subset models in a fraction of a second


def numpy_margins(state: dict, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """log p/(1−p) of the label for the digits MLP, in float64 numpy (no torch, no vmap)."""
    w1, b1, w2, b2 = (
        state[k].double().numpy() for k in ("0.weight", "0.bias", "2.weight", "2.bias")
    )
    logits = np.tanh(x @ w1.T + b1) @ w2.T + b2
    rows = np.arange(len(y))
    correct = logits[rows, y]
    others = logits.copy()
    others[rows, y] = -np.inf
    top = others.max(1, keepdims=True)
    return correct - (top[:, 0] + np.log(np.exp(others - top).sum(1)))


def job(store, **ev) -> JobConfig:
    return JobConfig(
        store=StoreConfig(path=str(store)),
        eval=EvalConfig(**{"num_models": 6, "recipe_kwargs": QUICK, "bootstrap": 50, **ev}),
        cluster=ClusterConfig(num_workers=2),
        progress=False,
    )


def test_subset_margins_are_the_recipes_model_outputs(tmp_path):
    trainer = SubsetTrainer(job(tmp_path / "s.zarr"))
    idx = np.arange(0, 1500, 3)
    got = trainer.margins(idx, seed=11)
    state = digits.train_subset(idx, 11, **QUICK)  # deterministic: the same model again
    x, y = digits.target_set().tensors
    np.testing.assert_allclose(got, numpy_margins(state, x.double().numpy(), y.numpy()), atol=1e-4)


def test_subset_margins_of_a_hugging_face_encoder(tmp_path):
    """BERT's attention-mask code cannot run under vmap: the task's batched get_outputs is used,
    and gives the margins of the recipe's model computed from its logits."""
    from trak_dist.config import ModelConfig, TaskConfig
    from trak_dist.examples import tiny_bert

    base = job(tmp_path / "s.zarr", recipe=tiny_bert.train_subset, recipe_kwargs={"epochs": 1})
    cfg = dataclasses.replace(
        base,
        model=ModelConfig(factory=tiny_bert.make_model, checkpoints=[]),
        task=TaskConfig(name="text_classification"),
        data=dataclasses.replace(base.data, targets=tiny_bert.target_set),
    )
    idx = np.arange(0, tiny_bert.N_TRAIN, 2)
    got = SubsetTrainer(cfg).margins(idx, seed=5)
    model = tiny_bert.make_model().eval()
    model.load_state_dict(tiny_bert.train_subset(idx, 5, epochs=1))
    ids, types, mask, labels = tiny_bert.target_set().tensors
    with torch.no_grad():
        logits = model(input_ids=ids, token_type_ids=types, attention_mask=mask).logits.double()
    rows = torch.arange(len(labels))
    others = logits.clone()
    others[rows, labels] = -torch.inf
    want = logits[rows, labels] - torch.logsumexp(others, dim=1)
    assert got.shape == (tiny_bert.N_TARGETS,)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4)


def test_subset_margins_of_a_task_without_batched_outputs_use_vmap(tmp_path):
    from trak_dist.config import TaskConfig
    from trak_dist.tasks import ImageClassification

    class PerSampleOnly(ImageClassification):
        get_outputs = None  # a ModelOutput written for vmap only

    cfg = dataclasses.replace(job(tmp_path / "s.zarr"), task=TaskConfig(name=PerSampleOnly()))
    idx = np.arange(1, 1500, 3)
    got = SubsetTrainer(cfg).margins(idx, seed=2)
    state = digits.train_subset(idx, 2, **QUICK)
    x, y = digits.target_set().tensors
    np.testing.assert_allclose(got, numpy_margins(state, x.double().numpy(), y.numpy()), atol=1e-4)


def test_a_recipe_that_does_not_fit_the_model_is_one_clear_error(tmp_path):
    cnn = job(tmp_path / "s.zarr", recipe_kwargs={**QUICK, "arch": "cnn"})
    with pytest.raises(ConfigError, match=r"does not fit model\.factory"):
        SubsetTrainer(cnn).margins(np.arange(10), 0)
    bad = job(tmp_path / "s.zarr", recipe="trak_dist.examples.digits:train_set")
    with pytest.raises(ConfigError, match=r"called as recipe\(indices, seed"):
        SubsetTrainer(bad).margins(np.arange(10), 0)
    odd = job(tmp_path / "s.zarr", recipe=lambda indices, seed: [1, 2], recipe_kwargs={})
    with pytest.raises(ConfigError, match="must return the trained model's state_dict"):
        SubsetTrainer(odd).margins(np.arange(10), 0)


def test_the_example_recipe_with_another_model_is_refused_before_training(tmp_path):
    import dataclasses

    from trak_dist.config import ModelConfig
    from trak_dist.distributed.eval_driver import run_eval

    cfg = job(tmp_path / "s.zarr")
    cfg = dataclasses.replace(cfg, model=ModelConfig(factory="pkg.mod:make", checkpoints=[]))
    with pytest.raises(ConfigError, match=r"set eval\.recipe=pkg\.module:train"):
        run_eval(cfg)


@pytest.mark.ray
def test_a_stopped_eval_resumes_and_the_lds_matches_scipy(
    ray_session, digits_store, tmp_path, caplog
):
    import shutil

    from trak_dist.distributed.eval_driver import run_eval

    store_path = tmp_path / "store.zarr"
    shutil.copytree(digits_store, store_path)
    cfg = job(store_path)

    class Stop(Exception):
        pass

    def stop_after_three(j):
        if sum(FeatureStore.open(store_path).eval_set("targets").done()) == 3:
            raise Stop

    with caplog.at_level(logging.WARNING, logger="trak_dist"), pytest.raises(Stop):
        run_eval(cfg, on_model=stop_after_three)
    # the joined cluster's running tasks are not cancelled (a cancel racing a task's reply
    # aborts the driver in Ray: this test's pytest was killed so in CI)
    assert "left to finish; their results are not used" in caplog.text
    ev = FeatureStore.open(store_path).eval_set("targets")
    first = ev.done().copy()
    kept = np.asarray(ev.margins[:])[first]
    assert first.sum() == 3
    again = run_eval(cfg)
    assert (again.trained, again.reused) == (3, 3)
    store = FeatureStore.open(store_path)
    ev = store.eval_set("targets")
    assert ev.done().all()
    np.testing.assert_array_equal(np.asarray(ev.margins[:])[first], kept)  # not retrained

    rows = {r.variant: r for r in store_lds(store, "targets", bootstrap=0)}
    assert set(rows) == {"p64_lambdaauto", "p64_lambda1"}
    masks, margins = ev.finished()
    for name, row in rows.items():
        s = store.score_set("targets", name).scores().astype(np.float64)
        pred = np.array([[s[masks[j], t].sum() for t in range(s.shape[1])] for j in range(6)])
        rho = [spearmanr(pred[:, t], margins[:, t]).statistic for t in range(s.shape[1])]
        assert row.result.lds == pytest.approx(np.nanmean(rho), abs=1e-9)
        assert row.result.models == 6
    assert len(rows["p64_lambdaauto"].lambdas) == 2

    # a done model's margins damaged on disk: named, repaired, and exactly that model retrained
    kept = np.asarray(ev.margins[:])
    chunk = store_path / "eval" / "targets" / "margins" / "c" / "4" / "0"
    data = bytearray(chunk.read_bytes())
    data[7] ^= 0x01
    chunk.write_bytes(bytes(data))
    with pytest.raises(StoreDamagedError, match="eval/targets/margins of subset model 4 fails"):
        store_lds(FeatureStore.open(store_path), "targets", bootstrap=0)
    assert [p.uncommit for p in verify(store_path).problems] == [("eval/targets", 4)]
    repair(store_path)
    healed = run_eval(cfg)
    assert (healed.trained, healed.reused) == (1, 5)
    again = np.asarray(FeatureStore.open(store_path).eval_set("targets").margins[:])
    np.testing.assert_allclose(again, kept, rtol=0, atol=1e-5)  # the recipe is deterministic
