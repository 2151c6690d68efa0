"""The fixtures of ``tests/s3`` (a SeaweedFS server on loopback, its credentials in the
environment of every check here, the digits checkpoints uploaded)."""

from tests.conftest import digits_checkpoints, ray_session, store_path
from tests.fixtures.s3 import s3_env, s3_server, s3_url
from tests.s3.conftest import _s3_environment, local_reference, s3_checkpoints

__all__ = [
    "_s3_environment",
    "digits_checkpoints",
    "local_reference",
    "ray_session",
    "s3_checkpoints",
    "s3_env",
    "s3_server",
    "s3_url",
    "store_path",
]
