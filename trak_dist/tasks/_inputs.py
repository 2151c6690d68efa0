"""Text batches (tuples or Hugging Face dicts) turned into model keyword arguments, and the
model call shared by the text tasks."""

from __future__ import annotations

import traceback
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from trak_dist.errors import ConfigError

Params = dict[str, Tensor]

# Keys of a dict batch passed on to the model; others (e.g. a dataset's ``idx``) are ignored,
# as Hugging Face's Trainer drops columns the model does not take.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
LABEL_KEYS = ("labels", "label")


def model_inputs(batch: Mapping[str, Tensor], what: str) -> dict[str, Tensor]:
    """The keys of a dict batch that the model takes (``MODEL_INPUTS``); ``input_ids`` is
    required."""
    if "input_ids" not in batch:
        raise ConfigError(
            f"{what}: a dict batch needs 'input_ids' (and usually 'attention_mask'); got keys "
            f"{sorted(batch)}."
        )
    return {k: batch[k] for k in MODEL_INPUTS if k in batch}


def dict_labels(batch: Mapping[str, Tensor], what: str) -> Tensor | None:
    """``batch['labels']`` or ``batch['label']`` (Hugging Face datasets name the column
    ``label``, its collators ``labels``); None when there is neither."""
    found = [k for k in LABEL_KEYS if k in batch]
    if len(found) > 1:
        raise ConfigError(f"{what}: the batch has both 'labels' and 'label'; keep one.")
    return batch[found[0]] if found else None


def logits(
    model: nn.Module, params: tuple[Params, Params] | None, inputs: dict[str, Tensor]
) -> Tensor:
    """``model(**inputs)``'s logits (``.logits`` of a HF output) from the model's own parameters
    (``params=None``) or ``(weights, buffers)`` via ``functional_call`` (vmap)."""
    if params is None:
        out = model(**inputs)
    else:
        try:
            out = torch.func.functional_call(model, params, args=(), kwargs=inputs)
        except RuntimeError as e:
            if not _is_vmap_control_flow(e):
                raise
            raise ConfigError(
                f"{type(model).__name__} cannot run under torch.func.vmap: its forward reads "
                f"tensor values to choose a branch ({_where(e)}), which vmap does not allow "
                "(Hugging Face's attention-mask code does this for SDPA and for encoder models). "
                "Use the module-hook gradient engine, which needs no vmap: gradient_engine=hooks "
                "(featurize.gradient_engine=hooks for trak-dist). "
                "(Decoder-only models such as GPT-2 also run under vmap when built with "
                "attn_implementation='eager'.)"
            ) from e
    return out.logits if hasattr(out, "logits") else out


def _is_vmap_control_flow(e: RuntimeError) -> bool:
    # torch.func's message for .item() / data-dependent control flow on a batched tensor
    msg = str(e)
    return msg.startswith("vmap:") and ("data-dependent control flow" in msg or ".item()" in msg)


def _where(e: BaseException) -> str:
    """The innermost frame outside torch, e.g. ``transformers/masking_utils.py:369``."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/torch/" not in f.filename]
    if not frames:
        return "inside torch"
    f = frames[-1]
    tail = f.filename.split("site-packages/")[-1]
    return f"{tail}:{f.lineno} in {f.name}"
