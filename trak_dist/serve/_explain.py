"""``POST /explain``: a causal-LM target's score on a train example, token by token.

The decomposition of ``trak_dist.explain._tokens`` (``TokenExplainer``, ``trak-dist show
show.tokens=N``): S_it = Σ_j s_ijt with s_ijt = mean_c(x_ijc · y_tc) · Q̄_i, each x_ijc the
projected gradient of the example with only token j counted, through the service's own model
copies and projection; y_tc = K_c⁻¹ x_tc is the target's row of the index (``target_side``), so
the token scores of an example add up to its score in ``/attribute``'s reply (up to the float16
rounding of stored train rows, when the store is float16).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trak_dist.explain import token_batch, token_scores
from trak_dist.featurize import Featurizer


class TokenScores:
    """Per-token scores of train examples for one target row of the index.

    Args:
        featurizers: the service's featurizer per checkpoint (their model copies hold the
            checkpoint's weights).
        qbar: ``[n]`` the train examples' mean Q over checkpoints.
        train: the train set (``TextDataset``: items and ``tokenizer``).
        proj_dim: p, the index's width per checkpoint.
        micro_batch: token copies per gradient call (the job's ``featurize.micro_batch``).
    """

    def __init__(
        self,
        featurizers: Sequence[Featurizer],
        qbar: torch.Tensor,
        train: Any,
        proj_dim: int,
        micro_batch: int | None,
    ) -> None:
        # the same model copies and projectors, more token copies per call than targets get
        self.featurizers = [Featurizer(f.computer, f.projector, micro_batch) for f in featurizers]
        self.qbar = qbar.double().cpu()
        self.train = train
        self.p = proj_dim

    def explain(self, y: torch.Tensor, index: int) -> dict[str, Any]:
        """Train example ``index`` for the target whose index row is ``y`` (``[C·p]``):
        ``{"index", "score", "tokens": [text of each real token], "scores": [its score, or
        None for a token not counted (the first, a masked prompt)]}``."""
        item = dict(self.train[index])
        batch, positions = token_batch(item)
        xs = [f.project(batch, c)[:, : self.p] for c, f in enumerate(self.featurizers)]
        ys = [y[c * self.p : (c + 1) * self.p].cpu() for c in range(len(self.featurizers))]
        scores = token_scores(xs, ys, float(self.qbar[index]))
        ids = item["input_ids"][item["attention_mask"].bool()].tolist()
        per_token: list[float | None] = [None] * len(ids)
        for j, s in zip(positions.tolist(), scores.tolist(), strict=True):
            per_token[j] = s
        decode = self.train.tokenizer.decode
        return {
            "index": index,
            "score": float(scores.sum()),
            "tokens": [str(decode([t])) for t in ids],
            "scores": per_token,
        }
