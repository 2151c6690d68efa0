"""kronfluence 1.0.1 on the ``_lm_benches`` checkpoints: identity, KFAC and EK-FAC scores.

Not a dependency of trak_dist: install it for the benchmark only, without letting pip touch
torch (``benchmarks/requirements-peers.txt``). Its pairwise score is gᵀ_query H⁻¹ g_train of
the losses (positive: the train document lowers the query's loss), so with the query's
measurement = its mean loss per counted token, a positive score predicts a higher target output
(mean log-likelihood), the sign of trak_dist's scores. Full gradients, no projection; tracked
modules: every ``nn.Linear`` (kronfluence's default; HF GPT-2's ``Conv1D`` is converted to the
equivalent ``nn.Linear`` first, as kronfluence's own GPT-2 example does). Factors are fitted
with labels sampled from the model (``use_empirical_fisher=False``, its default).
"""

from __future__ import annotations

import logging
import tempfile
import time

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from benchmarks._lm_benches import IGNORE, LMBench

STRATEGIES = ("identity", "kfac", "ekfac")


class _Docs(Dataset):
    def __init__(self, ids: Tensor, labels: Tensor) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        ids = self.ids[i]
        return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": self.labels[i]}


def _task():
    from kronfluence.task import Task

    class LMTask(Task):
        def compute_train_loss(self, batch: dict, model: nn.Module, sample: bool = False) -> Tensor:
            z = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            z = z.logits[:, :-1].float()
            y = batch["labels"][:, 1:]
            if sample:
                with torch.no_grad():
                    draw = torch.multinomial(torch.softmax(z.reshape(-1, z.shape[-1]), -1), 1)
                    y = torch.where(y == IGNORE, IGNORE, draw.view(y.shape))
            return F.cross_entropy(
                z.reshape(-1, z.shape[-1]), y.reshape(-1), ignore_index=IGNORE, reduction="sum"
            )

        def compute_measurement(self, batch: dict, model: nn.Module) -> Tensor:
            z = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            z = z.logits[:, :-1].float()
            y = batch["labels"][:, 1:]
            ce = F.cross_entropy(
                z.transpose(1, 2), y, ignore_index=IGNORE, reduction="none"
            )  # [B, T-1]
            return (ce.sum(1) / (y != IGNORE).sum(1).clamp(min=1)).sum()

        def get_attention_mask(self, batch: dict) -> Tensor:
            return batch["attention_mask"]

    return LMTask()


def _linearise(model: nn.Module) -> nn.Module:
    """HF ``Conv1D`` (``y = x W + b``, W ``[in, out]``) as ``nn.Linear``: the same function."""
    from transformers.pytorch_utils import Conv1D

    for name, child in list(model.named_children()):
        if isinstance(child, Conv1D):
            lin = nn.Linear(child.weight.shape[0], child.weight.shape[1])
            lin.weight.data = child.weight.data.T.contiguous()
            lin.bias.data = child.bias.data.clone()
            setattr(model, name, lin)
        else:
            _linearise(child)
    return model


def scores(
    bench: LMBench, state: dict[str, Tensor], strategy: str, damping: float | None = 1e-8
) -> tuple[np.ndarray, float, float]:
    """``([n, m] scores, factor seconds, score seconds)`` of one checkpoint."""
    from kronfluence.analyzer import Analyzer, prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments

    logging.getLogger("kronfluence").setLevel(logging.ERROR)
    torch.manual_seed(0)
    model = bench.model()
    model.load_state_dict(state)
    model = _linearise(model).eval()
    task = _task()
    model = prepare_model(model, task)
    c = bench.corpus()
    train, query = _Docs(c.train, c.train_labels()), _Docs(c.targets, c.target_labels)
    with tempfile.TemporaryDirectory() as tmp:
        an = Analyzer("lm", model, task, cpu=True, disable_tqdm=True, output_dir=tmp)
        t0 = time.perf_counter()
        an.fit_all_factors(
            "f",
            train,
            per_device_batch_size=32,
            factor_args=FactorArguments(strategy=strategy),
            overwrite_output_dir=True,
        )
        t1 = time.perf_counter()
        an.compute_pairwise_scores(
            "s",
            "f",
            query_dataset=query,
            train_dataset=train,
            per_device_query_batch_size=16,
            per_device_train_batch_size=32,
            score_args=ScoreArguments(damping_factor=damping),
            overwrite_output_dir=True,
        )
        t2 = time.perf_counter()
        s = an.load_pairwise_scores("s")["all_modules"]  # [m, n]
    return s.T.double().numpy(), t1 - t0, t2 - t1
