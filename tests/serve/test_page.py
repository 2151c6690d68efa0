"""``GET /``'s page in a real headless browser (Debian's chromium, over the DevTools protocol)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.serve import TOKEN, DigitsJob, LmJob
from trak_dist.examples import digits

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = (
    "Debian's chromium is not installed (apt-get install chromium): the page test needs a real "
    "headless browser"
)
# CI installs chromium and sets TRAK_DIST_REQUIRE_CHROMIUM=1: there a missing browser fails
if CHROMIUM is None and os.environ.get("TRAK_DIST_REQUIRE_CHROMIUM") == "1":
    raise RuntimeError(NO_CHROMIUM)
pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM),
]


class Browser:
    """One page of a headless chromium, driven with DevTools protocol commands."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg["result"])

    def js(self, expression: str) -> Any:
        """The value of ``expression`` (awaited when it is a promise)."""
        out = self.send(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def wait_for(self, condition: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = self.js(condition)
            except RuntimeError:  # the page is still loading: no such element yet
                value = None
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(
            f"the page never showed {condition!r}: {self.js('document.body.innerText')}"
        )


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    from websockets.sync.client import connect

    assert CHROMIUM is not None
    log = tmp_path / "chromium.log"
    with open(log, "w") as err:  # a file, not a pipe: chromium never blocks on a full pipe
        proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless=new",
                "--no-sandbox",  # as root in a container
                "--disable-gpu",
                "--remote-debugging-port=0",
                f"--user-data-dir={tmp_path / 'profile'}",
                "about:blank",
            ],
            stderr=err,
        )
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", log.read_text())
            port = int(found.group(1)) if found else time.sleep(0.1)
        assert port is not None, f"chromium did not start its DevTools server: {log.read_text()}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            page = next(t for t in json.loads(r.read()) if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=2**24) as ws:
            yield Browser(ws)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _rows(browser: Browser, table: str) -> list[list[str]]:
    return browser.js(
        f"[...document.querySelectorAll('#{table} tr.row')]"
        ".map(tr => [...tr.cells].map(td => td.innerText.trim()))"
    )


def test_page_shows_proponents_and_opponents(
    service: str, digits_job: DigitsJob, browser: Browser
) -> None:
    browser.send("Page.navigate", url=service)
    # no token yet: the page says the service refused
    browser.wait_for("document.getElementById('info').innerText.includes('HTTP 401')")
    browser.js(
        f"(() => {{ const t = document.getElementById('token'); t.value = {json.dumps(TOKEN)};"
        " t.dispatchEvent(new Event('change')); })()"
    )
    info = browser.wait_for(
        "document.getElementById('info').innerText.includes('1500 train examples')"
        " && document.getElementById('info').innerText"
    )
    assert "2 checkpoint(s)" in info and "float32 [64]" in info
    # paste target 0 of the batch job, k = 5, and press the button
    x, y = digits.target_set()[0]
    browser.js(
        f"document.getElementById('target').value = {json.dumps(json.dumps([x.tolist(), int(y)]))};"
        "document.getElementById('k').value = '5';"
        "document.getElementById('go').click()"
    )
    browser.wait_for(
        "document.querySelectorAll('#opponents tr.row').length === 5"
        " && document.querySelectorAll('#opponents canvas').length === 5"
    )
    scale = np.abs(digits_job.scores).max()
    for table in ("proponents", "opponents"):
        rows = _rows(browser, table)
        assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5]
        assert [int(r[1]) for r in rows] == digits_job.topk[f"{table}_idx"][0, :5].tolist()
        np.testing.assert_allclose(
            [float(r[2]) for r in rows],
            digits_job.topk[f"{table}_val"][0, :5],
            rtol=1e-4,
            atol=1e-4 * scale,
        )
        # each row shows its train example: the 8×8 image drawn, then its label
        for r, i in zip(rows, digits_job.topk[f"{table}_idx"][0, :5], strict=True):
            assert r[3] == f"[{int(digits.train_set()[int(i)][1])}]"
    assert browser.js("document.getElementById('error').innerText") == ""
    # pick a train example as the target: the text area holds it
    browser.js(
        "document.getElementById('pick').value = '7'; document.getElementById('load').click()"
    )
    loaded = browser.wait_for(
        "document.getElementById('target').value.startsWith('[[')"
        " && document.getElementById('target').value !== "
        f"{json.dumps(json.dumps([x.tolist(), int(y)]))}"
        " && document.getElementById('target').value"
    )
    tx, ty = digits.train_set()[7]
    assert json.loads(loaded) == [tx.tolist(), int(ty)]
    # a bad target: the service's one-line reason is shown
    browser.js(
        "document.getElementById('target').value = '[[1, 2], 3]';"
        "document.getElementById('go').click()"
    )
    message = browser.wait_for("document.getElementById('error').innerText")
    assert "HTTP 400" in message and "has shape [2]" in message


