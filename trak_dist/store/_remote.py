"""Stores on object storage: ``s3://bucket/prefix/run.zarr``, ``gs://…``, ``az://…``.

A URL opens as Zarr's ``ObjectStore`` over obstore (``pip install 'trak_dist[s3]'``); a plain
path or a ``file://`` URL is a local directory. Credentials, endpoint and region come from the
environment every S3 client reads (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``; ``GOOGLE_APPLICATION_CREDENTIALS``;
``AZURE_STORAGE_*``), an AWS profile (``AWS_PROFILE``, with boto3 installed), and
``store.options`` (obstore's configuration keys, e.g. ``endpoint``, ``region``,
``allow_http``, plus trak_dist's own ``retry_timeout`` and ``lease_ttl``, in seconds).

Every failure of the object store reaches callers as a ``RemoteStoreError`` naming the store's
URL and what to do; no message carries a credential (``redact``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta
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
EXTRA = {"s3": "s3", "gcs": "gcs", "azure": "s3"}
# trak_dist's own keys of store.options (seconds); the rest goes to obstore
RETRY_TIMEOUT_S = 120.0
LEASE_TTL_S = 60.0
OWN_KEYS = ("retry_timeout", "lease_ttl")
CLIENT_KEYS = frozenset(
    (
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "http1_only",
        "http2_keep_alive_interval",
        "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle",
        "http2_only",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "read_timeout",
        "timeout",
        "user_agent",
    )
)
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
# environment variables and option names whose values never appear in a message
SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_TOKEN",
    "AZURE_CLIENT_SECRET",
)
_SECRET_OPTION = re.compile(r"secret|token|password|key|credential|sas", re.IGNORECASE)
_USERINFO = re.compile(r"(\w+://)[^/@\s]+@")


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


def own_option(options: Mapping[str, Any] | None, key: str, default: float) -> float:
    """One of trak_dist's keys of ``store.options`` (``OWN_KEYS``), in seconds."""
    value = (options or {}).get(key, default)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if seconds <= 0:
        raise ConfigError(f"store.options.{key}={value!r}; expected a number of seconds > 0.")
    return seconds


def secrets(options: Mapping[str, Any] | None = None) -> list[str]:
    """The credential values in the environment and ``options`` (to keep out of messages)."""
    found = [os.environ.get(k, "") for k in SECRET_ENV]
    found += [str(v) for k, v in (options or {}).items() if _SECRET_OPTION.search(k)]
    return [s for s in found if len(s) >= 4]


def redact(text: str, options: Mapping[str, Any] | None = None) -> str:
    """``text`` with every known credential replaced by ``***`` and URLs' user info removed."""
    for secret in sorted(secrets(options), key=len, reverse=True):
        text = text.replace(secret, "***")
    return _USERINFO.sub(r"\1***@", text)


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


def put_beside(url: str, name: str, data: bytes, options: Mapping[str, Any] | None = None) -> str:
    """Write ``data`` to the object ``<store>.<name>`` beside the store at ``url``; its URL."""
    parent, key = beside(url, name)
    import obstore

    try:
        obstore.put(obstore_store(parent, options, named=url), key, data)
    except Exception as e:
        from trak_dist.store._object_store import remote_error

        raise remote_error(e, url, "write", key, options) from None
    return f"{parent}/{key}"


def obstore_store(
    url: str, options: Mapping[str, Any] | None = None, named: str | None = None
) -> Any:
    """An obstore store rooted at ``url`` (ConfigError: obstore missing, a bad option; the
    message names ``named``, the URL the user gave, when ``url`` is derived from it)."""
    kind = scheme_of(url)
    named = named or url
    try:
        from obstore.exceptions import BaseError
        from obstore.store import from_url as obstore_from_url
    except ImportError:
        raise ConfigError(
            f"{named!r} needs obstore, which is not installed: pip install "
            f"'trak_dist[{EXTRA[kind]}]' (on every node of the cluster)."
        ) from None
    opts = {k: v for k, v in (options or {}).items() if k not in OWN_KEYS}
    client = {k: opts.pop(k) for k in list(opts) if k in CLIENT_KEYS}
    if kind == "s3" and "allow_http" not in client:
        # an http:// endpoint is the user's explicit choice (MinIO, SeaweedFS on a private
        # network); obstore refuses it unless allow_http is set as well
        client["allow_http"] = str((endpoint(options) or "").startswith("http://")).lower()
    timeout = own_option(options, "retry_timeout", RETRY_TIMEOUT_S)
    retry = {
        # bounded by time, not by count: a server restarting for 15 s is ridden out, one
        # gone for good is reported after retry_timeout
        "max_retries": 1000,
        "retry_timeout": timedelta(seconds=timeout),
        "backoff": {
            "init_backoff": timedelta(milliseconds=100),
            "max_backoff": timedelta(seconds=5),
            "base": 2,
        },
    }
    extra: dict[str, Any] = {}
    profile = opts.pop("profile", None) or (os.environ.get("AWS_PROFILE") if kind == "s3" else None)
    if profile and kind == "s3":
        extra["credential_provider"] = _profile_credentials(str(profile), named)
    try:
        from_url: Any = obstore_from_url  # one call for every scheme (typed per scheme)
        return from_url(url, config=opts, client_options=client, retry_config=retry, **extra)
    except (BaseError, ValueError, TypeError) as e:
        raise ConfigError(
            f"{named!r} with store.options {sorted(options or {})}: "
            f"{redact(first_line(e), options)}"
        ) from None


def _profile_credentials(profile: str, url: str) -> Any:
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        raise ConfigError(
            f"{url!r}: AWS profile {profile!r} is set (AWS_PROFILE or "
            "store.options.profile), and reading profiles needs boto3: pip install boto3, or "
            "give the credentials as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY."
        ) from None
    return Boto3CredentialProvider(boto3.Session(profile_name=profile))


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (obstore appends a multi-line debug dump)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def check_options(path: str, options: Mapping[str, Any]) -> None:
    """ConfigError for ``store.options`` that cannot work: given for a local store, trak_dist's
    own keys out of range, or a credential (it would travel in the job's config and logs)."""
    if not options:
        return
    if not is_url(path):
        raise ConfigError(
            f"store.options {sorted(options)} are set, but store.path={path!r} is a local "
            "directory; they configure an object store (s3://…, gs://…)."
        )
    for key in OWN_KEYS:
        if key in options:
            own_option(options, key, 1.0)
    given = sorted(k for k in options if _SECRET_OPTION.search(k))
    if given:
        raise ConfigError(
            f"store.options {given} look like credentials, which the job's config, logs and "
            "reports would carry: set them in the environment of every node instead "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE; "
            "GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_ACCOUNT_KEY)."
        )
