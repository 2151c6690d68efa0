"""Reading attributions back as people read them: ``trak-dist show`` (targets with their top
proponents and opponents as text) and per-token explanations of causal-LM scores.

It sits on the store and the data sources (``trak_dist.hf`` only loads checkpoints and text, so
the loaders never import what reads the store: docs/design.md, "Import rules").
"""

from trak_dist.explain._show import main, shorten
from trak_dist.explain._tokens import TokenExplainer, token_batch, token_scores

__all__ = ["TokenExplainer", "main", "shorten", "token_batch", "token_scores"]
