"""The chunked Zarr store every worker writes into and the reducer reads."""

from trak_dist.store._cli import main
from trak_dist.store._codecs import CODECS, DEFAULT_CODEC
from trak_dist.store._eval import EvalSet, subset_mask
from trak_dist.store._hashes import check_unchanged, dataset_row_hashes, fingerprint, row_hashes
from trak_dist.store._integrity import Damage
from trak_dist.store._lock import ScoringLease, scoring_lease, store_lock
from trak_dist.store._rows import RowSet
from trak_dist.store._scores import ScoreSet, variant_name
from trak_dist.store._spec import (
    FORMAT_VERSION,
    FeatureSpec,
    checkpoint_fingerprint,
    dataset_fingerprint,
    file_fingerprint,
)
from trak_dist.store._store import FeatureStore

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "FORMAT_VERSION",
    "Damage",
    "EvalSet",
    "FeatureSpec",
    "FeatureStore",
    "RowSet",
    "ScoreSet",
    "ScoringLease",
    "check_unchanged",
    "checkpoint_fingerprint",
    "dataset_fingerprint",
    "dataset_row_hashes",
    "file_fingerprint",
    "fingerprint",
    "main",
    "row_hashes",
    "scoring_lease",
    "store_lock",
    "subset_mask",
    "variant_name",
]
