"""``trak-dist store verify|repair``: find every damaged chunk, flag, staged row, reduction and
torn node of a store (``verify``), and drop or un-commit them so the next run recomputes just
that (``repair``)."""

from trak_dist.store.verify._cli import main
from trak_dist.store.verify._repair import repair
from trak_dist.store.verify._verify import Report, verify

__all__ = ["Report", "main", "repair", "verify"]
