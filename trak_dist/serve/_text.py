"""Text jobs (``data=text``): raw-text targets, and the train examples' text in replies.

A raw-text target is one record of the job's own data format: a string (the ``text`` column),
or an object with the data file's columns (``{"text": ...}``, ``{"prompt": ..., "completion":
...}``, ``{"messages": [...]}``, ``{"text": ..., "label": ...}`` for classification; renamed as
``data.text.columns`` renames them). It is tokenised by the job's own ``Encoding`` (the
checkpoint's tokenizer, the prompt mask, ``data.text.max_length`` and ``truncate``), so it gives
exactly the token row the batch job made of the same record in its data file.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from trak_dist.errors import ConfigError, DataError
from trak_dist.hf import ROLES, TextSource, pick_mode
from trak_dist.serve._request import BadRequest, _short


class TextTargets:
    """Tokenises raw-text targets as the batch job tokenised its rows.

    Args:
        source: the job's ``data.targets`` (or ``data.train``) ``TextSource``.
    """

    def __init__(self, source: TextSource) -> None:
        self.encoding = source.encoding()
        self.task = source.task
        names = self.encoding.names
        modes = (
            ["classification"]
            if self.task == "text_classification"
            else ["messages", "prompt_completion", "text"]
        )
        # the columns the task reads (a label in a causal-LM target is a mistake, not ignored)
        roles = {r for m in modes for r in ROLES[m]} | (
            {"text_pair"} if self.task == "text_classification" else set()
        )
        self.columns = {names.get(role, role) for role in roles}
        self.formats = " or ".join(
            "{" + ", ".join(f'"{names.get(r, r)}": ...' for r in ROLES[m]) + "}" for m in modes
        )

    def describe(self) -> str:
        if self.task == "text_classification":
            return f"a record {self.formats} (or token fields)"
        return f"a string, or a record {self.formats} (or token fields)"

    def encode(self, raw: Any, where: str) -> dict[str, Tensor]:
        """The token row of one target (``[T]`` tensors, no padding).

        Raises:
            BadRequest: not a string or record of the job's columns, empty text, a text longer
                than ``data.text.max_length`` tokens (unless the job truncates).
        """
        row = {self.encoding.names.get("text", "text"): raw} if isinstance(raw, str) else raw
        unknown = sorted(set(row) - self.columns)
        if unknown:
            raise BadRequest(
                f"{where} has field(s) {unknown}; expected {self.describe()}, with the job's "
                "data.text columns."
            )
        try:
            mode = pick_mode(list(row), self.encoding.names, self.task, where)
        except DataError:
            raise BadRequest(f"{where} is {_short(raw)}; expected {self.describe()}.") from None
        messages = row.get(self.encoding.names.get("messages", "messages"))
        if mode == "messages" and not (
            isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
        ):
            raise BadRequest(
                f"{where}: messages is {_short(messages)}; expected a list of objects."
            )
        try:
            # the job's own path: Tokenise, the prompt mask, max_length/truncate, the vocabulary
            rows = self.encoding.dataset([row], mode, where)
        except (DataError, ConfigError) as e:
            raise BadRequest(str(e).replace(f"{where}: row 0 ", f"{where} ", 1)) from None
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise BadRequest(f"{where} could not be tokenised ({e}).") from None
        return rows[0]


def train_text(train: Any, index: int, limit: int) -> str:
    """Train example ``index`` as text (its real tokens decoded), cut to ``limit`` characters."""
    text = str(train.decode(index))
    return text if len(text) <= limit else text[: limit - 1] + "…"
