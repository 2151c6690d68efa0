"""Failures of object storage as users read them: obstore's errors become one
``RemoteStoreError`` that names the store's URL and what to do, and no message carries a
credential (``redact``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from trak_dist.errors import RemoteStoreError
from trak_dist.remote._urls import endpoint

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
SECRET_OPTION = re.compile(r"secret|token|password|key|credential|sas", re.IGNORECASE)
_USERINFO = re.compile(r"(\w+://)[^/@\s]+@")
_CODE = re.compile(r"<Code>(\w+)</Code>")
_ELAPSED = re.compile(r" in ([\d.]+(?:ms|s|µs|ns))\b")
_NOT_REACHED = ("error sending request", "connection", "timed out", "dns error", "tcp connect")


def secrets(options: Mapping[str, Any] | None = None) -> list[str]:
    """The credential values in the environment and ``options`` (to keep out of messages)."""
    found = [os.environ.get(k, "") for k in SECRET_ENV]
    found += [str(v) for k, v in (options or {}).items() if SECRET_OPTION.search(k)]
    return [s for s in found if len(s) >= 4]


def redact(text: str, options: Mapping[str, Any] | None = None) -> str:
    """``text`` with every known credential replaced by ``***`` and URLs' user info removed."""
    for secret in sorted(secrets(options), key=len, reverse=True):
        text = text.replace(secret, "***")
    return _USERINFO.sub(r"\1***@", text)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (obstore appends a multi-line debug dump)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def remote_error(
    e: BaseException, url: str, op: str, key: str, options: Mapping[str, Any] | None
) -> RemoteStoreError:
    """What went wrong with object store ``url`` in ``op`` of ``key``, and what to do."""
    text = str(e)
    code = (_CODE.search(text) or _NOSUCH).group(1)
    where = endpoint(options) or "the provider's default endpoint"
    name = type(e).__name__
    if code == "NoSuchBucket":
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        what = (
            f"the bucket {bucket!r} does not exist at {where}. Create it, or fix store.path "
            "(and the endpoint: AWS_ENDPOINT_URL or store.options.endpoint)"
        )
    elif name in ("PermissionDeniedError", "UnauthenticatedError") or code in (
        "AccessDenied",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
    ):
        what = (
            f"access denied ({code or name}). Check the credentials (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and that they may read and write it"
        )
    elif any(s in text.lower() for s in _NOT_REACHED) and not code:
        took = _seconds((_ELAPSED.search(text) or _NOSUCH).group(1))
        what = (
            f"not reachable at {where} (retried for {took}; raise store.options.retry_timeout "
            "to wait longer). Committed chunks are kept: rerun the same command once it answers"
        )
    else:
        what = redact(first_line(e), options)
    return RemoteStoreError(f"the object store {url} failed to {op} {key or 'its root'}: {what}.")


def _seconds(elapsed: str) -> str:
    """obstore's ``3.512152721s`` / ``812.5ms`` as ``3.5 s``."""
    scale = {"ms": 1e-3, "µs": 1e-6, "ns": 1e-9, "s": 1.0}
    for unit, factor in scale.items():
        if elapsed.endswith(unit):
            return f"{float(elapsed[: -len(unit)]) * factor:.1f} s"
    return "its retry timeout"


class _Nothing:
    def group(self, _: int) -> str:
        return ""


_NOSUCH: Any = _Nothing()
