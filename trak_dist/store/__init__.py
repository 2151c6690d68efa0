"""The chunked Zarr store every worker writes into and the reducer reads."""

# trak_dist.remote's URL helpers, still exported here for callers of before
from trak_dist.remote import check_options as check_store_options
from trak_dist.remote import is_url, local_copy, local_path, put_beside, redact
from trak_dist.store._chunk_io import as_stored, one_thread
from trak_dist.store._eval import EvalSet, subset_mask
from trak_dist.store._fingerprints import (
    check_unchanged,
    checkpoint_fingerprint,
    dataset_fingerprint,
    dataset_row_hashes,
    file_fingerprint,
    fingerprint,
    row_hashes,
)
from trak_dist.store._integrity import Damage
from trak_dist.store._layout import MIN_CHUNK_ROWS, resolve_chunk_rows
from trak_dist.store._lock import ScoringLease, scoring_lease, store_lock
from trak_dist.store._rows import RowSet, curvature_rows
from trak_dist.store._spec import FORMAT_VERSION, FeatureSpec
from trak_dist.store._store import FeatureStore
from trak_dist.store._zarr import CODECS, DEFAULT_CODEC
from trak_dist.store.scores import ScoreSet, variant_name
from trak_dist.store.verify import main

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "FORMAT_VERSION",
    "MIN_CHUNK_ROWS",
    "Damage",
    "EvalSet",
    "FeatureSpec",
    "FeatureStore",
    "RowSet",
    "ScoreSet",
    "ScoringLease",
    "as_stored",
    "check_store_options",
    "check_unchanged",
    "checkpoint_fingerprint",
    "curvature_rows",
    "dataset_fingerprint",
    "dataset_row_hashes",
    "file_fingerprint",
    "fingerprint",
    "is_url",
    "local_copy",
    "local_path",
    "main",
    "one_thread",
    "put_beside",
    "redact",
    "resolve_chunk_rows",
    "row_hashes",
    "scoring_lease",
    "store_lock",
    "subset_mask",
    "variant_name",
]
