"""Hugging Face checkpoint directories: which ones, whether they agree, and their weights.

A checkpoint is a directory written by ``save_pretrained``: a full model (``config.json`` and
safetensors weights) or a PEFT adapter (``adapter_config.json``, whose base model is named there
or given as ``model.base``), or a Hub name (``org/name@revision``, ``_hub.py``) that resolves to
one in the Hugging Face cache. Every checkpoint of a job must have the first one's architecture:
model_id k's features are compared with model_id 0's, so a different network is an error before
anything is written, not a shape error on a worker.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

from torch import Tensor

from trak_dist.errors import ConfigError
from trak_dist.hf._hub import is_hub_name, pin, resolve
from trak_dist.remote import is_url, local_copy

MODEL_FILE = "config.json"
ADAPTER_FILE = "adapter_config.json"
# config entries that name or describe a saved copy, not the network it holds
_VOLATILE = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "_commit_hash"}
_ADAPTER_KEYS = ("peft_type", "r", "target_modules", "modules_to_save", "task_type")


def is_hf_dir(path: Path) -> bool:
    """True for a directory holding a model's ``config.json`` or an adapter's config."""
    return path.is_dir() and ((path / MODEL_FILE).is_file() or (path / ADAPTER_FILE).is_file())


def is_adapter(path: Path) -> bool:
    return (path / ADAPTER_FILE).is_file()


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} cannot be read as JSON ({e}); save the checkpoint again.") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds {type(data).__name__}, not a JSON object.")
    return data


def expand(ref: Any) -> list[Path]:
    """``model.checkpoints`` (a list, one path, or a glob) → absolute paths, globs sorted; a
    URL → its local copy on this node (``trak_dist.remote.local_copy``); a Hub name → its
    snapshot in this node's Hugging Face cache (``_hub.resolve``)."""
    items = [ref] if isinstance(ref, (str, Path)) else list(ref)
    out: list[Path] = []
    for item in items:
        text = str(item)
        if is_url(text):
            out.append(local_copy(text, "model.checkpoints"))
        elif is_hub_name(item):
            out.append(resolve(text).path)
        elif glob.has_magic(text):
            found = sorted(glob.glob(text))
            if not found:
                raise ConfigError(f"model.checkpoints glob {text!r} matches nothing.")
            out += [Path(p) for p in found]
        else:
            out.append(Path(text))
    # absolute: workers may run in another working directory (or on another node)
    return [p.resolve() for p in out]


def absolute(ref: Any) -> list[str]:
    """``expand`` as strings (a config value that pickles and prints plainly); URLs stay URLs
    (each node reads its own copy), Hub names become ``org/name@<commit>`` (each node loads
    that commit)."""
    items = [ref] if isinstance(ref, (str, Path)) else list(ref)
    out: list[str] = []
    for item in items:
        if is_url(item):
            out.append(str(item).rstrip("/"))
        elif is_hub_name(item):
            out.append(pin(item))
        else:
            out += [str(p) for p in expand(item)]
    return out


def pinned_base(checkpoints: Any, base: str | None) -> str | None:
    """``model.base`` for the workers: absolute, or pinned to its commit where it (or, with no
    ``model.base``, the base an adapter's ``adapter_config.json`` names) is a Hub name."""
    if base is not None:
        return absolute(base)[0]
    items = [checkpoints] if isinstance(checkpoints, (str, Path)) else list(checkpoints)
    first = expand(items[0])[0] if items else None
    if first is None or not is_adapter(first):
        return None
    named = read_json(first / ADAPTER_FILE).get("base_model_name_or_path")
    return pin(named, "the adapter's base model") if is_hub_name(named) else None


def base_dir(adapter: Path, base: str | None) -> Path:
    """The base model directory of an adapter: ``model.base`` or the adapter's own record."""
    named = base or read_json(adapter / ADAPTER_FILE).get("base_model_name_or_path")
    if not named:
        raise ConfigError(
            f"adapter {adapter} names no base model (adapter_config.json has no "
            "base_model_name_or_path); give it as model.base=DIR."
        )
    if is_hub_name(named):
        return resolve(named, "the base model").path
    path = Path(named).expanduser().resolve()
    if not (path / MODEL_FILE).is_file():
        raise ConfigError(
            f"the base model of adapter {adapter} is {named!r}, which is neither a local model "
            "directory with config.json nor a Hub name (org/name[@revision]); give it as "
            "model.base=DIR or model.base=org/name@revision."
        )
    return path


def model_dir(first: Path, base: str | None) -> Path:
    """The directory whose ``config.json`` describes the network (the base for an adapter)."""
    return base_dir(first, base) if is_adapter(first) else first


def _signature(path: Path) -> dict[str, Any]:
    if is_adapter(path):
        cfg = read_json(path / ADAPTER_FILE)
        return {"adapter": {k: _canon(cfg.get(k)) for k in _ADAPTER_KEYS}}
    cfg = read_json(path / MODEL_FILE)
    return {k: v for k, v in cfg.items() if k not in _VOLATILE}


def _canon(value: Any) -> Any:
    return sorted(value) if isinstance(value, list) else value


def check_dirs(paths: list[Path], base: str | None = None) -> None:
    """Every path is a checkpoint directory with the first one's architecture (and, for
    adapters, the same adapter layout and base).

    Raises:
        ConfigError: naming the first directory that differs and the first entry that does.
    """
    bad = [str(p) for p in paths if not is_hf_dir(p)]
    if bad:
        raise ConfigError(
            f"checkpoint directories not found or not Hugging Face checkpoints (no {MODEL_FILE} "
            f"or {ADAPTER_FILE}): {bad}. Give directories written by save_pretrained."
        )
    first = _signature(paths[0])
    for p in paths[1:]:
        sig = _signature(p)
        if sig == first:
            continue
        keys = sorted(set(first) | set(sig), key=str)
        key = next(k for k in keys if first.get(k) != sig.get(k))
        raise ConfigError(
            f"checkpoint {p} is not the same architecture as the first, {paths[0]}: {key!r} is "
            f"{sig.get(key)!r} there and {first.get(key)!r} in the first. Every checkpoint of a "
            "job must be the same network; attribute the other ones in a job of their own."
        )
    if is_adapter(paths[0]) and base is None:
        bases = {str(read_json(p / ADAPTER_FILE).get("base_model_name_or_path")) for p in paths}
        if len(bases) > 1:
            raise ConfigError(
                f"the adapters name different base models {sorted(bases)}; attribute adapters "
                "of one base in a job, or give model.base=DIR."
            )


def load_state(path: Path) -> dict[str, Tensor]:
    """A checkpoint directory's weights: the full model's state dict, or an adapter's own
    weights as saved (the adapter model's ``load_state_dict`` places them)."""
    if is_adapter(path):
        from peft.utils import load_peft_weights

        return dict(load_peft_weights(str(path), device="cpu"))
    from trak_dist.hf._model import load_pretrained

    return load_pretrained(path, "float32", False).state_dict()
