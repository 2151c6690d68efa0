"""``trak-dist serve``: attribution of new targets as an online service (Ray Serve, HTTP/JSON).

A query never touches the train gradients: it costs the targets' own gradients (the workers'
``Featurizer``) and one pass over the index of the stored train features (``AttributionIndex``),
and its answers equal the batch job's ``score_set(...).scores()`` for the same targets.

    trak-dist                 # the batch job (the digits example)
    trak-dist serve           # http://127.0.0.1:8000/: POST /attribute, GET /health, GET /

Text jobs (``data=text``) also take raw text and reply with the examples' text; causal LMs
explain a score token by token (``POST /explain``, ``trak_dist.serve._explain``).

``trak_dist.serve.client.attribute`` is a client; ``start``/``stop`` deploy from Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trak_dist.scoring import TopK
from trak_dist.serve._cli import main
from trak_dist.serve._index import AttributionIndex
from trak_dist.serve._request import BadRequest, RequestParser

if TYPE_CHECKING:
    from trak_dist.config import JobConfig

__all__ = ["AttributionIndex", "BadRequest", "RequestParser", "TopK", "main", "start", "stop"]


def start(cfg: JobConfig) -> str:
    """See ``trak_dist.serve._service.start`` (imported lazily: it needs ``ray[serve]``)."""
    from trak_dist.serve._service import start as _start

    return _start(cfg)


def stop() -> None:
    """See ``trak_dist.serve._service.stop``."""
    from trak_dist.serve._service import stop as _stop

    _stop()
