"""The Ray Serve deployment: ``POST /attribute``, ``POST /explain`` (causal LMs: per-token
scores), ``GET /health``, ``GET /``, ``GET /info``, ``GET /train/<i>``.

Every refusal is one JSON line ``{"error": "..."}`` with a 4xx status, and the replica goes on
serving. Requests are checked one by one, then batched across concurrent requests (``Batcher``:
every request waiting when the replica is free) into one featurisation and one pass over the
index.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from importlib import resources
from typing import Any

import torch
from ray import serve
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from trak_dist.config import JobConfig
from trak_dist.errors import TrakDistError
from trak_dist.serve._attributor import Attributor
from trak_dist.serve._batcher import Batcher
from trak_dist.serve._request import BadRequest, Item

logger = logging.getLogger(__name__)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": " ".join(message.split())}, status_code=status)


@serve.deployment(name="trak_dist_attribution")
class AttributionService:
    """One replica: an ``Attributor`` behind HTTP.

    Args:
        cfg: the job (store, model, task, data) and its ``serve`` section.
        token: the bearer token requests must carry, or None (loopback without a token).
    """

    def __init__(self, cfg: JobConfig, token: str | None) -> None:
        # the index's pass runs one thread per whole CPU of the replica, each torch call on one
        # core (AttributionIndex's threads); Ray leaves intra-op threads at the default
        torch.set_num_threads(1)
        self.attributor = Attributor(cfg)
        self.token = token
        self.max_body = cfg.serve.max_body_bytes
        self.max_explain = cfg.serve.max_explain
        self.batcher: Batcher[tuple[list[Item], int], Any] = Batcher(
            self._answer, cfg.serve.max_batch_size, cfg.serve.batch_wait_s
        )
        self.page = resources.files("trak_dist.serve").joinpath("page.html").read_text()
        self.info = {
            "train_size": self.attributor.index.train_size,
            "checkpoints": self.attributor.index.num_checkpoints,
            "proj_dim": self.attributor.index.proj_dim,
            "lambdas": self.attributor.index.lambdas,
            "target_format": self.attributor.parser.describe(),
            "example": self.attributor.parser.example,
            "max_targets": self.attributor.parser.max_targets,
            "max_k": self.attributor.parser.max_k,
            # text jobs: targets may be raw text (the example is one), replies carry texts
            "text": self.attributor.text is not None,
            "explain": self.attributor.tokens is not None,
            "max_explain": cfg.serve.max_explain,
        }
        if self.attributor.text is not None and self.attributor.example_text is not None:
            self.info["example"] = self.attributor.example_text

    async def __call__(self, request: Request) -> Response:
        path, method = request.url.path.rstrip("/") or "/", request.method
        if path == "/health" and method == "GET":
            return JSONResponse({"status": "ok"})
        if path == "/" and method == "GET":  # static, no data: the page asks for the token
            return HTMLResponse(self.page)
        if not self._authorized(request):
            return _error(
                401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'."
            )
        if path == "/info" and method == "GET":
            return JSONResponse(self.info)
        if path.startswith("/train/") and method == "GET":
            return self._train_item(path.removeprefix("/train/"))
        if path in ("/attribute", "/explain"):
            if method != "POST":
                return _error(405, f"{method} {path}; use POST with a JSON body.")
            body = await self._body(request)
            if isinstance(body, Response):
                return body
            if path == "/explain":
                return await self._explain(body)
            return await self._attribute(body)
        return _error(
            404,
            f"no route {method} {path}; routes: POST /attribute, POST /explain, GET /health, "
            "GET /info, GET /train/<i>, GET /.",
        )

    def _authorized(self, request: Request) -> bool:
        if self.token is None:
            return True
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        # constant-time: the comparison's duration says nothing about the token
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), self.token)

    def _train_item(self, text: str) -> Response:
        n = self.attributor.index.train_size
        if not text.isdigit() or int(text) >= n:
            return _error(404, f"train example {text!r}; expected an index in [0, {n}).")
        reply = {"index": int(text), "item": self.attributor.train_item(int(text))}
        if self.attributor.text is not None:  # text jobs: the example as text, whole
            reply["text"] = str(self.attributor.train.decode(int(text)))
        return JSONResponse(reply)

    async def _body(self, request: Request) -> Any:
        """The decoded JSON body, or the 4xx reply refusing it."""
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            return _error(
                413, f"body of {declared} bytes; at most serve.max_body_bytes={self.max_body}."
            )
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body:
                return _error(413, f"body over serve.max_body_bytes={self.max_body} bytes.")
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(400, f"the body is not JSON ({e}).")

    async def _explain(self, body: Any) -> Response:
        if self.attributor.tokens is None:
            return _error(
                404, "POST /explain: per-token explanations are for causal-LM text jobs only."
            )
        try:
            item, indices = self.attributor.parser.parse_explain(body, self.max_explain)
            found = await asyncio.to_thread(self.attributor.explain, item, indices)
        except BadRequest as e:
            return _error(e.status, str(e))
        except TrakDistError as e:
            return _error(400, str(e))
        return JSONResponse({"explanations": found})

    async def _attribute(self, body: Any) -> Response:
        try:
            query = self.attributor.parser.parse(body)
        except BadRequest as e:
            return _error(e.status, str(e))
        result = await self.batcher.submit((query.targets, query.k))
        if isinstance(result, Exception):
            return _error(400 if isinstance(result, TrakDistError) else 500, str(result))
        return JSONResponse({"results": result})

    def _answer(self, queries: list[tuple[list[Item], int]]) -> list[Any]:
        """One featurisation and one top-k pass for every query of the batch (at the largest k
        asked, then cut); a batch that fails is answered query by query, so one bad target
        (e.g. a label outside the model's classes) fails only its own request."""
        items = [item for targets, _ in queries for item in targets]
        try:
            results = self.attributor.reply(items, max(k for _, k in queries))
        except TrakDistError as e:
            if len(queries) == 1:
                return [e]
            return [self._answer([q])[0] for q in queries]
        out, start = [], 0
        for targets, k in queries:
            out.append(
                [
                    {kind: pairs[:k] for kind, pairs in r.items()}
                    for r in results[start : start + len(targets)]
                ]
            )
            start += len(targets)
        return out
