"""Tests against a real S3 server (SeaweedFS on loopback, ``tests/fixtures/s3.py``)."""

from tests.fixtures.s3 import s3_env, s3_server, s3_url

__all__ = ["s3_env", "s3_server", "s3_url"]
