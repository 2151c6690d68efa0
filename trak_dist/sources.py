"""Turn the config's import paths (or objects) into models, datasets, checkpoints and batches."""

from __future__ import annotations

import glob
import importlib
import pickle
import socket
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from trak_dist.batches import batch_of as batch_of  # re-exported: workers' import
from trak_dist.errors import ConfigError
from trak_dist.failures import gist
from trak_dist.remote import is_url, local_copy


def load_object(ref: Any, what: str) -> Any:
    """``"package.module:name"`` → the named object; anything else is returned as it is."""
    if not isinstance(ref, str):
        return ref
    module, sep, name = ref.partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"{what}={ref!r} is not an import path; expected 'package.module:name'.")
    try:
        obj = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"{what}={ref!r} could not be imported ({e}). The module must be importable on the "
            "driver and every worker (installed, or under the working directory)."
        ) from e
    return obj


def call(ref: Any, what: str, kwargs: dict[str, Any] | None = None) -> Any:
    fn = load_object(ref, what)
    if not callable(fn):
        raise ConfigError(f"{what}={ref!r} is not callable.")
    return fn(**(kwargs or {}))


def build_model(factory: Any, kwargs: dict[str, Any]) -> nn.Module:
    model = call(factory, "model.factory", kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.factory returned {type(model).__name__}, not a torch nn.Module.")
    return model


def checkpoint_paths(ref: Any) -> list[Path | str]:
    """The checkpoints: a list of paths, or a callable / import path that returns one. A path
    is a state-dict file, or a Hugging Face model / PEFT adapter directory (globs expand; every
    directory must be the first one's architecture, see ``trak_dist.hf``), or a Hub name
    (``org/name@revision``: its snapshot in this node's Hugging Face cache). URLs
    (``s3://…``) stay URLs: each process reads its node's copy (``trak_dist.remote.local_copy``)."""
    paths = call(ref, "model.checkpoints") if _is_provider(ref) else ref
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if any(is_url(p) for p in paths):
        local = [local_copy(p, "model.checkpoints") for p in paths]
        if any(p.is_dir() for p in local):
            from trak_dist.hf import check_dirs

            check_dirs(local)
        return [str(p).rstrip("/") if is_url(p) else Path(p).resolve() for p in paths]
    if any(Path(p).is_dir() or glob.has_magic(str(p)) or _is_hub_name(p) for p in paths):
        from trak_dist.hf import check_dirs, expand

        dirs = expand(paths)
        check_dirs(dirs)
        return list(dirs)
    # absolute: workers may run in another working directory (or on another node)
    out = [Path(p).resolve() for p in paths]
    if not out:
        raise ConfigError("model.checkpoints is empty; give at least one state-dict file.")
    missing = [str(p) for p in out if not p.is_file()]
    if missing:
        raise ConfigError(f"checkpoint files not found: {missing}.")
    return list(out)


def _is_provider(ref: Any) -> bool:
    """A callable, or the import path of one, that returns the checkpoints."""
    return callable(ref) or (
        isinstance(ref, str) and ":" in ref and not is_url(ref) and not Path(ref).exists()
    )


def _is_hub_name(item: Any) -> bool:
    """A Hugging Face Hub name (``trak_dist.hf.is_hub_name``); the hf extra is imported only for
    a string that is no local path."""
    if not isinstance(item, str) or is_url(item) or Path(item).exists():
        return False
    from trak_dist.hf import is_hub_name

    return is_hub_name(item)


def node_checkpoints(ref: Any, paths: Sequence[Path | str]) -> list[Path | str]:
    """``paths`` (the driver's ``checkpoint_paths(ref)``) as this process's node sees them.

    On a cluster without shared storage, a file on the driver's disk is missing elsewhere. A
    callable ``ref`` (the bundled examples train theirs on first use) is then called here, for
    this node's own copies, and so are Hub names (pinned to their commits by the driver): the
    store's checkpoint fingerprints check that they hold the same bytes. A plain path is an
    error saying what to give instead.

    Raises:
        ConfigError: a checkpoint path that is not on this node.
    """
    missing = [str(p) for p in paths if not is_url(p) and not Path(p).exists()]
    if not missing:
        return list(paths)
    names = [ref] if isinstance(ref, str) else ref if isinstance(ref, Sequence) else []
    if _is_provider(ref) or any(_is_hub_name(p) for p in names):
        # Hub names are pinned to commits by then (pipeline.resolve_inputs): this node's
        # snapshot of the same commit, downloaded if the cache lacks it
        return checkpoint_paths(ref)
    raise ConfigError(
        f"checkpoints {missing} are not on node {socket.gethostname()}: on a cluster, give "
        "model.checkpoints as object storage URLs (s3://…, gs://…) or as paths that every node "
        "mounts at the same place."
    )


def load_state_dict(path: Path | str, device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """Weights only (``weights_only=True``: no code from the file runs).

    A Hugging Face checkpoint directory gives its weights (``trak_dist.hf.load_state``); a URL,
    its local copy's.

    Raises:
        ConfigError: the file is truncated, corrupt, or holds more than tensors.
    """
    path = local_copy(path, "model.checkpoints")
    if path.is_dir():
        from trak_dist.hf import load_state

        return {k: v.to(device) for k, v in load_state(Path(path)).items()}
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise  # the path, not the file's content: failures.describe says so
    except (
        pickle.UnpicklingError,
        EOFError,
        RuntimeError,
        ValueError,
        OSError,  # a truncated zip archive can fail its seek with EINVAL
        zipfile.BadZipFile,
    ) as e:
        raise ConfigError(
            f"checkpoint {path} could not be loaded ({gist(e)}). It is truncated or corrupt, or "
            "holds more than a state dict (weights-only loading refuses code): save it again "
            "with torch.save(model.state_dict(), path)."
        ) from e
    if not isinstance(state, dict):
        raise ConfigError(f"{path} does not hold a state dict (found {type(state).__name__}).")
    return state


def build_dataset(ref: Any, kwargs: dict[str, Any], what: str) -> Any:
    ds = load_object(ref, what)
    if callable(ds) and not hasattr(ds, "__getitem__"):
        ds = ds(**kwargs)
    if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
        raise ConfigError(
            f"{what} gave {type(ds).__name__}; expected a map-style dataset (__len__ and "
            "__getitem__ returning a tuple of tensors)."
        )
    return ds
