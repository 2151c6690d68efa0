"""A text job served: raw-text targets, the train examples' text in replies, per-token
explanations, and bad text, on a tiny Llama (random init, trained a few steps, saved with
``save_pretrained``) whose batch job (``data=text``, JSONL) featurised the store."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

from tests.fixtures.serve import LmJob
from trak_dist.serve.client import ServiceError, attribute, explain, health

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _token_fields(dataset, i: int) -> dict[str, list[int]]:
    """Row i of a ``TextDataset`` as token fields, its padding cut off."""
    row = dataset[i]
    real = row["attention_mask"].bool()
    return {k: v[real].tolist() for k, v in row.items()}


def _side(results, side: str) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.array([[p[0] for p in r[side]] for r in results]),
        np.array([[p[1] for p in r[side]] for r in results]),
    )


def test_raw_text_targets_equal_the_batch_job(lm_service: str, lm_job: LmJob) -> None:
    m, k = len(lm_job.targets), 10
    # each target as the record targets.jsonl holds (prompt masked, as the job tokenised it)
    results = attribute(lm_service, lm_job.targets, k=k)
    scale = np.abs(lm_job.scores).max()
    for side in ("proponents", "opponents"):
        idx, val = _side(results, side)
        want_idx, want_val = lm_job.topk[f"{side}_idx"][:m, :k], lm_job.topk[f"{side}_val"][:m, :k]
        np.testing.assert_allclose(val, want_val, rtol=1e-5, atol=1e-6 * scale)
        np.testing.assert_allclose(
            val, np.take_along_axis(lm_job.scores.T, idx, 1), rtol=1e-5, atol=1e-6 * scale
        )
        # ties aside: an index differs only where its score ties the stored one's
        differ = idx != want_idx
        np.testing.assert_allclose(val[differ], want_val[differ], rtol=1e-6, atol=1e-7 * scale)
        # each example's text, parallel to the pairs: the train file's text column
        for r, row in zip(results, idx, strict=True):
            assert r[f"{side}_text"] == [lm_job.train_texts[i] for i in row]
    # the same targets as the token ids the job made of them: the same reply
    target_rows = lm_job.cfg.data.targets()
    tokens = attribute(lm_service, [_token_fields(target_rows, t) for t in range(m)], k=k)
    assert tokens == results
    # a string is the text column: train row 5's text gives train row 5's tokens' reply
    train = lm_job.cfg.data.train()
    [as_text] = attribute(lm_service, [lm_job.train_texts[5]], k=k)
    [as_record] = attribute(lm_service, [{"text": lm_job.train_texts[5]}], k=k)
    [as_ids] = attribute(lm_service, [_token_fields(train, 5)], k=k)
    assert as_text == as_record == as_ids
    assert as_text["proponents"][0][0] == 5  # a train example is its own top proponent


def test_token_explanations_add_up_and_match_the_token_explainer(
    lm_service: str, lm_job: LmJob
) -> None:
    from trak_dist.explain import TokenExplainer

    t = len(lm_job.targets) - 1
    [result] = attribute(lm_service, [lm_job.targets[t]], k=3)
    indices = [p[0] for p in result["proponents"]] + [p[0] for p in result["opponents"]]
    found = explain(lm_service, lm_job.targets[t], indices)
    train = lm_job.cfg.data.train()
    reference = TokenExplainer(lm_job.cfg, train).explain([(i, t) for i in indices])
    scale = np.abs(lm_job.scores).max()
    for ex, i in zip(found, indices, strict=True):
        assert ex["index"] == i
        counted = [j for j, s in enumerate(ex["scores"]) if s is not None]
        shares = np.array([ex["scores"][j] for j in counted])
        # the shares add up to the example's score in the batch job (float32 rows)
        np.testing.assert_allclose(shares.sum(), ex["score"], rtol=1e-12)
        np.testing.assert_allclose(ex["score"], lm_job.scores[i, t], rtol=1e-4, atol=1e-6 * scale)
        positions, tokens = reference[(i, t)]
        assert counted == positions.tolist()
        np.testing.assert_allclose(shares, tokens.numpy(), rtol=1e-4, atol=1e-6 * scale)
        # every real token shown, the first (predicted by nothing) without a share
        assert ex["scores"][0] is None and len(counted) == len(ex["tokens"]) - 1
        assert "".join(ex["tokens"]) == lm_job.train_texts[i]


def _refused(url: str, path: str, body: object, status: int, match: str) -> None:
    req = urllib.request.Request(
        url.rstrip("/") + path, data=json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raise AssertionError(f"{body!r} was answered {r.status}: {r.read()[:200]!r}")
    except urllib.error.HTTPError as e:
        code, text = e.code, e.read().decode()
    assert code == status, text
    lines = text.strip().splitlines()
    assert len(lines) == 1
    message = json.loads(lines[0])["error"]
    assert match in message, message


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ("", " has an empty or missing 'text'"),
        ("   ", " has an empty or missing 'text'"),
        (7, " is 7; expected a string, or a record"),
        ({"text": 3}, " has an empty or missing 'text' (got 3)"),
        (
            {"prompt": "the color of kip is"},
            " is {'prompt': 'the color of kip is'}; expected a string",
        ),
        ({"body": "hello"}, " has field(s) ['body']"),
        ({"prompt": "the color", "completion": ""}, " has an empty or missing 'completion'"),
        ({"messages": "hi"}, ": messages is 'hi'; expected a list of objects"),
        ({"messages": [{"role": "user", "content": "hi"}]}, ": a 'messages' column needs a tok"),
        ({"text": "the color of kip is", "label": 1}, " has field(s) ['label']"),
        (" ".join(["the old river stone"] * 40), ": 1 row(s) are longer than max_length=64"),
    ],
)
def test_bad_text_is_refused_and_the_service_goes_on(
    lm_service: str, lm_job: LmJob, target: object, match: str
) -> None:
    _refused(lm_service, "/attribute", {"targets": [target], "k": 3}, 400, "targets[0]" + match)
    _refused(lm_service, "/explain", {"target": target, "train": [0]}, 400, "target" + match)
    assert health(lm_service)
    [ok] = attribute(lm_service, [lm_job.targets[0]], k=2)
    assert [p[0] for p in ok["proponents"]] == lm_job.topk["proponents_idx"][0, :2].tolist()


def test_bad_explain_requests(lm_service: str, lm_job: LmJob) -> None:
    target = lm_job.targets[0]
    n = lm_job.scores.shape[0]
    for body, match in [
        ({"target": target}, "expected exactly ['target', 'train']"),
        ({"target": target, "train": [n]}, f"train indices in [0, {n})"),
        ({"target": target, "train": []}, "a list of 1 to serve.max_explain=8"),
        ({"target": target, "train": list(range(9))}, "serve.max_explain=8"),
        ({"target": target, "train": ["1"]}, "train=['1']"),
        ({"target": target, "train": [0], "k": 3}, "fields ['k', 'target', 'train']"),
    ]:
        _refused(lm_service, "/explain", body, 400, match)
    with pytest.raises(ServiceError, match="HTTP 405"):
        from trak_dist.serve.client import request

        request(lm_service, "/explain")
