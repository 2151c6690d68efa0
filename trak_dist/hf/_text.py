"""``data=text``: a data file becomes a map-style dataset of token tensors.

``text_sources`` turns ``data.train`` / ``data.targets`` (file paths) into ``TextSource``
objects, which ``sources.build_dataset`` calls like any dataset factory, on the driver and on
every worker. Rows keep the file's order (row i of the store is row i of the file), and each
dataset is padded on the right to its own longest row, not to ``max_length``: the padding
width must not depend on how rows are batched, because a row's stored hash (and the dataset
fingerprint) is taken from its padded tensors. The featuriser groups rows by length and skips
that padding in its passes (``trak_dist._padding``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from trak_dist.errors import ConfigError, DataError
from trak_dist.hf._checkpoints import MODEL_FILE, expand, is_adapter, model_dir, read_json
from trak_dist.hf._rows import read_rows
from trak_dist.hf._tokenize import IGNORE_INDEX, Encoded, Tokenise, pick_mode
from trak_dist.remote import is_url

if TYPE_CHECKING:
    from trak_dist.config import DataConfig, ModelConfig, TextConfig

logger = logging.getLogger(__name__)
# model=hf's factory, as trak_dist.config names it (derived here: config imports this package
# lazily, so importing config back would make a cycle)
HF_FACTORY = f"{__name__.rpartition('.')[0]}:from_checkpoints"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class TextDataset(Dataset):
    """Token rows as dicts of tensors ``{input_ids, attention_mask, labels}`` (each ``[T]``;
    ``labels`` ``[]`` for classification, plus ``token_type_ids`` where the tokenizer makes
    them)."""

    def __init__(self, tensors: dict[str, Tensor], tokenizer: Any, mode: str) -> None:
        self.tensors = tensors
        self.tokenizer = tokenizer
        self.mode = mode

    def __len__(self) -> int:
        return int(self.tensors["input_ids"].shape[0])

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {k: v[i] for k, v in self.tensors.items()}

    def decode(self, i: int) -> str:
        """Row i's real tokens as text (special tokens dropped)."""
        ids = self.tensors["input_ids"][i][self.tensors["attention_mask"][i].bool()]
        return str(self.tokenizer.decode(ids.tolist(), skip_special_tokens=True))


@dataclass(frozen=True)
class TextSource:
    """A data file and how to tokenise it; calling it builds the ``TextDataset``."""

    path: str
    what: str
    text: TextConfig
    checkpoints: Any
    base: str | None
    task: str

    def __call__(self, **_: Any) -> TextDataset:
        encoding = self.encoding()
        rows = read_rows(self.path, self.what)
        mode = pick_mode(list(rows.column_names), encoding.names, self.task, self.what)
        return encoding.dataset(rows, mode, self.what)

    def encoding(self) -> Encoding:
        """The checkpoint's tokenizer and the job's ``data.text`` rules (``trak-dist serve``
        tokenises raw-text targets with it, exactly as the job tokenised its rows)."""
        first = expand(self.checkpoints)[0]
        tokenizer = load_tokenizer(self.text.tokenizer, first, self.base)
        config = read_json(model_dir(first, self.base) / MODEL_FILE)
        check_vocabulary(tokenizer, config, self.what)
        return Encoding(
            tokenizer,
            dict(self.text.columns),
            dict(config.get("label2id") or {}),
            self.text.max_length or _positions(config),
            self.text.truncate,
            int(config.get("vocab_size") or len(tokenizer)),
            self.task,
        )


@dataclass(frozen=True)
class Encoding:
    """How rows of text become token rows: the tokenizer, column names (role → column), label
    names, ``max_length`` (None: no limit) and ``truncate``, the model's vocabulary size."""

    tokenizer: Any
    names: dict[str, str]
    label2id: dict[str, int]
    limit: int | None
    truncate: bool
    vocab: int
    task: str

    def dataset(self, rows: Any, mode: str, what: str) -> TextDataset:
        """``rows`` (dicts of columns, all of one ``mode``) tokenised, cut or refused at
        ``limit``, and padded on the right to the longest.

        Raises:
            DataError: an empty text, a row longer than ``limit`` (without ``truncate``), a
                row with no token to predict, a token outside the vocabulary.
        """
        encode = Tokenise(self.tokenizer, mode, self.names, self.label2id)
        encoded = [encode(row, i, what) for i, row in enumerate(rows)]
        encoded = _fit(encoded, self.limit, self.truncate, what)
        top = max(max(e.ids) for e in encoded)
        if top >= self.vocab:
            raise DataError(
                f"{what}: token id {top} is outside the model's vocabulary of {self.vocab}; the "
                "tokenizer does not belong to this model (give the right one as "
                "data.text.tokenizer=DIR)."
            )
        return TextDataset(_pad(encoded, _pad_id(self.tokenizer)), self.tokenizer, mode)


