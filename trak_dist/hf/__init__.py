"""Hugging Face checkpoints and text data from the command line (``model=hf``, ``data=text``).

- ``from_checkpoints``: the ``model=hf`` factory (model or PEFT adapter directories, or Hub
  names ``org/name@revision`` resolved into the Hugging Face cache: ``resolve``, ``pin``).
- ``text_sources`` / ``TextSource``: JSONL/JSON, CSV, Parquet or ``save_to_disk`` tables,
  tokenised with the checkpoint's tokenizer.
"""

from trak_dist.hf._checkpoints import (
    absolute,
    check_dirs,
    expand,
    is_hf_dir,
    load_state,
    pinned_base,
)
from trak_dist.hf._hub import HubSnapshot, is_hub_name, pin, resolve
from trak_dist.hf._model import AdapterModel, from_checkpoints, load_pretrained
from trak_dist.hf._text import Encoding, TextDataset, TextSource, text_sources
from trak_dist.hf._tokenize import ROLES, pick_mode

__all__ = [
    "ROLES",
    "AdapterModel",
    "Encoding",
    "HubSnapshot",
    "TextDataset",
    "TextSource",
    "absolute",
    "check_dirs",
    "expand",
    "from_checkpoints",
    "is_hf_dir",
    "is_hub_name",
    "load_pretrained",
    "load_state",
    "pick_mode",
    "pin",
    "pinned_base",
    "resolve",
    "text_sources",
]
