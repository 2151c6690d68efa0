"""Build the network of Hugging Face checkpoint directories (the ``model=hf`` factory)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trak_dist.errors import ConfigError
from trak_dist.failures import gist
from trak_dist.hf._checkpoints import (
    MODEL_FILE,
    base_dir,
    check_dirs,
    expand,
    is_adapter,
    read_json,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_pretrained(path: Path, dtype: str, trust_remote_code: bool) -> nn.Module:
    """``from_pretrained`` of a local directory: safetensors only, eager attention (it runs
    under ``torch.func.vmap``, and its numbers do not depend on the batch's padding kernel)."""
    import transformers

    transformers.utils.logging.disable_progress_bar()  # one bar per checkpoint, per worker
    arch = (read_json(path / MODEL_FILE).get("architectures") or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    kwargs: dict[str, Any] = {
        "dtype": DTYPES[dtype],
        "use_safetensors": True,
        "attn_implementation": "eager",
    }
    if cls is None:
        if not trust_remote_code:
            raise ConfigError(
                f"{path}: architecture {arch!r} is not a transformers model class, so loading "
                "it would run the checkpoint's own code; set model.trust_remote_code=true if "
                "you trust it."
            )
        cls = transformers.AutoModelForCausalLM
        kwargs["trust_remote_code"] = True
    try:
        model = cls.from_pretrained(str(path), **kwargs)
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(
            f"checkpoint {path} could not be loaded with from_pretrained ({gist(e)}). It needs "
            "config.json and model.safetensors (save_pretrained writes both)."
        ) from e
    return model.eval()


class AdapterModel(nn.Module):
    """A PEFT model whose frozen base weights are buffers, so that its parameters, and the
    gradients trak_dist takes, are the adapter's trainable ones; ``load_state_dict`` takes an
    adapter's weights as saved (another checkpoint of the same adapter)."""

    def __init__(self, peft_model: nn.Module) -> None:
        super().__init__()
        for module in peft_model.modules():
            for name, p in list(module._parameters.items()):
                if p is not None and not p.requires_grad:
                    del module._parameters[name]
                    module.register_buffer(name, p.detach())
        self.model = peft_model

    def forward(self, **inputs: Any) -> Any:
        return self.model(**inputs)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        from peft import set_peft_model_state_dict

        if any(k.startswith("model.") for k in state_dict):  # this module's own state_dict
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        result: Any = set_peft_model_state_dict(self.model, dict(state_dict))
        missing = [k for k in result.missing_keys if "lora_" in k or "modules_to_save" in k]
        if result.unexpected_keys or missing:
            raise ConfigError(
                f"adapter weights do not fit the adapter model: unexpected "
                f"{list(result.unexpected_keys)[:5]}, missing {missing[:5]}."
            )
        return result


def _adapter(first: Path, base: str | None, dtype: str, trust_remote_code: bool) -> nn.Module:
    from peft import PeftModel

    root = base_dir(first, base)
    model = load_pretrained(root, dtype, trust_remote_code)
    try:
        with warnings.catch_warnings():
            # peft 0.17+ asks transformers 5 a deprecated question; nothing the user can change
            warnings.filterwarnings("ignore", ".*is_gradient_checkpointing", FutureWarning)
            peft_model = PeftModel.from_pretrained(model, str(first), is_trainable=True)
    except (ValueError, RuntimeError, KeyError, AttributeError) as e:
        raise ConfigError(
            f"adapter {first} does not fit the base model {root} ({gist(e)}): it was trained "
            "on another base; give the right one as model.base=DIR."
        ) from e
    return AdapterModel(peft_model).eval()


def from_checkpoints(
    checkpoints: Any,
    dtype: str = "float32",
    base: str | None = None,
    trust_remote_code: bool = False,
) -> nn.Module:
    """The network of the first checkpoint directory (``model=hf``'s factory; every worker
    calls it, then loads each checkpoint's weights into it).

    Args:
        checkpoints: model or PEFT adapter directories (a list, one, or a glob).
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        base: an adapter's base model directory (None: from ``adapter_config.json``).
        trust_remote_code: allow architectures that are not transformers classes.
    """
    paths = expand(checkpoints)
    check_dirs(paths, base)
    if is_adapter(paths[0]):
        return _adapter(paths[0], base, dtype, trust_remote_code)
    return load_pretrained(paths[0], dtype, trust_remote_code)
