"""Checkpoints named on the Hugging Face Hub: ``org/name`` or ``org/name@revision`` (a branch,
tag or commit), resolved as ``from_pretrained`` resolves them, into a snapshot directory of the
Hub's cache that the rest of the package reads as any checkpoint directory.

huggingface_hub does the work, so its cache (``HF_HOME``, ``HF_HUB_CACHE``), ``HF_HUB_OFFLINE``
(the cache only) and its token (``HF_TOKEN`` or ``hf auth login``'s, never printed) apply. A
name is a Hub name only where no local path of that name exists. The driver pins every name to
its commit (``pin``), so that every node loads the same bits, whatever a branch points to later;
the store's checkpoint fingerprint hashes the snapshot's files, so a branch moved to other
weights is another checkpoint, never one whose features are reused.
"""

from __future__ import annotations

import glob
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trak_dist.errors import ConfigError
from trak_dist.failures import gist
from trak_dist.remote import is_url

logger = logging.getLogger(__name__)

# huggingface_hub's repo id rule (namespace/name, letters, digits, - _ .); the revision may
# hold "/" (refs/pr/1)
_NAME = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^\s@]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# a missing state-dict file (ckpts/c0.pt) keeps its own error, not a Hub look-up
_FILE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".safetensors")
# what loading needs (config, safetensors weights, tokenizer, an adapter, remote code), not a
# repository's other formats (pytorch_model.bin, flax, onnx, gguf): the same set on every node,
# so that their snapshots hold the same files and fingerprint alike
ALLOW = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.py"]


@dataclass(frozen=True)
class HubSnapshot:
    """A Hub name resolved on this node: ``path`` is ``…/snapshots/<commit>``."""

    name: str
    repo: str
    commit: str
    path: Path

    @property
    def pinned(self) -> str:
        """``org/name@<commit>``: the same bits on every node."""
        return f"{self.repo}@{self.commit}"


def is_hub_name(item: Any) -> bool:
    """True for a string ``org/name`` or ``org/name@revision`` that is no existing local path
    (a path that exists wins; a ``Path`` is always a path) nor a checkpoint file's name."""
    if not isinstance(item, str) or is_url(item) or glob.has_magic(item):
        return False
    match = _NAME.match(item)
    if match is None or match["repo"].lower().endswith(_FILE_SUFFIXES):
        return False
    return not Path(item).expanduser().exists()


def resolve(name: str, what: str = "model.checkpoints") -> HubSnapshot:
    """The snapshot directory and commit of the Hub name ``name``, from the cache or (online)
    downloaded into it.

    Raises:
        ConfigError: not in the cache while offline; no such repository or revision; no access.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    match = _NAME.match(name)
    if match is None:
        raise ConfigError(f"{what}={name!r} is not a Hub name (org/name or org/name@revision).")
    repo, revision = match["repo"], match["revision"] or "main"
    offline = constants.is_offline_mode()
    try:
        # a commit's snapshot never changes: the cache's copy needs no request
        local_first = offline or bool(_COMMIT.match(revision))
        try:
            folder = snapshot_download(
                repo, revision=revision, allow_patterns=ALLOW, local_files_only=local_first
            )
        except LocalEntryNotFoundError:
            if offline:
                raise
            folder = snapshot_download(repo, revision=revision, allow_patterns=ALLOW)
    except LocalEntryNotFoundError as e:
        why = (
            "and HF_HUB_OFFLINE is set, so nothing is downloaded"
            if offline
            else f"and the Hub could not be reached ({gist(e)})"
        )
        raise ConfigError(
            f"{what}={name!r}: revision {revision!r} of the Hub model {repo!r} is not in the "
            f"Hugging Face cache ({constants.HF_HUB_CACHE}) {why}. Download it first (`hf "
            f"download {repo} --revision {revision}`), point HF_HUB_CACHE or HF_HOME at a cache "
            "that holds it, or unset HF_HUB_OFFLINE. If it is meant as a local directory, "
            f"{Path(name).resolve()} does not exist."
        ) from e
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError) as e:
        raise ConfigError(
            f"{what}={name!r}: {type(e).__name__} on the Hugging Face Hub ({gist(e)}). Check the "
            "name and revision; a private or gated model needs a token with access (HF_TOKEN, or "
            "`hf auth login`). If it is meant as a local directory, "
            f"{Path(name).resolve()} does not exist."
        ) from e
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise ConfigError(
            f"{what}={name!r} could not be fetched from the Hugging Face Hub ({gist(e)}). Check "
            "the connection, or download it first and set HF_HUB_OFFLINE=1."
        ) from e
    path = Path(folder)
    return HubSnapshot(name, repo, path.name, path)


def pin(ref: Any, what: str = "model.checkpoints") -> Any:
    """``ref`` (a list, or one item) with each Hub name replaced by ``org/name@<commit>``,
    resolved here (the driver), and logged; anything else as it is."""
    if isinstance(ref, Sequence) and not isinstance(ref, str):
        return [pin(item, what) for item in ref]
    if not is_hub_name(ref):
        return ref
    snap = resolve(ref, what)
    if snap.pinned != ref:  # resolve_inputs is idempotent: a pinned name is said once
        logger.info("%s: %s is commit %s (%s)", what, ref, snap.commit, snap.path)
    return snap.pinned
