"""A ``POST /attribute`` body, checked field by field against one item of the target set.

A target is one dataset item as JSON: a tuple item's fields as a list (the digits example's
``(image [64], label)`` is ``[[64 numbers], 3]``), a dict item's fields by name
(``{"input_ids": [...], "attention_mask": [...], "labels": [...]}``). Each field must have the
template item's number of dimensions and shape; 1-D integer fields (token ids) may have any
length, the same for all of them within one target. Text jobs also take raw text: a string or
a record of the data file's columns, tokenised by ``text`` (``trak_dist.serve._text``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

Item = tuple[torch.Tensor, ...] | dict[str, torch.Tensor]
FIELDS = ("targets", "k")


class BadRequest(ValueError):
    """A request the service refuses: HTTP ``status`` and one line saying why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class TextEncoder(Protocol):
    def describe(self) -> str: ...

    def encode(self, raw: Any, where: str) -> dict[str, torch.Tensor]: ...


def is_text(raw: Any) -> bool:
    """Whether a target is raw text (a string or a record) rather than token fields."""
    return isinstance(raw, str) or (isinstance(raw, dict) and "input_ids" not in raw)


@dataclass(frozen=True)
class Query:
    targets: list[Item]
    k: int


def _fields(item: Any) -> dict[str, torch.Tensor]:
    if isinstance(item, Mapping):
        return {str(k): torch.as_tensor(v) for k, v in item.items()}
    if isinstance(item, (tuple, list)):
        return {str(i): torch.as_tensor(v) for i, v in enumerate(item)}
    return {"0": torch.as_tensor(item)}


