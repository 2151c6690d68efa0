"""A client of ``trak-dist serve``, with the standard library only.

Example (with ``trak-dist`` then ``trak-dist serve`` running)::

    from trak_dist.examples import digits
    from trak_dist.serve.client import attribute

    x, y = digits.target_set()[0]
    [result] = attribute("http://127.0.0.1:8000/", [[x.tolist(), int(y)]], k=5)
    print(result["proponents"])      # [[train index, score], ...], highest first

A text job (``data=text``) takes raw text (``attribute(url, ["the color of kip is blue."])``)
and its results also hold ``proponents_text`` / ``opponents_text``; a causal-LM job explains a
score token by token (``explain``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


class ServiceError(RuntimeError):
    """The service refused a request: its HTTP ``status`` and its one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def request(
    url: str,
    path: str,
    body: Any = None,
    token: str | None = None,
    timeout: float = 60.0,
) -> Any:
    """``GET`` (no ``body``) or ``POST`` (JSON ``body``) ``path`` of the service; the decoded
    JSON reply.

    Raises:
        ServiceError: a 4xx/5xx reply (its ``{"error": ...}`` line as the message).
    """
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url.rstrip("/") + path, data=data, method="GET" if data is None else "POST"
    )
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        try:
            message = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            message = text.strip()
        raise ServiceError(e.code, message) from None


def attribute(
    url: str, targets: list[Any], k: int = 10, token: str | None = None, timeout: float = 60.0
) -> list[dict[str, list[Any]]]:
    """Top-``k`` proponents and opponents of each target: per target
    ``{"proponents": [[train index, score], ...], "opponents": [...]}``, plus for text jobs
    ``"proponents_text"`` and ``"opponents_text"``: each example's text, in the same order (cut
    to ``serve.text_chars`` characters).

    Args:
        url: the service, e.g. ``http://127.0.0.1:8000/``.
        targets: items in the task's format (``GET /info`` describes it); digits: ``[x, y]``
            with ``x`` 64 numbers and ``y`` the label; text jobs: a string, or a record of the
            data file's columns (``{"prompt": ..., "completion": ...}``), or token fields.
        token: the bearer token, for a service started with ``serve.token_file``.
    """
    reply = request(url, "/attribute", {"targets": targets, "k": k}, token, timeout)
    return list(reply["results"])


def explain(
    url: str, target: Any, train: list[int], token: str | None = None, timeout: float = 120.0
) -> list[dict[str, Any]]:
    """Causal-LM jobs: each train example's score for ``target``, token by token: per index
    ``{"index", "score", "tokens": [each real token's text], "scores": [its share of the
    score, or None for a token not predicted (the first, a masked prompt)]}``; the shares add
    up to ``score``, the example's score in ``attribute``'s reply."""
    reply = request(url, "/explain", {"target": target, "train": train}, token, timeout)
    return list(reply["explanations"])


def health(url: str, timeout: float = 5.0) -> bool:
    """Whether the service answers ``GET /health``."""
    try:
        return request(url, "/health", timeout=timeout).get("status") == "ok"
    except (OSError, ServiceError):
        return False
