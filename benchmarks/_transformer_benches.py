"""Transformer benchmarks of issue 21's λ rule (docs/decisions.md): an HF BERT classifier and
an HF GPT-2 causal LM, each with a training recipe ``train(indices, seed)`` for subset models.

- ``bert``: ``trak_dist.examples.tiny_bert``'s model (2 layers, hidden 32) on its keyword task
  made harder: n = 600 train sequences of which 20 % carry a wrong label (fixed draw), so
  models memorise some noise (target accuracy 0.96–0.98 on 100 clean sequences); ``bert40``:
  the same with 40 % wrong labels.
- ``lm``: ``trak_dist.examples.tiny_lm``'s GPT-2 (2 layers, 32 wide) on 300 of its train pieces
  of scikit-learn's dataset descriptions (evenly spaced, so every text is in); targets: its 83
  held-out pieces, f = the summed token margins of the ``causal_lm`` task.

Both train with AdamW (lr 3e-3, batches of 32) for a fixed number of epochs.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import torch
from torch import Tensor, nn

from trak_dist.examples import tiny_bert, tiny_lm

BERT_N, BERT_M, BERT_NOISE, BERT_EPOCHS = 600, 100, 0.2, 12
LM_N, LM_EPOCHS = 300, 5


@cache
def _bert_train(noise: float = BERT_NOISE) -> tuple[Tensor, ...]:
    ids, types, mask, labels = tiny_bert.KeywordSequences(BERT_N, seed=0).tensors
    g = torch.Generator().manual_seed(21)
    flip = torch.rand(BERT_N, generator=g) < noise
    shift = torch.randint(1, tiny_bert.CLASSES, (BERT_N,), generator=g)
    noisy = torch.where(flip, (labels + shift) % tiny_bert.CLASSES, labels)
    return ids, types, mask, noisy


class _Tensors(torch.utils.data.Dataset):
    def __init__(self, tensors: tuple[Tensor, ...]) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, i: int) -> tuple[Tensor, ...]:
        return tuple(t[i] for t in self.tensors)


def bert_train_set(noise: float = BERT_NOISE) -> _Tensors:
    return _Tensors(_bert_train(noise))


def bert_target_set() -> _Tensors:
    return _Tensors(tiny_bert.KeywordSequences(BERT_M, seed=1).tensors)


def bert_model() -> nn.Module:
    return tiny_bert.make_model()


def bert_recipe(
    indices: Sequence[int] | np.ndarray, seed: int, noise: float = BERT_NOISE
) -> dict[str, Tensor]:
    torch.manual_seed(seed)
    rows = torch.as_tensor(np.asarray(indices, dtype=np.int64))
    return tiny_bert.fit(
        bert_model(), tuple(t[rows] for t in _bert_train(noise)), seed, BERT_EPOCHS
    )


def bert_quality(state: dict[str, Tensor]) -> str:
    model = bert_model().eval()
    model.load_state_dict(state)
    ids, types, mask, labels = bert_target_set().tensors
    with torch.no_grad():
        logits = model(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    return f"target accuracy {float((logits.argmax(-1) == labels).float().mean()):.2f}"


def lm_train_set() -> tiny_lm.Sequences:
    return tiny_lm.train_set(limit=LM_N)


def lm_target_set() -> tiny_lm.Sequences:
    return tiny_lm.target_set()


def lm_model() -> nn.Module:
    return tiny_lm.make_model(n_embd=32)


def lm_recipe(indices: Sequence[int] | np.ndarray, seed: int) -> dict[str, Tensor]:
    torch.manual_seed(seed)
    model = lm_model().train()
    rows = torch.as_tensor(np.asarray(indices, dtype=np.int64))
    data = lm_train_set()
    ids, mask = data.input_ids[rows], data.attention_mask[rows]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(LM_EPOCHS):
        for idx in torch.randperm(len(ids), generator=gen).split(32):
            opt.zero_grad()
            tiny_lm._next_token_loss(model, ids[idx], mask[idx]).backward()
            opt.step()
    return model.state_dict()


def lm_quality(state: dict[str, Tensor]) -> str:
    model = lm_model().eval()
    model.load_state_dict(state)
    data = tiny_lm.target_set()
    with torch.no_grad():
        loss = tiny_lm._next_token_loss(model, data.input_ids, data.attention_mask)
    uniform = np.log(len(tiny_lm.vocabulary()) + 1)
    return f"target loss {float(loss):.2f} nats/char (uniform {uniform:.2f})"