def load_tokenizer(named: str | None, first: Path, base: str | None) -> Any:
    """``data.text.tokenizer``, else the first checkpoint's, else (adapters) its base's."""
    from transformers import AutoTokenizer

    if named is not None:
        where = Path(named).expanduser().resolve()
    elif any((first / f).is_file() for f in _TOKENIZER_FILES) or not is_adapter(first):
        where = first
    else:
        where = model_dir(first, base)
    if not any((where / f).is_file() for f in _TOKENIZER_FILES):
        raise ConfigError(
            f"no tokenizer in {where} (no {' or '.join(_TOKENIZER_FILES)}); save it there with "
            "tokenizer.save_pretrained, or give data.text.tokenizer=DIR."
        )
    return AutoTokenizer.from_pretrained(str(where), trust_remote_code=False)


def check_vocabulary(tokenizer: Any, config: dict[str, Any], what: str) -> None:
    vocab = config.get("vocab_size")
    if vocab is not None and len(tokenizer) > int(vocab):
        raise ConfigError(
            f"{what}: the tokenizer has {len(tokenizer)} tokens but the model's vocabulary is "
            f"{vocab}; it is not this model's tokenizer (give the right one as "
            "data.text.tokenizer=DIR)."
        )


def _positions(config: dict[str, Any]) -> int | None:
    for key in ("max_position_embeddings", "n_positions"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


def _fit(encoded: list[Encoded], limit: int | None, truncate: bool, what: str) -> list[Encoded]:
    """Rows cut to ``limit`` tokens (counted and logged), or an error naming the long ones."""
    if limit is not None:
        long = [i for i, e in enumerate(encoded) if e.length > limit]
        if long and not truncate:
            worst = max(encoded[i].length for i in long)
            raise DataError(
                f"{what}: {len(long)} row(s) are longer than max_length={limit} tokens (rows "
                f"{long[:5]}{' …' if len(long) > 5 else ''}, longest {worst}); raise "
                "data.text.max_length or cut them with data.text.truncate=true."
            )
        if long:
            cut = sum(encoded[i].length - limit for i in long)
            logger.warning(
                "%s: %d of %d rows truncated to max_length=%d tokens (%d tokens dropped, rows "
                "%s%s)",
                what,
                len(long),
                len(encoded),
                limit,
                cut,
                long[:5],
                " …" if len(long) > 5 else "",
            )
            encoded = [_cut(e, limit) for e in encoded]
    for i, e in enumerate(encoded):
        if e.labels is not None and all(t == IGNORE_INDEX for t in e.labels[1:]):
            raise DataError(
                f"{what}: row {i} has no token to predict ({e.length} tokens, none counted "
                "after the first); it needs text (or a completion) of at least one token."
            )
    return encoded


def _cut(e: Encoded, limit: int) -> Encoded:
    return dataclasses.replace(
        e,
        ids=e.ids[:limit],
        labels=None if e.labels is None else e.labels[:limit],
        type_ids=None if e.type_ids is None else e.type_ids[:limit],
    )


def _pad_id(tokenizer: Any) -> int:
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if value is not None:
            return int(value)
    return 0


def _pad(encoded: list[Encoded], pad_id: int) -> dict[str, Tensor]:
    width = max(len(e.ids) for e in encoded)
    n = len(encoded)
    ids = torch.full((n, width), pad_id, dtype=torch.int64)
    mask = torch.zeros((n, width), dtype=torch.int64)
    out = {"input_ids": ids, "attention_mask": mask}
    if encoded[0].labels is not None:
        out["labels"] = torch.full((n, width), IGNORE_INDEX, dtype=torch.int64)
    else:
        out["labels"] = torch.tensor([e.label for e in encoded], dtype=torch.int64)
    if encoded[0].type_ids is not None:
        out["token_type_ids"] = torch.zeros((n, width), dtype=torch.int64)
    for i, e in enumerate(encoded):
        k = len(e.ids)
        ids[i, :k] = torch.tensor(e.ids)
        mask[i, :k] = 1
        if e.labels is not None:
            out["labels"][i, :k] = torch.tensor(e.labels)
        if e.type_ids is not None:
            out["token_type_ids"][i, :k] = torch.tensor(e.type_ids)
    return out


def text_sources(data: DataConfig, model: ModelConfig, task: Any) -> DataConfig:
    """``data`` with its train and target paths as ``TextSource`` objects (``data=text``)."""
    if not isinstance(task, str):
        raise ConfigError(
            "data=text tokenises for a named task (causal_lm or text_classification); got "
            f"task.name={task!r}."
        )

    if model.factory != HF_FACTORY:
        raise ConfigError(
            "data=text tokenises with a Hugging Face checkpoint's tokenizer and reads its "
            f"config (vocabulary, label names); it needs model=hf, got model.factory="
            f"{model.factory!r}."
        )
    text = data.text
    if text.tokenizer is not None:  # absolute on the driver: workers may run elsewhere
        text = dataclasses.replace(text, tokenizer=str(Path(text.tokenizer).expanduser().resolve()))

    def source(ref: Any, what: str) -> Any:
        if isinstance(ref, TextSource) or not isinstance(ref, (str, Path)):
            return ref
        return TextSource(
            str(ref).rstrip("/") if is_url(ref) else str(Path(ref).expanduser().resolve()),
            what,
            text,
            model.kwargs["checkpoints"],
            model.kwargs["base"],
            task,
        )

    return dataclasses.replace(
        data, train=source(data.train, "data.train"), targets=source(data.targets, "data.targets")
    )
