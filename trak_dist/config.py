"""Job configuration: frozen dataclasses, one per concern, validated on construction. Data only:
nothing here reads a file or imports a model; ``trak_dist.pipeline.resolve_inputs`` turns the
paths into what the workers load (``model=hf``, ``data=text``).

The same classes are the Python API's arguments and the Hydra CLI's structured configs
(``trak_dist._compose`` registers them), so YAML and Python agree. Fields typed ``Any`` take either
an import path ``"package.module:name"`` (CLI, YAML) or the object itself (Python API).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

# re-exported: the sub-commands' sections live in _config_services.py (this module's length)
from trak_dist._config_services import LOOPBACK as LOOPBACK
from trak_dist._config_services import EvalConfig as EvalConfig
from trak_dist._config_services import ServeConfig as ServeConfig
from trak_dist._validate import DEVICES, _one_of, _positive
from trak_dist.errors import ConfigError
from trak_dist.gradients import ENGINES
from trak_dist.projection import BACKENDS, ProjectionKind
from trak_dist.remote import check_options
from trak_dist.scoring import ScoringConfig as ScoringConfig  # re-exported: a JobConfig section
from trak_dist.scoring import parse_lambda
from trak_dist.store import CODECS, MIN_CHUNK_ROWS
from trak_dist.tasks import CURVATURES, FISHER_DRAWS, task_defaults

CLUSTER_KINDS = ("local", "inprocess", "ray", "slurm")
HF_DTYPES = ("float32", "bfloat16", "float16")
HF_FACTORY = "trak_dist.hf:from_checkpoints"
DATA_FORMATS = ("custom", "text")
TEXT_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
TEXT_ROLES = ("text", "text_pair", "prompt", "completion", "messages", "label")
AUTO = "auto"  # proj_dim / projection.kind: chosen per task (``tasks.task_defaults``)


@dataclass(frozen=True)
class ModelConfig:
    """The network and its checkpoints.

    Attributes:
        factory: callable (or its import path) returning the ``nn.Module``; called with
            ``kwargs`` on every worker.
        kwargs: keyword arguments of ``factory``.
        checkpoints: a list of state-dict files (``torch.save``), or a callable / import path
            returning such a list. Checkpoint k gets model_id k. With ``factory="hf"``: Hugging
            Face model (or PEFT adapter) directories, a glob of them, or Hub names
            ``org/name[@revision]`` resolved into the Hugging Face cache and pinned to their
            commits (``trak_dist.hf``; a local path that exists wins).
        dtype: ``factory="hf"`` only: ``float32``, ``bfloat16`` or ``float16`` weights.
        base: ``factory="hf"`` only: the base model directory (or Hub name) of PEFT adapters
            (None: the one named in ``adapter_config.json``).
        trust_remote_code: ``factory="hf"`` only: let ``transformers`` run the checkpoint's
            own Python code (off: only model classes that ship with ``transformers``).
    """

    factory: Any = "trak_dist.examples.digits:make_model"
    kwargs: dict[str, Any] = field(default_factory=dict)
    checkpoints: Any = "trak_dist.examples.digits:checkpoints"
    dtype: str = "float32"
    base: str | None = None
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        _one_of(self, "dtype", HF_DTYPES)


@dataclass(frozen=True)
class TextConfig:
    """``data.format=text`` (``data=text``): train and targets are JSONL/JSON, CSV or Parquet
    files, or ``datasets.save_to_disk`` directories, tokenised by ``trak_dist.hf``.

    Attributes:
        tokenizer: a tokenizer directory (None: the first checkpoint's, or its base's).
        max_length: tokens per row (None: the model's ``max_position_embeddings`` if known).
        truncate: cut rows longer than ``max_length`` (counted and logged); False: a row that
            is too long is an error naming it.
        columns: column names by role (``text``, ``text_pair``, ``prompt``, ``completion``,
            ``messages``, ``label``) where they differ from the role's name.
    """

    tokenizer: str | None = None
    max_length: int | None = None
    truncate: bool = False
    columns: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _positive(self, "max_length")
        unknown = sorted(set(self.columns) - set(TEXT_ROLES))
        if unknown:
            raise ConfigError(
                f"TextConfig.columns names roles {unknown}; expected roles among {TEXT_ROLES}."
            )


@dataclass(frozen=True)
class DataConfig:
    """Train and target sets: callables (or import paths) returning map-style datasets whose
    items are tuples of tensors (e.g. ``(image, label)``) or dicts of them (Hugging Face style),
    batched with ``default_collate``.

    Attributes:
        train_fingerprint: identifies the train set in the store; when None it is computed
            from every item, read once per run (see ``dataset_fingerprint``). Given, it is
            trusted, and rows are still checked against their stored hashes when reused.
        format: ``custom`` (the above) or ``text``: train and targets are text files or
            ``save_to_disk`` directories tokenised per ``text`` (``trak_dist.hf``); two paths
            ending in .jsonl, .json, .csv or .parquet select ``text`` by themselves.
        text: how ``format=text`` reads and tokenises.
    """

    train: Any = "trak_dist.examples.digits:train_set"
    targets: Any = "trak_dist.examples.digits:target_set"
    kwargs: dict[str, Any] = field(default_factory=dict)
    train_fingerprint: str | None = None
    format: str = "custom"
    text: TextConfig = field(default_factory=TextConfig)

    def __post_init__(self) -> None:
        _one_of(self, "format", DATA_FORMATS)
        if self.format == "custom" and all(
            isinstance(ref, str) and ref.lower().endswith(TEXT_SUFFIXES)
            for ref in (self.train, self.targets)
        ):
            # data files, not import paths (e.g. trak_dist.run(train="train.jsonl", …))
            object.__setattr__(self, "format", "text")


@dataclass(frozen=True)
class TaskConfig:
    """The model output function (``image_classification``, ``text_classification``,
    ``causal_lm`` or an import path / instance of a ``ModelOutput``) and the parameters to
    differentiate."""

    name: Any = "image_classification"
    kwargs: dict[str, Any] = field(default_factory=dict)
    grad_wrt: list[str] | None = None


@dataclass(frozen=True)
class ProjectionConfig:
    """P (docs/projection.md). ``featurize_dim`` is the stored width; every ``proj_dim`` up to it
    is scored from the prefix (None: the job's proj_dim). ``kind="auto"`` (the default) is
    resolved by JobConfig per task: ``kronecker`` for causal LMs, ``rademacher`` otherwise."""

    kind: str = AUTO
    featurize_dim: int | None = None
    seed: int = 0
    backend: str = "auto"

    def __post_init__(self) -> None:
        _one_of(self, "kind", (AUTO, *(k.value for k in ProjectionKind)))
        _one_of(self, "backend", BACKENDS)
        _positive(self, "featurize_dim")
        if not 0 <= self.seed < 2**64:
            raise ConfigError(f"ProjectionConfig.seed={self.seed}; expected [0, 2**64).")


@dataclass(frozen=True)
class FeaturizeConfig:
    """How workers featurise.

    Attributes:
        micro_batch: samples per gradient call: sets a worker's peak memory.
        gradient_engine: ``auto`` (hooks when the task has ``get_outputs`` and every selected
            parameter's module has a hook rule, else vmap), ``vmap`` or ``hooks``.
        shard_rows: rows per task, a multiple of ``store.chunk_rows`` (None: ~4 per worker).
        half_precision: store X in float16 (traker's default) instead of float32.
        device: ``auto`` (cuda when the worker has a GPU), ``cpu`` or ``cuda``.
        max_task_retries: reruns of a failed shard before the job fails.
        curvature: K's Gram: ``xtx`` (TRAK's XᵀX), ``fisher`` (GᵀG of the sampled-label
            Fisher's rows, a second backward, stored beside X: ``tasks/_sampled.py``) or
            ``auto`` (``tasks.task_defaults``: ``fisher`` for ``causal_lm``, else ``xtx``;
            docs/design.md, invariant 4).
        fisher_draws: label draws per row for ``fisher``; K is the mean of their Grams.
    """

    micro_batch: int = 64
    shard_rows: int | None = None
    half_precision: bool = True
    device: str = "auto"
    max_task_retries: int = 2
    gradient_engine: str = "auto"
    curvature: str = "auto"
    fisher_draws: int = FISHER_DRAWS

    def __post_init__(self) -> None:
        _positive(self, "micro_batch", "shard_rows", "fisher_draws")
        _one_of(self, "curvature", CURVATURES)
        _one_of(self, "device", DEVICES)
        _one_of(self, "gradient_engine", ENGINES)
        if self.max_task_retries < 0:
            raise ConfigError(f"max_task_retries={self.max_task_retries}; expected ≥ 0.")


@dataclass(frozen=True)
class StoreConfig:
    """Where the Zarr store lives and how it is laid out.

    Attributes:
        path: a directory, or an object store URL (``s3://bucket/prefix/run.zarr``,
            ``gs://…``, ``az://…``; ``pip install 'trak_dist[s3]'``).
        chunk_rows: rows per chunk, the unit of writes and commits; ``auto``: an existing
            store's, else about 16 MiB of rows per chunk, 256 to n/8 rows
            (``store.resolve_chunk_rows``).
        options: an object store's settings (``endpoint``, ``region``, ``allow_http``, …;
            ``retry_timeout`` and ``lease_ttl`` in seconds); credentials come from the
            environment (``AWS_ACCESS_KEY_ID``, …), never from here (docs/cluster.md).
    """

    path: str = "trak_store.zarr"
    codec: str = "none"
    chunk_rows: Any = AUTO
    overwrite: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _one_of(self, "codec", CODECS)
        if self.chunk_rows != AUTO:
            _positive(self, "chunk_rows")
        check_options(self.path, self.options)


@dataclass(frozen=True)
class ClusterConfig:
    """Where workers run.

    Attributes:
        kind: ``local`` (Ray started in-process), ``inprocess`` (no Ray: every stage in this
            process, for small jobs and debugging; ``trak-dist eval`` and ``serve`` start a
            local Ray), ``ray`` (connect to ``address``, default ``ray job submit``'s
            ``RAY_ADDRESS``), ``slurm`` (inside an allocation set up by ``launch/``; as ``ray``).
        num_workers: worker actors; None: as many as the cluster fits (one per GPU, or its
            CPUs divided by cpus_per_worker).
        cpus_per_worker, gpus_per_worker: Ray resources of each worker (gpus_per_worker=None:
            1 when the cluster has GPUs, else 0).
        max_worker_restarts: replacements of dead workers before the job fails.
        start_timeout_s: how long to wait for a first worker when none can be scheduled.
    """

    kind: str = "local"
    address: str | None = None
    num_workers: int | None = 2
    cpus_per_worker: float = 1.0
    gpus_per_worker: float | None = None
    max_worker_restarts: int = 3
    object_store_mb: int = 256
    reducer_gpus: float = 0.0
    start_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        _one_of(self, "kind", CLUSTER_KINDS)
        _positive(self, "num_workers", "object_store_mb")
        if self.max_worker_restarts < 0:
            raise ConfigError(f"max_worker_restarts={self.max_worker_restarts}; expected ≥ 0.")


@dataclass(frozen=True)
class JobConfig:
    """A whole trak_dist job. ``proj_dim`` and ``lambda_reg`` are the sweep axes; ``report`` is
    the file stem of the run report (``.md`` and ``.json``), None for none. ``lambda_reg`` is a
    number ≥ 0 (traker's absolute λ) or ``"auto"`` (per checkpoint from K's spectrum, see
    ``trak_dist.scoring.auto_lambda``)."""

    proj_dim: Any = AUTO
    lambda_reg: Any = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    projection: ProjectionConfig = field(default_factory=ProjectionConfig)
    featurize: FeaturizeConfig = field(default_factory=FeaturizeConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    progress: bool = True
    report: str | None = "trak_report"

    def __post_init__(self) -> None:
        # frozen: the per-task defaults resolved in place (``task_defaults``)
        auto = task_defaults(self.task.name)
        if self.proj_dim == AUTO:
            object.__setattr__(self, "proj_dim", auto.proj_dim)
        if self.projection.kind == AUTO:
            object.__setattr__(self, "projection", replace(self.projection, kind=auto.projection))
        _positive(self, "proj_dim")
        # frozen: normalise in place ("auto" or a float) once validated
        object.__setattr__(self, "lambda_reg", parse_lambda(self.lambda_reg, "lambda_reg"))
        width = self.featurize_dim
        if width < self.proj_dim:
            raise ConfigError(
                f"projection.featurize_dim={width} is below proj_dim={self.proj_dim}; the stored "
                "features must be at least as wide as any proj_dim scored from them."
            )
        shard = self.featurize.shard_rows
        chunk = self.store.chunk_rows
        # auto's chunks are powers of two of at least MIN_CHUNK_ROWS rows, halved to divide
        # the shard: a multiple of the least is all it needs
        least = MIN_CHUNK_ROWS if chunk == AUTO else chunk
        if shard is not None and shard % least:
            what = f"{chunk}" if chunk != AUTO else f"auto (at least {MIN_CHUNK_ROWS} rows)"
            raise ConfigError(
                f"featurize.shard_rows={shard} is not a multiple of store.chunk_rows={what}; "
                "shards must cover whole chunks (concurrent writers must never share a chunk)."
            )

    @property
    def featurize_dim(self) -> int:
        """The width the train features are stored at (an identity projection keeps all d)."""
        return self.projection.featurize_dim or self.proj_dim
