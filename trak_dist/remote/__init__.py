"""Object storage (``s3://``, ``gs://``, ``az://``): which paths are URLs, the obstore clients
that reach them, their failures as one ``RemoteStoreError`` without credentials, and inputs
named by URLs fetched once per node. The store opens its Zarr store through it; data sources
and checkpoint loaders need only ``is_url`` and ``local_copy``."""

from trak_dist.remote._client import (
    LEASE_TTL_S,
    check_options,
    obstore_store,
    own_option,
    put_beside,
)
from trak_dist.remote._errors import redact, remote_error
from trak_dist.remote._fetch import local_copy
from trak_dist.remote._urls import beside, is_url, local_path

__all__ = [
    "LEASE_TTL_S",
    "beside",
    "check_options",
    "is_url",
    "local_copy",
    "local_path",
    "obstore_store",
    "own_option",
    "put_beside",
    "redact",
    "remote_error",
]
