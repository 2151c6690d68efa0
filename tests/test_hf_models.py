"""Stock Hugging Face models end to end, on the CPU, with transformers' default attention:
TRAKer against a dense float64 solve, ``trak_dist.run`` on Ray against TRAKer, and
``trak-dist model=custom`` on the bundled BERT and GPT-2 examples.

transformers 5.x's attention-mask code cannot run under torch.func.vmap (default attention;
BERT also with eager attention), so with default attention these runs use the module-hook
gradient engine, which ``gradient_engine=auto`` picks (no setting needed); GPT-2 with eager
attention also runs on the vmap engine.
"""

import json
import logging
import math
from functools import partial

import numpy as np
import pytest
import torch

import trak_dist as td
from tests.fixtures.helpers import random_states
from tests.fixtures.hf_models import bert_classifier, gpt2_lm, padded_tokens
from tests.test_cli import trak_dist
from trak_dist import TRAKer
from trak_dist.batches import slice_batch
from trak_dist.config import FeaturizeConfig, ProjectionConfig
from trak_dist.errors import ConfigError
from trak_dist.examples import tiny_bert, tiny_lm
from trak_dist.gradients import IterativeGradientComputer
from trak_dist.projection import rademacher_block
from trak_dist.sources import batch_of
from trak_dist.store import FeatureStore
from trak_dist.tasks import resolve_task

N, M, P, LAMBDA, SEED = 16, 5, 32, 1e-2, 3


def gpt2_batches():
    ids, mask = padded_tokens(N + M, seed=7)
    batch = {"input_ids": ids, "attention_mask": mask}
    return slice_batch(batch, 0, N), slice_batch(batch, N, N + M)


def bert_batches():
    ids, mask = padded_tokens(N + M, seed=8)
    types = ((torch.arange(ids.shape[1]) >= 5) & mask.bool()).long()
    labels = torch.arange(N + M) % 3
    batch = (ids, types, mask, labels)
    return slice_batch(batch, 0, N), slice_batch(batch, N, N + M)


MODELS = {
    "gpt2": (gpt2_lm, "causal_lm", gpt2_batches),
    "bert": (bert_classifier, "text_classification", bert_batches),
}


def gradient_rows(model, task, batch):
    """``[B, d]`` float64 per-sample gradients of ``task.get_outputs`` by plain autograd, one
    sample at a time (no torch.func, no hooks)."""
    params = list(model.parameters())
    n = len(batch["input_ids"]) if isinstance(batch, dict) else len(batch[0])
    rows = []
    for i in range(n):
        out = task.get_outputs(model, slice_batch(batch, i, i + 1))[0]
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(out, params)]))
    return torch.stack(rows)


def dense_solve(make, task_name, states, train, targets):
    """docs/design.md's scores in float64 with P built from its hash (rademacher_block)."""
    task = resolve_task(task_name)
    s, q = 0, 0
    for c, state in enumerate(states):
        model = make().double()
        model.load_state_dict({k: v.double() for k, v in state.items()})
        g, gt = gradient_rows(model, task, train), gradient_rows(model, task, targets)
        d = g.shape[1]
        proj = rademacher_block(SEED, c, 0, d, 0, P, dtype=torch.float64) / math.sqrt(d)
        x, xt = g @ proj, gt @ proj
        kinv = torch.linalg.inv(x.T @ x + LAMBDA * torch.eye(P, dtype=torch.float64))
        s = s + x @ (kinv / kinv.abs().mean()) @ xt.T
        weights = {k: v.detach() for k, v in model.named_parameters()}
        buffers = {k: v.detach() for k, v in model.named_buffers()}
        with torch.no_grad():
            q = q + task.get_out_to_loss_grad(model, weights, buffers, train)
    c = len(states)
    return (s / c * (q / c)[:, None]).numpy()


def traker_scores(make, task_name, states, train, targets, save_dir, **kw):
    t = TRAKer(
        model=make(),
        task=task_name,
        train_set_size=N,
        save_dir=save_dir,
        device="cpu",
        logging_level=logging.ERROR,
        proj_dim=P,
        lambda_reg=LAMBDA,
        projector_seed=SEED,
        use_half_precision=False,
        # the dense solve's: traker's Rademacher matrix and XᵀX (a causal LM's default at every
        # door is Kronecker + the sampled-label Fisher, tasks/_defaults.py)
        projection="rademacher",
        curvature="xtx",
        **kw,
    )
    for i, state in enumerate(states):
        t.load_checkpoint(state, model_id=i)
        for b in range(0, N, 8):
            t.featurize(slice_batch(train, b, b + 8), num_samples=8)
    t.finalize_features()
    for i, state in enumerate(states):
        t.start_scoring_checkpoint("exp", state, model_id=i, num_targets=M)
        t.score(targets, num_samples=M)
    return np.asarray(t.finalize_scores("exp"), dtype=np.float64)


@pytest.mark.parametrize(
    ("name", "attn", "kw"),
    [
        pytest.param("gpt2", None, {}, id="gpt2-default"),
        pytest.param("bert", None, {}, id="bert-default"),
        pytest.param("gpt2", "eager", {}, id="gpt2-eager-vmap"),
        pytest.param(
            "bert", None, {"gradient_computer": IterativeGradientComputer}, id="bert-loop"
        ),
    ],
)
def test_traker_equals_a_dense_float64_solve(name, attn, kw, tmp_path):
    make_model, task, batches = MODELS[name]
    make = partial(make_model, attn)
    states = [make_model(attn, seed=s).state_dict() for s in (11, 12)]
    train, targets = batches()
    ours = traker_scores(make, task, states, train, targets, tmp_path / "s", **kw)
    exact = dense_solve(make, task, states, train, targets)
    np.testing.assert_allclose(ours, exact, rtol=1e-4, atol=1e-4 * np.abs(exact).max())


