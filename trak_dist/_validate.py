"""The checks every config section shares: each error names the field, the value and what is
allowed."""

from __future__ import annotations

from trak_dist.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(
                f"{type(obj).__name__}.{name}={value!r}; expected a positive integer."
            )


def _one_of(obj: object, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in allowed:
        raise ConfigError(f"{type(obj).__name__}.{name}={value!r}; expected one of {allowed}.")
