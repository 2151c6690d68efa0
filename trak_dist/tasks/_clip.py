"""traker's ``clip`` model output: contrastive image-text models (open_clip style)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from trak_dist.errors import TrakerUsageError
from trak_dist.tasks._base import ModelOutput, Params

logger = logging.getLogger(__name__)


class CLIPOutput(ModelOutput):
    """The CLIP model output of TRAK (§5.1 of the paper), as traker 0.3.2's ``CLIPModelOutput``.

    ``model(image=…, text=…)`` returns ``(image_embeddings, text_embeddings, logit_scale)``. For
    a pair with embeddings φ, ψ and a simulated batch B drawn from :meth:`get_embeddings`::

        f = −logsumexp_B(−φ·(ψ − ψ')) − logsumexp_B(−ψ·(φ − φ'))
        Q = 1 − (softmax(S) + softmax(Sᵀ))_ii / 2,   S = T φ ψᵀ over the batch

    Kept from traker so the numbers match: B is drawn with probabilities proportional to the
    row index (row 0 never), ``size`` rows are allocated whatever the loader holds (unfilled
    rows stay zero and are drawn too), and T defaults to the first batch's logit scale.

    Args:
        temperature: the softmax temperature of Q; None for the model's logit scale.
        simulated_batch_size: |B|.
    """

    def __init__(self, temperature: float | None = None, simulated_batch_size: int = 300) -> None:
        super().__init__()
        self.temperature: Any = temperature
        self.sim_batch_size = simulated_batch_size
        self.image_embeddings: Tensor | None = None
        self.text_embeddings: Tensor | None = None
        self.num_computed_embeddings = 0
        # as traker: the memory-efficient attention kernel cannot be differentiated under vmap
        torch.backends.cuda.enable_mem_efficient_sdp(False)

    def get_embeddings(
        self,
        model: nn.Module,
        loader: Iterable[Sequence[Tensor]],
        batch_size: int,
        embedding_dim: int,
        size: int = 50_000,
        preprocess_fn_img: Callable[[Any], Tensor] | None = None,
        preprocess_fn_txt: Callable[[Any], Tensor] | None = None,
    ) -> None:
        """Embed the first ``size`` pairs of ``loader`` (traker's signature). Unlike traker,
        embeddings live on the model's device and rows are placed by the batches' actual lengths
        (``batch_size`` is unused; traker fails on a short last batch)."""
        device = next(model.parameters()).device
        images_out = torch.zeros(size, embedding_dim, device=device)
        texts_out = torch.zeros(size, embedding_dim, device=device)
        filled = 0
        with torch.no_grad():
            for images, texts in loader:
                if preprocess_fn_img is not None:
                    images = preprocess_fn_img(images)
                if preprocess_fn_txt is not None:
                    texts = preprocess_fn_txt(texts)
                image_emb, text_emb, _ = model(images, texts)
                k = min(image_emb.shape[0], size - filled)
                images_out[filled : filled + k] = image_emb[:k].detach()
                texts_out[filled : filled + k] = text_emb[:k].detach()
                filled += k
                if filled >= size:
                    break
        if filled < size:
            logger.warning(
                "get_embeddings: the loader held %d pairs, size=%d; as in traker, the other rows "
                "stay zero and take part in the simulated batches. Pass size=%d to avoid that.",
                filled,
                size,
                filled,
            )
        self.image_embeddings, self.text_embeddings = images_out, texts_out
        self.num_computed_embeddings = size

    def get_output(
        self, model: nn.Module, weights: Params, buffers: Params, *sample: Tensor
    ) -> Tensor:
        image, text = sample
        if self.image_embeddings is None or self.text_embeddings is None:
            raise TrakerUsageError(
                "the clip task needs the train set's embeddings: call "
                "traker.task.get_embeddings(model, loader, batch_size, embedding_dim, size=n) "
                "before featurizing. (The trak-dist pipeline cannot compute them from a config; "
                "use the TRAKer API for CLIP.)"
            )
        inputs = {"image": image.unsqueeze(0), "text": text.unsqueeze(0)}
        image_emb, text_emb, _ = torch.func.functional_call(
            model, (weights, buffers), args=(), kwargs=inputs
        )
        drawn = torch.multinomial(
            torch.arange(self.num_computed_embeddings).float(),
            num_samples=self.sim_batch_size,
            replacement=False,
        )
        result = -torch.logsumexp(
            -image_emb @ (text_emb - self.text_embeddings[drawn]).T, dim=1
        ) - torch.logsumexp(-text_emb @ (image_emb - self.image_embeddings[drawn]).T, dim=1)
        return result.sum()

    def get_out_to_loss_grad(
        self, model: nn.Module, weights: Params, buffers: Params, batch: Sequence[Tensor]
    ) -> Tensor:
        images, texts = batch
        image_emb, text_emb, scale = torch.func.functional_call(
            model, (weights, buffers), args=(), kwargs={"image": images, "text": texts}
        )
        if self.temperature is None:
            self.temperature = scale
        sims = self.temperature * image_emb @ text_emb.T
        p = (torch.softmax(sims, -1) + torch.softmax(sims.T, -1)).diag() / 2.0
        return (1 - p).detach()
