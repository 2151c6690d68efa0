"""The config sections of the sub-commands that run on a featurised store: ``trak-dist eval``
(``EvalConfig``) and ``trak-dist serve`` (``ServeConfig``). ``trak_dist.config`` re-exports
them; import them from there."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trak_dist._validate import DEVICES, _one_of, _positive
from trak_dist.errors import ConfigError
from trak_dist.scoring import BEST, parse_lambda

GRID = "grid"  # eval.lambdas entry: a log grid around the auto λ (trak_dist.lds.expand_lambdas)


@dataclass(frozen=True)
class EvalConfig:
    """``trak-dist eval``: the linear datamodeling score (LDS) of the store's scores.

    Attributes:
        recipe: ``train(indices, seed, **recipe_kwargs) -> state_dict`` (or its import path):
            trains ``model.factory``'s model on the train examples ``indices``.
        recipe_kwargs: keyword arguments of ``recipe``.
        num_models: subset models M (more: a tighter interval; it may grow on a rerun).
        alpha: the fraction of the train set each subset model sees.
        seed: draws the subsets and the recipe's seeds.
        bootstrap: resamples for the interval (0: none).
        cpus_per_model, gpus_per_model: Ray resources of one training task.
        device: where a subset model's target outputs are computed (``auto``: cuda if present).
        overwrite: discard stored subset models made with other settings.
        output_dir: where the table and plot go (None: ``outputs/eval/<date>/<time>``).
        lambdas: λ to score at the job's proj_dim before measuring, from the stored features
            (no refeaturisation): numbers, ``auto``, and ``grid`` (nine λ from 10⁻³ to 10 times
            the auto λ, and auto). The best λ per proj_dim is recorded for ``lambda_reg=best``.
    """

    recipe: Any = "trak_dist.examples.digits:train_subset"
    recipe_kwargs: dict[str, Any] = field(default_factory=dict)
    num_models: int = 100
    alpha: float = 0.5
    seed: int = 0
    bootstrap: int = 1000
    cpus_per_model: float = 1.0
    gpus_per_model: float = 0.0
    device: str = "auto"
    overwrite: bool = False
    output_dir: str | None = None
    lambdas: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        _positive(self, "num_models")
        object.__setattr__(self, "lambdas", _sweep(self.lambdas))
        _one_of(self, "device", DEVICES)
        if self.num_models < 3:
            raise ConfigError(
                f"EvalConfig.num_models={self.num_models}; a rank correlation needs at least 3 "
                "subset models (100 is the default)."
            )
        if not 0 < self.alpha < 1:
            raise ConfigError(f"EvalConfig.alpha={self.alpha}; expected a fraction in (0, 1).")
        if self.bootstrap < 0 or self.cpus_per_model < 0 or self.gpus_per_model < 0:
            raise ConfigError(
                f"EvalConfig: bootstrap={self.bootstrap}, cpus_per_model={self.cpus_per_model}, "
                f"gpus_per_model={self.gpus_per_model}; expected values ≥ 0."
            )


def _sweep(entries: Any) -> list[Any]:
    """``eval.lambdas`` normalised: each a float ≥ 0, ``auto`` or ``grid``, in order, once."""
    if isinstance(entries, str | int | float):
        entries = [entries]
    out: list[Any] = []
    for x in entries:
        if isinstance(x, str) and x.strip().lower() == GRID:
            lam: Any = GRID
        else:
            lam = parse_lambda(x, "eval.lambdas entry")
            if lam == BEST:
                raise ConfigError(
                    "eval.lambdas holds 'best'; it lists the λ to measure: numbers, 'auto' or "
                    "'grid' (lambda_reg=best then uses the best of them)."
                )
        if lam not in out:
            out.append(lam)
    return out


LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServeConfig:
    """``trak-dist serve``: attribution of new targets over HTTP (``trak_dist.serve``).

    Attributes:
        host, port: where the HTTP proxy listens. A host beyond loopback needs ``token_file``.
        token_file: a file holding the bearer token every request must send
            (``Authorization: Bearer …``); required unless ``host`` is loopback.
        require_token: ask for the token on loopback too.
        num_replicas, cpus_per_replica, gpus_per_replica: Ray Serve replicas and their resources.
        max_targets: most targets in one request; max_k: largest k (at most n).
        max_body_bytes: largest request body.
        max_batch_size, batch_wait_s: requests one replica batches into one pass over the index
            (every request waiting when the replica is free, at most max_batch_size), and how
            long a batch smaller than that waits for more, unless the replica's last 3 batches
            held one request each (0: never; a busy replica's queue batches anyway; a lone
            client does not wait).
        index_dtype: ``auto`` (the store's dtype: exact), ``float32`` or ``float16`` (half the
            memory and half the bytes per pass; exact for a float16 store, else each entry
            rounded to 11 bits: see docs/serve.md).
        index_mmap_dir: memory-map the index from ``.npy`` files written there (None: in memory).
        block_rows: train rows per matmul block of the top-k pass (None: 4 MiB of float32).
        ann: a faiss ``index_factory`` string (e.g. ``IVF1024,Flat``) for an approximate
            inner-product index instead of the exact pass (needs ``faiss-cpu``); None: exact.
        ann_nprobe: inverted lists an IVF index searches per query (more: better recall).
        featurize_batch: targets per gradient call. 1 (the default) makes a reply independent
            of the requests batched with it; more is faster on a GPU, but a target's float32
            row then depends in its last bit on its batch, which rounding to a float16 store
            can make a difference of ~1e-4 in its scores.
        device: where targets are featurised and scored (``auto``: cuda if present).
        text_chars: text jobs: each proponent's / opponent's text in a reply is cut to this
            many characters (then "…").
        max_explain: most train examples one ``POST /explain`` decomposes into per-token
            scores (causal LMs; each costs one gradient per counted token and checkpoint).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    token_file: str | None = None
    require_token: bool = False
    num_replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    max_targets: int = 64
    max_k: int = 1000
    max_body_bytes: int = 1 << 20
    max_batch_size: int = 16
    batch_wait_s: float = 0.02
    index_dtype: str = "auto"
    index_mmap_dir: str | None = None
    block_rows: int | None = None
    ann: str | None = None
    ann_nprobe: int = 16
    featurize_batch: int = 1
    device: str = "auto"
    text_chars: int = 300
    max_explain: int = 20

    def __post_init__(self) -> None:
        _positive(
            self,
            "num_replicas",
            "max_targets",
            "max_k",
            "max_body_bytes",
            "max_batch_size",
            "block_rows",
            "featurize_batch",
            "ann_nprobe",
            "text_chars",
            "max_explain",
        )
        _one_of(self, "index_dtype", ("auto", "float32", "float16"))
        _one_of(self, "device", DEVICES)
        if not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            raise ConfigError(f"ServeConfig.port={self.port!r}; expected an integer in [1, 65535].")
        if not self.host:
            raise ConfigError("ServeConfig.host is empty; expected e.g. 127.0.0.1 or 0.0.0.0.")
        if self.cpus_per_replica < 0 or self.gpus_per_replica < 0 or self.batch_wait_s < 0:
            raise ConfigError(
                f"ServeConfig: cpus_per_replica={self.cpus_per_replica}, gpus_per_replica="
                f"{self.gpus_per_replica}, batch_wait_s={self.batch_wait_s}; expected values ≥ 0."
            )
        if self.host not in LOOPBACK and not self.token_file:
            raise ConfigError(
                f"serve.host={self.host} accepts connections from other machines, so every "
                "request must carry a token: set serve.token_file to a file holding one (e.g. "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))' > token`), or "
                "bind serve.host=127.0.0.1."
            )
