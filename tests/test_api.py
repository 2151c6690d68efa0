"""The Python entry point: its docstring example and docs/tasks.md's run as written."""

import re
from pathlib import Path

import numpy as np
import pytest

import trak_dist.api
import trak_dist.evaluation

ROOT = Path(__file__).resolve().parents[1]


def _docstring_example(module=trak_dist.api) -> str:
    doc = module.__doc__ or ""
    body = doc.split("::", 1)[1]
    lines = [line[4:] for line in body.splitlines() if line.startswith("    ") or not line]
    return "\n".join(lines).strip()


@pytest.mark.slow
@pytest.mark.ray
def test_docstring_example_runs(ray_session, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAK_DIST_CACHE", str(tmp_path / "cache"))
    scope: dict = {}
    exec(compile(_docstring_example(), "trak_dist.api docstring", "exec"), scope)
    scores, best = scope["scores"], scope["best"]
    assert scores.shape == (1500, 297) and np.isfinite(scores).all()
    np.testing.assert_array_equal(best[:, 0], scores.argmax(0))
    assert (tmp_path / "my_store.zarr").is_dir()
    # then trak_dist.evaluation's example on that store
    exec(
        compile(_docstring_example(trak_dist.evaluation), "trak_dist.evaluation docstring", "exec"),
        scope,
    )
    assert scope["ev"].run.trained == 20 and 0.1 < scope["lds"] < 1


def test_docs_own_model_example_is_the_docstring_one():
    page = (ROOT / "docs" / "tasks.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert any(_docstring_example() in block for block in blocks), (
        "docs/tasks.md's Python example must be trak_dist.api's docstring example (which a test "
        "runs)"
    )


@pytest.mark.ray
def test_store_takes_a_store_config(ray_session, tmp_path, digits_checkpoints):
    """``store=`` is a path or a whole StoreConfig (its chunk_rows reach the store), not a
    section that the path argument shadows."""
    from torch.utils.data import TensorDataset

    from trak_dist.config import FeaturizeConfig, StoreConfig
    from trak_dist.examples import digits
    from trak_dist.store import FeatureStore

    x, y = digits.train_set().tensors
    xt, yt = digits.target_set().tensors
    result = trak_dist.api.run(
        model=digits.make_model,
        checkpoints=digits_checkpoints[:1],
        train=TensorDataset(x[:96], y[:96]),
        targets=TensorDataset(xt[:8], yt[:8]),
        store=StoreConfig(path=str(tmp_path / "s.zarr"), chunk_rows=32),
        proj_dim=16,
        lambda_reg=1e-2,
        featurize=FeaturizeConfig(micro_batch=32, half_precision=False),
        progress=False,
    )
    assert result.store == str(tmp_path / "s.zarr")
    store = FeatureStore.open(result.store, mode="r")
    assert store.spec.chunk_rows == 32
    assert store.train_rows(0).X.chunks == (32, 16)
    assert result.scores().shape == (96, 8)
    with pytest.raises(TypeError, match=r"unknown sections \['stores'\]"):
        trak_dist.api.run(digits.make_model, [], None, None, stores=StoreConfig())