@pytest.fixture(scope="module")
def lm_states(tmp_path_factory):
    """Two random-weight tiny_lm checkpoints (no training: the test compares two paths)."""
    return random_states(
        tmp_path_factory.mktemp("lm_states"), partial(tiny_lm.make_model, n_embd=32)
    )


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize(
    "attn",
    [pytest.param(None, id="default"), pytest.param("eager", id="eager")],
)
def test_run_on_ray_equals_traker(ray_session, lm_states, attn, tmp_path):
    """causal_lm with dict samples through the Ray pipeline (2 workers) gives TRAKer's scores."""
    make = partial(tiny_lm.make_model, n_embd=32, attn_implementation=attn)
    train, targets = partial(tiny_lm.train_set, limit=N), partial(tiny_lm.target_set, limit=M)
    result = td.run(
        model=make,
        checkpoints=lm_states,
        train=partial(tiny_lm.train_set, limit=N),
        targets=partial(tiny_lm.target_set, limit=M),
        task="causal_lm",
        store=tmp_path / "run.zarr",
        proj_dim=P,
        lambda_reg=LAMBDA,
        num_workers=2,
        # traker_scores' projection and XᵀX (causal_lm's default is Kronecker + the Fisher)
        projection=ProjectionConfig(kind="rademacher", seed=SEED),
        featurize=FeaturizeConfig(micro_batch=4, half_precision=False, curvature="xtx"),
        progress=False,
    )
    states = [torch.load(p, weights_only=True) for p in lm_states]
    train = batch_of(tiny_lm.train_set(limit=N), 0, N)
    targets = batch_of(tiny_lm.target_set(limit=M), 0, M)
    ours = traker_scores(make, "causal_lm", states, train, targets, tmp_path / "traker")
    np.testing.assert_allclose(result.scores(), ours, rtol=1e-4, atol=1e-4 * np.abs(ours).max())


def run_example(tmp_path, example, task, checkpoints, *overrides):
    """``trak-dist model=custom data=custom`` on ``trak_dist.examples.<example>``; the report.

    A run that stops with the CLI's one-line error naming the hooks engine (exit 2) raises
    that error as the ConfigError it reports.
    """
    paths = ",".join(str(p) for p in checkpoints)
    out = trak_dist(
        [
            "model=custom",
            "data=custom",
            f"task={task}",
            f"model.factory=trak_dist.examples.{example}:make_model",
            f"model.checkpoints=[{paths}]",
            f"data.train=trak_dist.examples.{example}:train_set",
            "proj_dim=128",
            "lambda_reg=1e-2",
            "progress=false",
            "hydra.run.dir=run",
            *overrides,
        ],
        tmp_path,
    )
    if out.returncode == 2 and "gradient_engine=hooks" in out.stderr:
        raise ConfigError(out.stderr.strip().splitlines()[-1])
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((tmp_path / "run" / "trak_report.json").read_text())


@pytest.fixture(scope="module")
def bert_trained(tmp_path_factory):
    """Two trained tiny_bert checkpoints (a few seconds each)."""
    return tiny_bert.checkpoints(num=2, epochs=10, cache_dir=str(tmp_path_factory.mktemp("c")))


@pytest.mark.slow
def test_cli_bert_text_classification(bert_trained, tmp_path):
    """``trak-dist model=custom`` on a stock BertForSequenceClassification, default attention:
    the top proponents of a target mostly carry its label (chance: 1/3)."""
    report = run_example(
        tmp_path,
        "tiny_bert",
        "text_classification",
        bert_trained,
        "data.targets=trak_dist.examples.tiny_bert:target_set",
        "+data.kwargs.n=64",
        "cluster=inprocess",  # the model side is checked here; Ray in test_run_on_ray_*
    )
    assert report["rows_computed"] == {"train": 2 * 64, "target": 2 * 64}
    assert report["variants"][0]["proponent_label_agreement"] > 0.6


@pytest.mark.slow
def test_cli_gpt2_causal_lm(lm_states, tmp_path):
    """``trak-dist model=custom task=causal_lm`` on a stock GPT2LMHeadModel, default attention,
    dict samples; the train set scored as targets: each piece of text is its own strongest
    proponent (train and target features come from the same path; a property of TRAK's XᵀX
    with proj_dim > n and small λ, so random-weight checkpoints do)."""
    report = run_example(
        tmp_path,
        "tiny_lm",
        "causal_lm",
        lm_states,
        "+model.kwargs.n_embd=32",
        "data.targets=trak_dist.examples.tiny_lm:train_set",
        "+data.kwargs.limit=96",
        "cluster=inprocess",
        # the property is XᵀX's (the causal_lm default's sampled-label Fisher need not have it)
        "featurize.curvature=xtx",
    )
    assert report["rows_computed"] == {"train": 2 * 96, "target": 2 * 96}
    sset = FeatureStore.open(report["store"], mode="r").score_set("targets", "p128_lambda0.01")
    top = sset.read_topk()["proponents_idx"][:, 0]
    assert (top == np.arange(96)).mean() > 0.9
