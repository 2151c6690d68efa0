"""Where object storage is: which paths are URLs (``s3://``, ``gs://``, ``az://``; ``file://``
and plain paths are local), obstore's kind of store for each scheme, the endpoint a store talks
to, and the names of objects beside a store."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from trak_dist.errors import ConfigError

# obstore's name for each URL scheme we open as an object store
SCHEMES = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "azure": "azure",
}
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")


def is_url(path: object) -> bool:
    """Whether ``path`` names an object store (``scheme://``; ``file://`` is a local path)."""
    where = str(path)
    return "://" in where and not where.startswith("file://")


def local_path(path: object) -> str:
    """A local store's directory: ``path`` itself, or a ``file://`` URL's path."""
    where = str(path)
    return urlsplit(where).path if where.startswith("file://") else where


def scheme_of(url: str) -> str:
    """obstore's kind of store for ``url`` (ConfigError: a scheme we cannot open)."""
    scheme = url.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES))
        raise ConfigError(
            f"store path {url!r}: the scheme {scheme}:// is not an object store trak_dist "
            f"opens; use a local path, file://, or one of {known}."
        )
    return SCHEMES[scheme]


def endpoint(options: Mapping[str, Any] | None) -> str | None:
    """The endpoint a store talks to: ``options["endpoint"]``, else the environment's."""
    given = (options or {}).get("endpoint")
    if given:
        return str(given)
    return next((os.environ[k] for k in ENDPOINT_ENV if os.environ.get(k)), None)


def beside(url: str, name: str) -> tuple[str, str]:
    """(parent URL, key) of the object ``<store>.<name>`` beside the store at ``url`` (its
    leases, its run reports): outside the store's prefix, so Zarr never lists them and
    ``store.overwrite`` keeps them."""
    head, _, tail = url.rstrip("/").rpartition("/")
    if "://" not in head or head.endswith(":/") or not tail:
        raise ConfigError(
            f"store path {url!r} is a bucket's root; give the store a name inside it "
            "(s3://bucket/run.zarr or s3://bucket/prefix/run.zarr): trak_dist writes its "
            "leases and reports beside it."
        )
    return head, f"{tail}.{name}"