class RequestParser:
    """Turns request bodies into typed target items shaped like ``template``.

    Args:
        template: one item of the target set (or the train set).
        train_size: n, the largest meaningful k.
        max_targets: most targets per request.
        max_k: largest k accepted (at most n).
        text: text jobs: tokenises raw-text targets (None: token fields only).
    """

    def __init__(
        self,
        template: Any,
        train_size: int,
        max_targets: int,
        max_k: int,
        text: TextEncoder | None = None,
    ) -> None:
        self.text = text
        self.train_size = train_size
        self.is_dict = isinstance(template, Mapping)
        self.fields = _fields(template)
        self.max_targets = max_targets
        self.max_k = min(max_k, train_size)
        example = {k: v.tolist() for k, v in self.fields.items()}
        self.example = example if self.is_dict else list(example.values())

    def describe(self) -> str:
        """The expected target format, for error messages and the page."""
        parts = [
            f"{name}: {str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
            for name, t in self.fields.items()
        ]
        kind = "an object with fields" if self.is_dict else "a list of fields"
        tokens = f"{kind} ({', '.join(parts)})"
        return tokens if self.text is None else f"{self.text.describe()}: {tokens}"

    def parse(self, body: Any) -> Query:
        """Raises BadRequest naming the first thing wrong."""
        if not isinstance(body, dict):
            raise BadRequest(
                f"the body is a JSON {type(body).__name__}; expected an object "
                '{"targets": [...], "k": 10}.'
            )
        unknown = sorted(set(body) - set(FIELDS))
        if unknown:
            raise BadRequest(f"unknown field(s) {unknown}; expected only {list(FIELDS)}.")
        if "targets" not in body:
            raise BadRequest('missing field "targets": a list of targets, each ' + self.describe())
        k = body.get("k", 10)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.max_k:
            raise BadRequest(f"k={k!r}; expected an integer in [1, {self.max_k}].")
        targets = body["targets"]
        if not isinstance(targets, list) or not targets:
            raise BadRequest(f"targets={_short(targets)}; expected a non-empty list of targets.")
        if len(targets) > self.max_targets:
            raise BadRequest(
                f"{len(targets)} targets in one request; at most serve.max_targets="
                f"{self.max_targets}. Split the request.",
                413,
            )
        return Query([self.item(t, f"targets[{i}]") for i, t in enumerate(targets)], k)

    def parse_explain(self, body: Any, max_explain: int) -> tuple[Item, list[int]]:
        """A ``POST /explain`` body ``{"target": ..., "train": [index, ...]}``: the target
        and the train indices (BadRequest names the first thing wrong)."""
        if not isinstance(body, dict):
            raise BadRequest(
                f"the body is a JSON {type(body).__name__}; expected an object "
                '{"target": ..., "train": [index, ...]}.'
            )
        unknown = sorted(set(body) - {"target", "train"})
        if unknown or "target" not in body or "train" not in body:
            raise BadRequest(
                f"fields {sorted(body)}; expected exactly ['target', 'train'] (one target, "
                "a list of train indices)."
            )
        train = body["train"]
        if (
            not isinstance(train, list)
            or not 1 <= len(train) <= max_explain
            or any(isinstance(i, bool) or not isinstance(i, int) for i in train)
            or any(not 0 <= i < self.train_size for i in train)
        ):
            raise BadRequest(
                f"train={_short(train)}; expected a list of 1 to serve.max_explain={max_explain} "
                f"train indices in [0, {self.train_size})."
            )
        return self.item(body["target"], "target"), list(train)

    def item(self, raw: Any, where: str) -> Item:
        """One target (raw text in a text job, else the task's fields); BadRequest if bad."""
        if self.text is not None and is_text(raw):
            return self.text.encode(raw, where)
        if self.is_dict:
            if not isinstance(raw, dict):
                raise BadRequest(f"{where} is {_short(raw)}; expected {self.describe()}.")
            names = set(raw)
            if names != set(self.fields):
                raise BadRequest(
                    f"{where} has fields {sorted(names)}; expected {sorted(self.fields)}."
                )
            values = {name: self._field(raw[name], name, f"{where}.{name}") for name in raw}
            self._same_length(values, where)
            return {name: values[name] for name in self.fields}
        if not isinstance(raw, list) or len(raw) != len(self.fields):
            raise BadRequest(f"{where} is {_short(raw)}; expected {self.describe()}.")
        values = {
            name: self._field(v, name, f"{where}[{name}]")
            for name, v in zip(self.fields, raw, strict=True)
        }
        self._same_length(values, where)
        return tuple(values.values())

    def _field(self, raw: Any, name: str, where: str) -> torch.Tensor:
        like = self.fields[name]
        try:
            arr = np.asarray(raw, dtype=np.float64)
        except (ValueError, TypeError):
            raise BadRequest(
                f"{where} is {_short(raw)}: not a number or a rectangular nested list of numbers."
            ) from None
        if isinstance(raw, bool) or (arr.dtype == object):
            raise BadRequest(f"{where} is {_short(raw)}; expected numbers.")
        if not np.isfinite(arr).all():
            raise BadRequest(f"{where} holds NaN or infinity; expected finite numbers.")
        floating = like.is_floating_point()
        token_ids = not floating and like.dim() == 1
        if arr.ndim != like.dim() or (not token_ids and tuple(arr.shape) != tuple(like.shape)):
            raise BadRequest(
                f"{where} has shape {list(arr.shape)}; expected {list(like.shape)}"
                + (" (any length)" if token_ids else "")
                + f" ({str(like.dtype).removeprefix('torch.')})."
            )
        if token_ids and arr.shape[0] < 1:
            raise BadRequest(f"{where} is empty; expected at least one token id.")
        if not floating and not np.array_equal(arr, np.round(arr)):
            raise BadRequest(f"{where} holds non-integers; expected integers (e.g. a label).")
        if not floating and np.abs(arr).max(initial=0) > 2**53:
            raise BadRequest(f"{where} holds an integer beyond ±2**53.")
        return torch.as_tensor(arr).to(like.dtype)

    def _same_length(self, values: dict[str, torch.Tensor], where: str) -> None:
        lengths = {
            name: int(v.shape[0])
            for name, v in values.items()
            if not v.is_floating_point() and v.dim() == 1
        }
        if len(set(lengths.values())) > 1:
            raise BadRequest(f"{where}: its token fields differ in length ({lengths}).")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    if isinstance(value, float) and not math.isfinite(value):
        return text
    return text if len(text) <= limit else text[: limit - 3] + "..."
