"""Rows of text → token ids and labels, one mode per table (the columns present pick it).

Modes (``ROLES`` names the columns each needs; ``data.text.columns`` renames them):

- ``text``: causal LM on a ``text`` column; every token counts.
- ``prompt_completion``: causal LM on ``prompt`` + ``completion``; prompt tokens get label -100.
- ``messages``: causal LM on a chat rendered with the tokenizer's chat template; only the
  assistant turns' tokens count.
- ``classification``: ``text`` (and optionally ``text_pair``) with a ``label`` (an id, or a
  name mapped through the model config's ``label2id``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trak_dist.errors import ConfigError, DataError

IGNORE_INDEX = -100
ROLES = {
    "messages": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    "classification": ("text", "label"),
    "text": ("text",),
}


@dataclass(frozen=True)
class Encoded:
    """One row: ``ids`` and per-token ``labels`` (causal) or a class ``label``, and the token
    count before truncation."""

    ids: list[int]
    labels: list[int] | None
    label: int | None
    type_ids: list[int] | None
    length: int


def pick_mode(columns: list[str], names: dict[str, str], task: str, what: str) -> str:
    """The mode the columns ask for (``names``: role → column)."""
    have = set(columns)
    order = ["classification"] if task == "text_classification" else []
    order += ["messages", "prompt_completion", "text"] if task != "text_classification" else []
    for mode in order:
        if all(names.get(r, r) in have for r in ROLES[mode]):
            return mode
    wanted = " or ".join("+".join(repr(names.get(r, r)) for r in ROLES[m]) for m in order)
    raise DataError(
        f"{what}: no column for task {task}: expected {wanted}; the file has columns "
        f"{sorted(have)}. Rename them, or map them with data.text.columns.ROLE=NAME."
    )


class Tokenise:
    """Encodes the rows of one mode with a tokenizer.

    Args:
        tokenizer: a ``PreTrainedTokenizerFast``.
        mode: one of ``ROLES``.
        names: role → column name.
        label2id: the model config's label names (classification).
    """

    def __init__(
        self, tokenizer: Any, mode: str, names: dict[str, str], label2id: dict[str, int]
    ) -> None:
        self.tok = tokenizer
        self.mode = mode
        self.names = names
        self.label2id = label2id

    def col(self, row: dict[str, Any], role: str, i: int, what: str) -> Any:
        value = row.get(self.names.get(role, role))
        if role == "text_pair" and value is None:
            return None
        if role in ("text", "prompt", "completion", "text_pair") and (
            not isinstance(value, str) or not value.strip()
        ):
            raise DataError(
                f"{what}: row {i} has an empty or missing {self.names.get(role, role)!r} "
                f"(got {value!r}); every row needs text there."
            )
        return value

    def __call__(self, row: dict[str, Any], i: int, what: str) -> Encoded:
        if self.mode == "text":
            ids = self._ids(self.col(row, "text", i, what), True)
            return Encoded(ids, list(ids), None, None, len(ids))
        if self.mode == "prompt_completion":
            p = self._ids(self.col(row, "prompt", i, what), True)
            c = self._ids(self.col(row, "completion", i, what), False)
            ids = p + c
            return Encoded(ids, [IGNORE_INDEX] * len(p) + c, None, None, len(ids))
        if self.mode == "messages":
            return self._chat(row, i, what)
        return self._classify(row, i, what)

    def _ids(self, text: str, special: bool) -> list[int]:
        return list(self.tok(text, add_special_tokens=special)["input_ids"])

    def _chat(self, row: dict[str, Any], i: int, what: str) -> Encoded:
        messages = row.get(self.names.get("messages", "messages"))
        if not isinstance(messages, list) or not messages:
            raise DataError(f"{what}: row {i} has no messages (got {messages!r}).")
        if getattr(self.tok, "chat_template", None) is None:
            raise ConfigError(
                f"{what}: a 'messages' column needs a tokenizer with a chat template; this one "
                "has none (set tokenizer.chat_template and save it, or use prompt/completion)."
            )

        def render(msgs: list[Any], gen: bool) -> str:
            return str(
                self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            )

        full = render(messages, False)
        spans = []
        for k, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            start, end = render(messages[:k], True), render(messages[: k + 1], False)
            if not (full.startswith(start) and full.startswith(end)):
                raise DataError(
                    f"{what}: row {i}: the chat template does not render a conversation's "
                    "prefix as a prefix of it, so the assistant turns cannot be located."
                )
            spans.append((len(start), len(end)))
        if not spans:
            raise DataError(f"{what}: row {i} has no assistant turn; nothing would count.")
        enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        labels = [
            t if any(s <= a < e for s, e in spans) else IGNORE_INDEX
            for t, (a, _) in zip(ids, enc["offset_mapping"], strict=True)
        ]
        return Encoded(ids, labels, None, None, len(ids))

    def _classify(self, row: dict[str, Any], i: int, what: str) -> Encoded:
        text = self.col(row, "text", i, what)
        pair = self.col(row, "text_pair", i, what)
        enc = self.tok(text, pair) if pair is not None else self.tok(text)
        raw = row.get(self.names.get("label", "label"))
        if isinstance(raw, str):
            if raw not in self.label2id:
                raise DataError(
                    f"{what}: row {i} has label {raw!r}, which is not among the model's "
                    f"label2id names {sorted(self.label2id)}."
                )
            label = self.label2id[raw]
        elif isinstance(raw, int) and not isinstance(raw, bool):
            label = raw
        else:
            raise DataError(f"{what}: row {i} has label {raw!r}; expected a class id or name.")
        ids = list(enc["input_ids"])
        types = list(enc["token_type_ids"]) if "token_type_ids" in enc else None
        return Encoded(ids, None, label, types, len(ids))