def test_page_shows_text_and_token_highlights_for_a_causal_lm(
    lm_service: str, lm_job: LmJob, browser: Browser
) -> None:
    from trak_dist.serve.client import attribute, explain

    browser.send("Page.navigate", url=lm_service)
    n = lm_job.scores.shape[0]
    info = browser.wait_for(
        f"document.getElementById('info').innerText.includes('{n} train examples')"
        " && document.getElementById('info').innerText"
    )
    assert "a string, or a record" in info
    # a text job's example target is text, and the legend of the highlighting is shown
    example = browser.js("document.getElementById('target').value")
    assert example == lm_job.targets[0]["prompt"] + lm_job.targets[0]["completion"]
    assert browser.js("document.getElementById('legend').hidden") is False
    # paste plain text (not JSON), k = 3, and press the button
    text = "the color of kip is blue."
    browser.js(
        f"document.getElementById('target').value = {json.dumps(text)};"
        "document.getElementById('k').value = '3';"
        "document.getElementById('go').click()"
    )
    browser.wait_for("document.querySelectorAll('#opponents .tokens').length === 3")
    # what the page shows is the service's reply for the text: indices, scores, texts
    [want] = attribute(lm_service, [text], k=3)
    for side in ("proponents", "opponents"):
        rows = _rows(browser, side)
        assert [int(r[1]) for r in rows] == [p[0] for p in want[side]]
        np.testing.assert_allclose(
            [float(r[2]) for r in rows], [p[1] for p in want[side]], rtol=1e-5
        )
        assert [r[3] for r in rows] == [lm_job.train_texts[p[0]] for p in want[side]]
        # each example's tokens, shaded by their shares from /explain
        found = explain(lm_service, text, [p[0] for p in want[side]])
        shown = browser.js(
            f"[...document.querySelectorAll('#{side} tr.row')].map(tr => "
            "[...tr.querySelectorAll('span.tok')].map(s => [s.textContent, "
            "s.dataset.score === undefined ? null : Number(s.dataset.score), "
            "getComputedStyle(s).backgroundColor]))"
        )
        for spans, ex in zip(shown, found, strict=True):
            assert [s[0] for s in spans] == ex["tokens"]
            assert [s[1] for s in spans] == ex["scores"]  # the same doubles, through JSON
            colors = [_rgba(s[2]) for s in spans]
            assert colors[0][3] == 0  # the first token, not predicted: not shaded
            shares = [s for s in ex["scores"] if s is not None]
            top = max(abs(s) for s in shares)
            for color, s in zip(colors[1:], ex["scores"][1:], strict=True):
                # green raises, red lowers, and the opacity is the share's size
                assert color[:3] == ((0, 150, 0) if s >= 0 else (210, 0, 0)) or color[3] == 0
                assert color[3] == pytest.approx(abs(s) / top, abs=5e-3)
    assert browser.js("document.getElementById('error').innerText") == ""
    # a bad target (empty text): the service's one-line reason is shown
    browser.js(
        "document.getElementById('target').value = '  ';document.getElementById('go').click()"
    )
    message = browser.wait_for("document.getElementById('error').innerText")
    assert "HTTP 400" in message and "empty or missing 'text'" in message


def _rgba(css: str) -> tuple[int, int, int, float]:
    """``rgb(r, g, b)`` or ``rgba(r, g, b, a)`` as numbers (alpha 1 when absent)."""
    parts = [float(v) for v in re.findall(r"[\d.]+", css)]
    r, g, b = (int(v) for v in parts[:3])
    return (r, g, b, parts[3] if len(parts) > 3 else 1.0)
