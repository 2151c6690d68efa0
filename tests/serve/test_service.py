"""The real service over HTTP: good and bad requests, the token, and that it keeps serving."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.fixtures.serve import MAX_BODY, TOKEN, DigitsJob
from trak_dist.examples import digits
from trak_dist.serve.client import ServiceError, attribute, health, request

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _target(i: int) -> list[object]:
    x, y = digits.target_set()[i]
    return [x.tolist(), int(y)]


def _raw(url: str, path: str, data: bytes | None, token: str | None = TOKEN, method=None):
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _refused(url: str, body: object, status: int, match: str, raw: bytes | None = None) -> None:
    code, text = _raw(url, "/attribute", raw if raw is not None else json.dumps(body).encode())
    assert code == status, text
    lines = text.decode().strip().splitlines()
    assert len(lines) == 1
    message = json.loads(lines[0])["error"]
    assert match in message, message


def test_replies_equal_the_batch_job(service: str, digits_job: DigitsJob) -> None:
    """Values to 1e-4 of the largest score (targets are featurised one by one, the batch job
    featurised them 64 at a time: see test_attributor_any_batch), indices equal."""
    assert health(service)
    picks = np.arange(64)
    results = attribute(service, [_target(int(i)) for i in picks], k=10, token=TOKEN)
    for kind in ("proponents", "opponents"):
        idx = np.array([[p[0] for p in r[kind]] for r in results])
        val = np.array([[p[1] for p in r[kind]] for r in results])
        stored_val = digits_job.topk[f"{kind}_val"][picks]
        scale = np.abs(digits_job.scores).max()
        np.testing.assert_allclose(val, stored_val, rtol=1e-4, atol=1e-4 * scale)
        np.testing.assert_allclose(
            val,
            np.take_along_axis(digits_job.scores[:, picks].T, idx, 1),
            rtol=1e-4,
            atol=1e-4 * scale,
        )
        np.testing.assert_array_equal(idx, digits_job.topk[f"{kind}_idx"][picks])


def test_concurrent_requests_are_batched_and_answered_each(
    service: str, digits_job: DigitsJob
) -> None:
    picks = [3, 40, 77, 150, 200, 296, 5, 9]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: attribute(service, [_target(i)], 3, TOKEN), picks))
    # batched with others or alone, a target gets the same top-k, and its scores up to the
    # float32 rounding of the matmul (its row of the target side is the same to the bit)
    for again in (
        [attribute(service, [_target(picks[0])], 3, TOKEN)[0]],
        attribute(service, [_target(i) for i in picks], 3, TOKEN),
    ):
        for got, [want] in zip(again, replies, strict=False):
            for kind in ("proponents", "opponents"):
                assert [p[0] for p in got[kind]] == [p[0] for p in want[kind]]
                np.testing.assert_allclose(
                    [p[1] for p in got[kind]], [p[1] for p in want[kind]], rtol=1e-6, atol=1e-7
                )
    for i, [r] in zip(picks, replies, strict=True):
        assert [p[0] for p in r["proponents"]] == digits_job.topk["proponents_idx"][i, :3].tolist()
        assert [p[0] for p in r["opponents"]] == digits_job.topk["opponents_idx"][i, :3].tolist()
        np.testing.assert_allclose(
            [p[1] for p in r["proponents"]],
            digits_job.topk["proponents_val"][i, :3],
            rtol=1e-4,
            atol=1e-4 * np.abs(digits_job.scores).max(),
        )


def test_token_bad_input_and_still_serving(service: str) -> None:
    good = {"targets": [_target(0)], "k": 2}
    # the token
    code, _ = _raw(service, "/attribute", json.dumps(good).encode(), token=None)
    assert code == 401
    code, _ = _raw(service, "/attribute", json.dumps(good).encode(), token="wrong-token-wrong")
    assert code == 401
    assert _raw(service, "/info", None, token=None)[0] == 401
    assert _raw(service, "/health", None, token=None)[0] == 200
    with pytest.raises(ServiceError, match="401"):
        attribute(service, [_target(0)], 2)
    # bad input: 4xx, one JSON line naming what was wrong
    x, y = _target(1)
    _refused(service, {**good, "extra": 1}, 400, "unknown field(s) ['extra']")
    _refused(service, {"k": 2}, 400, 'missing field "targets"')
    _refused(service, {"targets": [[x[:63], y]], "k": 2}, 400, "targets[0][0] has shape [63]")
    _refused(service, {"targets": [[x, 3.5]], "k": 2}, 400, "non-integers")
    _refused(service, {"targets": [[x, y, 1]], "k": 2}, 400, "expected a list of fields")
    _refused(service, {"targets": [[x, 99]], "k": 2}, 400, "99")  # no such class
    _refused(service, {"targets": [[["a"] * 64, y]], "k": 2}, 400, "targets[0][0]")
    _refused(service, {"targets": [], "k": 2}, 400, "non-empty list")
    _refused(service, {"targets": [[x, y]], "k": 0}, 400, "k=0")
    _refused(service, {"targets": [[x, y]], "k": "5"}, 400, "k='5'")
    _refused(service, {"targets": [[x, y]] * 71, "k": 1}, 413, "serve.max_targets=70")
    _refused(service, None, 413, "serve.max_body_bytes", raw=b" " * (MAX_BODY + 1))
    _refused(service, None, 400, "not JSON", raw=b"{targets: ")
    _refused(
        service, None, 400, "NaN", raw=json.dumps({"targets": [[[float("nan")] * 64, y]]}).encode()
    )
    assert _raw(service, "/attribute", None, method="GET")[0] == 405
    assert _raw(service, "/nowhere", None)[0] == 404
    assert _raw(service, "/train/100000", None)[0] == 404
    # and it keeps serving
    [r] = attribute(service, [_target(0)], 2, TOKEN)
    assert len(r["proponents"]) == 2 and len(r["opponents"]) == 2


def test_info_page_and_train_items(service: str) -> None:
    info = request(service, "/info", token=TOKEN)
    assert info["train_size"] == 1500 and info["checkpoints"] == 2
    assert "float32 [64]" in info["target_format"] and "int64 []" in info["target_format"]
    item = request(service, "/train/7", token=TOKEN)["item"]
    x, y = digits.train_set()[7]
    assert item == [x.tolist(), int(y)]
    code, page = _raw(service, "/", None, token=None)
    assert code == 200 and b"<title>trak-dist serve</title>" in page
