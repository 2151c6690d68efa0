"""Clients of object storage (``s3://bucket/prefix/run.zarr``, ``gs://…``, ``az://…``) and the
``store.options`` they are made with.

A URL opens as Zarr's ``ObjectStore`` over obstore (``pip install 'trak_dist[s3]'``); a plain
path or a ``file://`` URL is a local directory. Credentials, endpoint and region come from the
environment every S3 client reads (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``; ``GOOGLE_APPLICATION_CREDENTIALS``;
``AZURE_STORAGE_*``), an AWS profile (``AWS_PROFILE``, with boto3 installed), and
``store.options`` (obstore's configuration keys, e.g. ``endpoint``, ``region``,
``allow_http``, plus trak_dist's own ``retry_timeout`` and ``lease_ttl``, in seconds).

Every failure of the object store reaches callers as a ``RemoteStoreError`` naming the store's
URL and what to do; no message carries a credential (``_errors.py``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from trak_dist.errors import ConfigError
from trak_dist.remote._errors import SECRET_OPTION, first_line, redact, remote_error
from trak_dist.remote._urls import beside, endpoint, is_url, scheme_of

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


def put_beside(url: str, name: str, data: bytes, options: Mapping[str, Any] | None = None) -> str:
    """Write ``data`` to the object ``<store>.<name>`` beside the store at ``url``; its URL."""
    parent, key = beside(url, name)
    import obstore

    try:
        obstore.put(obstore_store(parent, options, named=url), key, data)
    except Exception as e:
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
    given = sorted(k for k in options if SECRET_OPTION.search(k))
    if given:
        raise ConfigError(
            f"store.options {given} look like credentials, which the job's config, logs and "
            "reports would carry: set them in the environment of every node instead "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE; "
            "GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_ACCOUNT_KEY)."
        )
