"""The errors trak_dist raises: each message says what happened, the values seen, what to do."""

from __future__ import annotations

from collections.abc import Sequence


class TrakDistError(Exception):
    """Base class of every error trak_dist raises on purpose."""


class ConfigError(TrakDistError, ValueError):
    """A setting is out of range or inconsistent with another one."""


class StoreMismatchError(TrakDistError):
    """A store was opened with settings that differ from the ones it was written with."""


class StoreStateError(TrakDistError):
    """The store does not hold what the requested step needs (e.g. scoring before featurising)."""


class RemoteStoreError(StoreStateError):
    """An object store (``s3://``, ``gs://``, …) refused or did not answer a request after
    its retries: the message names the store's URL, never a credential."""


class TrakerUsageError(TrakDistError, AssertionError):
    """A TRAKer method was called out of order or with conflicting arguments; also an
    ``AssertionError``, which traker 0.3.2 raises here and its users' code catches."""


class StoreDamagedError(StoreStateError):
    """Stored chunks fail their checksum, are missing though committed (or staged), or hold
    non-finite values; ``damage`` lists them. ``trak-dist store repair`` un-commits them (or
    drops the writer's staged rows they belong to)."""

    def __init__(self, message: str, damage: Sequence[object] = ()) -> None:
        super().__init__(message)
        self.damage = list(damage)

    def __reduce__(self) -> tuple[object, ...]:
        # crosses process boundaries (Ray actors) with its damage list
        return (type(self), (str(self), self.damage))


class IllConditionedError(TrakDistError, ArithmeticError):
    """XᵀX + λI is singular or too ill-conditioned for its inverse to mean anything."""


class WorkerFailedError(TrakDistError, RuntimeError):
    """A worker task failed more often than its retry budget allows."""


class CudaExtUnavailableError(TrakDistError, RuntimeError):
    """The CUDA projection library was asked for but cannot be loaded or run here."""


class DataError(TrakDistError, ValueError):
    """The data (or a checkpoint) holds values TRAK cannot attribute with."""


class NonFiniteError(DataError, ArithmeticError):
    """A gradient, projection, Q or score is NaN or infinite; nothing of it was committed."""


class LabelError(DataError):
    """A classification label is not one of the model's C ``classes`` (e.g. −1, or ≥ C):
    ``labels`` at ``positions``, counted as ``where`` says (batch positions, dataset rows)."""

    def __init__(
        self, labels: list[int], positions: list[int], classes: int, where: str = "batch positions"
    ) -> None:
        self.labels, self.positions, self.classes, self.where = labels, positions, classes, where
        more = " …" if len(labels) > 10 else ""
        super().__init__(
            f"{len(labels)} label(s) are not classes of the model's {classes} outputs: "
            f"{labels[:10]}{more} at {where} {positions[:10]}{more}. Classification labels must "
            f"be class indices in [0, {classes}); fix or drop those samples and rerun."
        )

    def __reduce__(self) -> tuple[type[LabelError], tuple[list[int], list[int], int, str]]:
        # pickled across Ray: rebuild from the fields, not from the formatted message
        return type(self), (self.labels, self.positions, self.classes, self.where)

    def at(self, rows: Sequence[int], where: str) -> LabelError:
        """The same error with positions mapped through ``rows`` (e.g. to dataset rows)."""
        return LabelError(self.labels, [int(rows[p]) for p in self.positions], self.classes, where)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``ray job stop``, ``scancel``, ``kill``), raised as Ctrl-C is, so that every
    ``except KeyboardInterrupt`` cleans up the same; told apart where the program reports it
    (exit 143, as a shell reports SIGTERM)."""
