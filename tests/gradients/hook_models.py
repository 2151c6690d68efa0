"""Stock Hugging Face models from tiny configs (random weights, no download) and a test-local
language-model output, for the hook engine tests."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from trak_dist.tasks import ModelOutput, margin

VOCAB, SEQ, BATCH = 40, 8, 5


# special token ids inside the tiny vocabulary (transformers complains otherwise)
TOKENS = dict(bos_token_id=1, eos_token_id=1, pad_token_id=0)


def bert(attn: str = "sdpa") -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=SEQ,
        num_labels=3,
        attn_implementation=attn,
        **TOKENS,
    )
    return BertForSequenceClassification(cfg).eval()


def gpt2_config(attn: str = "sdpa", **kw):
    from transformers import GPT2Config

    base = dict(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=2, n_head=2)
    return GPT2Config(**{**base, **TOKENS, **kw}, attn_implementation=attn)


def gpt2_classifier(attn: str = "sdpa") -> nn.Module:
    from transformers import GPT2ForSequenceClassification

    torch.manual_seed(1)
    return GPT2ForSequenceClassification(gpt2_config(attn, num_labels=3)).eval()


def gpt2_lm(attn: str = "sdpa") -> nn.Module:
    from transformers import GPT2LMHeadModel

    torch.manual_seed(2)
    return GPT2LMHeadModel(gpt2_config(attn)).eval()


def text_batch(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(input_ids, token_type_ids, attention_mask, label)``; sample 0 is right-padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones_like(ids)
    mask[0, SEQ - 3 :] = 0
    ids[0, SEQ - 3 :] = 0
    return ids, torch.zeros_like(ids), mask, torch.randint(0, 3, (BATCH,), generator=g)


class NextTokenMargins(ModelOutput):
    """Test-local causal-LM output: the sum over unpadded positions of the next token's margin
    (the ``causal_lm`` task belongs to another stream). A sample is ``(input_ids, mask)``."""

    @staticmethod
    def _margins(logits: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
        b, t, v = logits.shape
        per = margin(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1)).reshape(b, t - 1)
        return (per * mask[:, 1:].to(per.dtype)).sum(1)

    def get_output(self, model, weights, buffers, ids, mask):  # type: ignore[no-untyped-def]
        kwargs = {"input_ids": ids[None], "attention_mask": mask[None]}
        out = torch.func.functional_call(model, (weights, buffers), args=(), kwargs=kwargs)
        return self._margins(out.logits, ids[None], mask[None]).sum()

    def get_outputs(self, model, batch):  # type: ignore[no-untyped-def]
        ids, mask = batch
        return self._margins(model(input_ids=ids, attention_mask=mask).logits, ids, mask)

    def get_out_to_loss_grad(self, model, weights, buffers, batch):  # type: ignore[no-untyped-def]
        return torch.ones(batch[0].shape[0])
