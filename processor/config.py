"""ModelConfig: DeepRec's ``model_config`` JSON, typed and validated once.

Every key of DeepRec's processor is accepted with its documented type and default (DeepRec's
``serving/processor`` model_config documentation). Departures from the original, on purpose:

* a wrong type or value is a :class:`~processor.errors.ConfigError` naming the key (the original
  aborts the process on some of them). Types are strict: ``"2"`` or ``true`` is not a number,
  ``"yes"`` or ``1`` is not a boolean, ``NaN``/``Infinity`` are refused; an integer is accepted
  where a number is expected. On purpose, for DeepRec compatibility: ``omp_num_threads`` and
  ``kmp_blocktime`` also accept a string of digits (DeepRec reads them "as string"), and
  ``cpusets``, ``gpu_ids_list`` and ``ev_storage_size`` are strings (lists work too for the last two);
* ``cpusets`` without ``use_per_session_threads`` is refused (nothing could be pinned);
* a config that is not UTF-8 is refused as such; values echoed in messages are shortened;
* an unknown key is an error, with the closest known key suggested, unless it is a key of
  DeepRec/EAS deployments that this processor does not use (listed in :data:`FOREIGN_KEYS`),
  which is accepted and reported in model info; so is a DeepRec key this processor has nothing
  to apply to (:data:`IGNORED_KEYS`: validated with DeepRec's type, then reported the same way);
* ``signature_name``, ``serialize_protocol``, ``feature_store_type`` and ``model_store_type``
  have defaults (DeepRec requires them); ``feature_store_type`` accepts ``local`` and ``memory``;
* ``cpusets`` accepts single cores (``"3;4-6"``) and mixed lists (``"1-3,5"``);
* ``init_timeout_minutes`` is active: how long ``initialize`` waits for a first servable version
  (0, the default, fails at once with a clear message; -1 waits forever as DeepRec does);
* ``redis_connect_timeout_seconds`` (ours): an unreachable Redis (or every seed of a cluster)
  fails ``initialize`` after at most this long, before the model is loaded (or is waited for,
  like a first version, up to ``init_timeout_minutes``).

The objects are immutable; they are safe to share between threads.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .batching.settings import BatchingConfig
from .config_text import describe_validation_error, expect_object, parse_json, unknown_key_message
from .context.settings import ContextCacheConfig
from .echo import shorten  # also imported from here by the engines and the deployment
from .errors import ConfigError
from .prediction_log.settings import LoggingConfig
from .store.version_policy import VersionPolicy

# Keys of DeepRec/EAS model_config files that this processor accepts and does not use.
FOREIGN_KEYS: frozenset[str] = frozenset({
    "processor", "processor_type", "model_entry", "metadata", "token", "name",
    "processor_path", "processor_entry", "warm_up_data_path",
})

# DeepRec processor keys that this processor validates (with DeepRec's type) and has nothing to
# apply to; reported with FOREIGN_KEYS in model info ("accepted_ignored") when a config sets them.
IGNORED_KEYS: frozenset[str] = frozenset({
    # DeepRec's TensorFlow fork runs model updates on a global "user_model_update_intra" pool.
    # Stock TensorFlow has one intra-op pool per process (intra_op_parallelism_threads) and no way
    # to run one call on another; ONNX Runtime updates are in-place array writes that run no graph.
    # (model_update_inter_threads does apply: the TensorFlow backend's update inter-op pool.)
    "model_update_intra_threads",
})

# Keys a later part of the processor implements: validated now, reported as "accepted, not yet
# active" in model info when present with a non-default value. Shrinks as features land.
NOT_YET_ACTIVE: dict[str, str] = {
    "shard_embedding": "embedding sharding",
}

FeatureStoreType = Literal["memory", "local", "redis", "cluster_redis"]

def _default_op_threads() -> int:
    # DeepRec: SCHEDULABLE_CPUS / 2; here the CPUs this process may run on.
    return max(1, len(os.sched_getaffinity(0)) // 2)


def parse_cpusets(text: str) -> tuple[tuple[int, ...], ...]:
    """Parse ``"0-3;4-7"``, ``"0,1;2,3"``, ``"3;4-6"`` or ``"1-3,5"`` into one CPU tuple per group.

    Raises ValueError with a message naming the bad group.
    """
    groups: list[tuple[int, ...]] = []
    for raw_group in text.split(";"):
        group = raw_group.strip()
        if not group:
            raise ValueError(f"empty cpu group in {shorten(text)}")
        cpus: list[int] = []
        for part in group.split(","):
            part = part.strip()
            try:
                if "-" in part:
                    lo_s, hi_s = part.split("-")
                    lo, hi = int(lo_s), int(hi_s)
                    if lo > hi:
                        raise ValueError
                    cpus.extend(range(lo, hi + 1))
                else:
                    cpus.append(int(part))
            except ValueError:
                raise ValueError(f"bad cpu range {shorten(part, 40)} in group {shorten(group, 60)}") from None
        if any(c < 0 for c in cpus):
            raise ValueError(f"negative cpu in group {shorten(group)}")
        if len(set(cpus)) != len(cpus):
            raise ValueError(f"repeated cpu in group {shorten(group)}")
        groups.append(tuple(cpus))
    return tuple(groups)


def _parse_int_list(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        try:
            return tuple(int(p) for p in parts)
        except ValueError:
            raise ValueError("must be a comma-separated list of integers") from None
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise ValueError("must be a list of integers or a string like \"0,1\"")


class ModelConfig(BaseModel):
    """One model's configuration (the DeepRec ``model_config`` keys plus a few of our own)."""

    # strict: a value of the wrong JSON type is refused, not converted (see the module doc)
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True, strict=True,
                              allow_inf_nan=False)

    # --- model location ---------------------------------------------------------------------
    savedmodel_dir: str = Field(min_length=1)
    checkpoint_dir: str | None = None
    model_store_type: Literal["local", "s3", "oss"] = "local"
    oss_endpoint: str | None = None
    oss_access_id: str | None = None
    oss_access_key: str | None = None
    signature_name: str = Field("serving_default", min_length=1)
    serialize_protocol: Literal["protobuf"] = "protobuf"
    backend: Literal["auto", "tensorflow", "onnxruntime"] = "auto"
    # Ours: shared libraries of custom TensorFlow ops (TFRA, SOK, a team's own), loaded with
    # tf.load_op_library, in order, before the SavedModel; a missing one is a ConfigError.
    custom_op_libraries: tuple[str, ...] = ()
    # Ours: TF Serving's enable_serialization_as_tensor_content: its gRPC Predict writes numeric
    # outputs as tensor_content bytes; off (TF Serving's default), in the typed fields (float_val...).
    enable_serialization_as_tensor_content: bool = False
    init_timeout_minutes: float = Field(0, ge=-1)

    # --- session group ----------------------------------------------------------------------
    session_num: int = Field(1, ge=1, le=256)
    select_session_policy: Literal["MOD", "RR"] = "MOD"
    use_per_session_threads: bool = False
    cpusets: tuple[tuple[int, ...], ...] = ()
    enable_inline_execute: bool = False
    inter_op_parallelism_threads: int = Field(default_factory=_default_op_threads, ge=0, le=1024)
    intra_op_parallelism_threads: int = Field(default_factory=_default_op_threads, ge=0, le=1024)
    omp_num_threads: int | None = Field(None, ge=1)
    kmp_blocktime: int | None = Field(None, ge=0)
    gpu_ids_list: tuple[int, ...] = ()
    use_multi_stream: bool = False
    # Ours: ONNX Runtime GPU lanes on the native engine (its own sessions with the CUDA provider,
    # outside Python) instead of the Python binding (tests/gpu, on an H100). Off by default: its
    # sessions hold their own weights, so in-place parameter updates are refused (a full reload works).
    native_engine_gpu_lanes: bool = False
    enable_device_placement_optimization: bool = False
    # Ours: serve a GPU config on the CPU (same lane count) when no GPU is visible, instead of failing.
    gpu_fallback_to_cpu: bool = False

    # Large requests (processor/engine/splitting.py). TF Serving's max_execution_batch_size: a
    # request with more rows is cut into chunks of at most this many rows run in parallel on the
    # lanes (one version), outputs joined in order; None: never split. max_request_rows: a request
    # with more rows is refused (413 / RESOURCE_EXHAUSTED); None: no limit.
    max_execution_batch_size: int | None = Field(4096, ge=1)
    max_request_rows: int | None = Field(None, ge=1)
    # Ours: server-side batching (TF Serving's batching parameters); None: every request alone.
    batching: BatchingConfig | None = Field(None, strict=False)  # a JSON object; its keys are strict
    # Ours: prediction logging (TF Serving's logging_config, with a collector); None: off.
    logging_config: LoggingConfig | None = Field(None, strict=False)  # a JSON object; its keys are strict
    # Ours (issue 47, processor/context/): the inputs a ranking request may send as one row for
    # every row (the user's), whose part of the model runs once per request; None: any input
    # whose first dimension is free may come as one row (broadcast by tiling, computed per row).
    # context_cache keeps that part's results across requests (needs context_inputs).
    context_inputs: tuple[str, ...] | None = None
    context_cache: ContextCacheConfig | None = Field(None, strict=False)  # a JSON object; its keys are strict

    # --- updates, warmup, rollback ----------------------------------------------------------
    model_update_inter_threads: int = Field(0, ge=0, le=1024)
    model_update_intra_threads: int = Field(0, ge=0, le=1024)  # validated, unused: IGNORED_KEYS
    warmup_file_name: str = ""
    # Ours: batch sizes every lane is warmed up at (rows of the warmup request repeated); None:
    # from batching, else powers of two up to the warmup requests' largest batch (8 if synthetic).
    warmup_batch_sizes: tuple[int, ...] | None = None
    # Ours: a version's load and warm-up (and a delta's reading) run this many nice steps below
    # serving priority (processor/load_priority.py); 0: at serving priority. At most 18: 19 is
    # the shadow copies'.
    load_nice: int = Field(10, ge=0, le=18)
    file_system_poll_wait_seconds: float = Field(2.0, ge=0)
    # TF Serving's: a version that failed to load is tried again at most this many times (the
    # first loads at start included), every load_retry_interval_micros, then given up (a newer
    # version is still tried). None (ours): retried for ever, with a backoff from the poll interval.
    max_num_load_retries: int | None = Field(None, ge=0, le=1_000_000)
    load_retry_interval_micros: int | None = Field(None, ge=0, le=86_400_000_000)
    restore_model_version: int | None = Field(None, ge=0)
    # Ours (TF Serving's model_version_policy): which versions serve side by side; the default
    # serves the newest only. A JSON object, its keys strict (processor/store/version_policy.py).
    model_version_policy: VersionPolicy = Field(default_factory=VersionPolicy, strict=False)
    # Ours: "cumulative" deltas (DeepRec's: each holds every change since its full) or "chain"
    # (each holds the changes since the previous delta; a version applies all of them in order).
    delta_mode: Literal["cumulative", "chain"] = "cumulative"
    # Ours (Monolith's expirable embeddings): at each delta of step S, drop the rows whose last
    # update (their version, else their checkpoint's step) is more than this many steps before S,
    # as if the delta removed them; DRAM / DRAM+SSD stores only. None: rows never expire.
    row_ttl_steps: int | None = Field(None, ge=1)

    # --- feature store ----------------------------------------------------------------------
    feature_store_type: FeatureStoreType = "memory"
    redis_url: str | None = None
    redis_password: str | None = None
    # Ours: connecting to Redis (each node, and at initialize the whole reachability check: every
    # seed of a cluster and the first answers) takes at most this long; a dead endpoint fails fast.
    redis_connect_timeout_seconds: float = Field(1.0, gt=0, le=60)
    read_thread_num: int = Field(4, ge=1, le=96)
    update_thread_num: int = Field(2, ge=1, le=16)
    lock_timeout: int = Field(900, ge=1)
    ev_storage_type: Literal[0, 1, 12] = 0
    ev_storage_path: str = ""
    ev_storage_size: tuple[int, ...] = ()
    # Ours: bytes of the hot-row cache in front of Redis / Redis Cluster, per served version
    # (CLOCK eviction; 0 turns it off). See processor/features/row_cache.py.
    redis_cache_bytes: int = Field(256 << 20, ge=0, le=1 << 40)
    # Ours: how the DRAM, DRAM+SSD and Redis stores hold embedding rows; float16 halves the bytes
    # (rows are widened to float32 at lookup; a table with values past float16's range is refused).
    embedding_dtype: Literal["float32", "float16"] = "float32"

    # --- sharding (DeepRec keys) ------------------------------------------------------------
    shard_embedding: bool = False
    embedding_names: str = ""
    shard_instance_count: int | None = Field(None, ge=1)
    id_type: Literal["string", "int64"] | None = None

    # --- timeline ---------------------------------------------------------------------------
    timeline_start_step: int | None = Field(None, ge=0)
    timeline_interval_step: int | None = Field(None, ge=1)
    timeline_trace_count: int | None = Field(None, ge=1)
    timeline_path: str | None = None

    @field_validator("cpusets", mode="before")
    @classmethod
    def _cpusets(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_cpusets(value) if value.strip() else ()
        raise ValueError("must be a string like \"0-3;4-7\"")

    @field_validator("gpu_ids_list", mode="before")
    @classmethod
    def _gpu_ids(cls, value: Any) -> Any:
        ids = _parse_int_list(value)
        if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
            raise ValueError("must list distinct non-negative ids")
        return ids

    @field_validator("ev_storage_size", mode="before")
    @classmethod
    def _ev_sizes(cls, value: Any) -> Any:
        sizes = _parse_int_list(value)
        if any(s <= 0 for s in sizes) or len(sizes) > 4:
            raise ValueError("must list at most 4 positive byte sizes")
        return sizes

    @field_validator("custom_op_libraries", mode="before")
    @classmethod
    def _op_libraries(cls, value: Any) -> Any:
        if (not isinstance(value, (list, tuple)) or len(value) > 64
                or any(not isinstance(v, str) or not v.strip() for v in value)):
            raise ValueError("must be a list of paths of shared libraries, like [\"/opt/ops/libmy_ops.so\"]")
        return tuple(v.strip() for v in value)

    @field_validator("context_inputs", mode="before")
    @classmethod
    def _context_inputs(cls, value: Any) -> Any:
        if value is None:
            return None
        if (not isinstance(value, list) or not value or len(value) > 1024
                or any(not isinstance(v, str) or not v.strip() for v in value)):
            raise ValueError("must be a non-empty list of input names, like [\"user_seq\", \"user_dense\"]")
        names = tuple(v.strip() for v in value)
        if len(set(names)) != len(names):
            raise ValueError("names an input twice")
        return names

    @field_validator("warmup_batch_sizes", mode="before")
    @classmethod
    def _warmup_batch_sizes(cls, value: Any) -> Any:
        if value is None:
            return None
        if (not isinstance(value, list) or not value or len(value) > 16
                or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
            raise ValueError("must be a list of 1 to 16 integers, like [1, 8, 32]")
        if any(v < 1 or v > 1 << 16 for v in value) or any(b <= a for a, b in zip(value, value[1:])):
            raise ValueError("must be strictly increasing batch sizes from 1 to 65536")
        return tuple(value)

    @field_validator("omp_num_threads", "kmp_blocktime", mode="before")
    @classmethod
    def _int_like(cls, value: Any) -> Any:
        # DeepRec reads these "as string": accept "4" and 4 alike, on purpose (the one exception to
        # strict types). Anything else ("many", true, 4.0) is refused by the strict int check.
        return int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else value

    @field_validator("ev_storage_type", mode="before")
    @classmethod
    def _storage_type(cls, value: Any) -> Any:
        # a Literal of ints would take true and 1.0 even in strict mode
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be the integer 0, 1 or 12")
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> ModelConfig:
        total_sessions = self.session_num * max(1, len(self.gpu_ids_list))
        if self.cpusets and not self.use_per_session_threads:
            raise ValueError(
                "cpusets: needs use_per_session_threads true: cpusets pin each session's own "
                "inter-op pool, and without per-session threads the sessions share one pool, so "
                "nothing would be pinned; set use_per_session_threads or drop cpusets")
        if self.cpusets and len(self.cpusets) != total_sessions:
            raise ValueError(
                f"cpusets: {len(self.cpusets)} cpu group(s) given but the group has "
                f"{total_sessions} session(s); give one group per session")
        if self.feature_store_type in ("redis", "cluster_redis") and not self.redis_url:
            raise ValueError(f"redis_url: required when feature_store_type is {self.feature_store_type!r}")
        if self.feature_store_type in ("redis", "cluster_redis"):
            from .features.redis_url import parse_redis_url

            try:
                parse_redis_url(self.redis_url, cluster=self.feature_store_type == "cluster_redis")
            except ValueError as exc:
                raise ValueError(f"redis_url: {exc}") from None
        if self.model_store_type != "local":
            for key in ("savedmodel_dir", "checkpoint_dir"):
                path = getattr(self, key)
                if path is not None and self.model_store_type not in path:
                    raise ValueError(
                        f"{key}: model_store_type is {self.model_store_type!r} but {key} "
                        f"{shorten(path)} is not a {self.model_store_type} URL")
        if self.model_store_type == "oss":
            for key in ("oss_endpoint", "oss_access_id", "oss_access_key"):
                if not getattr(self, key):
                    raise ValueError(f"{key}: required when model_store_type is 'oss'")
        timeline = (self.timeline_start_step, self.timeline_interval_step,
                    self.timeline_trace_count, self.timeline_path)
        if any(v is not None for v in timeline) and any(v is None for v in timeline):
            missing = [k for k, v in zip(
                ("timeline_start_step", "timeline_interval_step", "timeline_trace_count",
                 "timeline_path"), timeline) if v is None]
            raise ValueError(f"{missing[0]}: the timeline_* keys go together; missing {', '.join(missing)}")
        if self.timeline_path is not None and not (
                self.timeline_path.startswith("/") or "://" in self.timeline_path):
            raise ValueError(f"timeline_path: must be an absolute path or a URL, got {shorten(self.timeline_path)}")
        if self.row_ttl_steps is not None and self.feature_store_type in ("redis", "cluster_redis"):
            raise ValueError("row_ttl_steps: the Redis stores keep no row's step; it needs the DRAM or DRAM+SSD "
                             "store (ev_storage_type 1 or 12)")
        if self.context_cache is not None and self.context_inputs is None:
            raise ValueError("context_cache: needs context_inputs (the cache keeps what the declared context "
                             "inputs' part of the model computes)")
        if self.ev_storage_type == 12 and not self.ev_storage_path:
            raise ValueError("ev_storage_path: required when ev_storage_type is 12 (DRAM+SSD)")
        if (self.embedding_dtype != "float32" and self.ev_storage_type == 0
                and self.feature_store_type not in ("redis", "cluster_redis")):
            raise ValueError(f"embedding_dtype: {self.embedding_dtype} needs the tables in a feature store "
                             f"(ev_storage_type 1 or 12, or feature_store_type 'redis' / 'cluster_redis')")
        if self.shard_embedding:
            if self.feature_store_type not in ("local", "memory"):
                raise ValueError("shard_embedding: needs feature_store_type 'local' or 'memory'")
            for key in ("embedding_names", "shard_instance_count", "id_type"):
                if not getattr(self, key):
                    raise ValueError(f"{key}: required when shard_embedding is true")
        return self

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def from_json(cls, text: str | bytes) -> ModelConfig:
        """Parse and validate a JSON document; raise ConfigError naming the first bad key."""
        data = parse_json(text, "model_config")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> ModelConfig:
        """Validate a mapping; raise ConfigError naming the first bad key."""
        expect_object(data, "model_config")
        known = set(cls.model_fields)
        fields: dict[str, Any] = {}
        for key, value in data.items():
            if key in known:
                fields[key] = value
            elif key not in FOREIGN_KEYS:
                raise ConfigError(unknown_key_message(key, known, "model_config"))
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc)) from None

    # --- reporting --------------------------------------------------------------------------

    def foreign_keys(self, data: dict[str, Any]) -> list[str]:
        """Keys of ``data`` accepted for DeepRec/EAS compatibility and not used (FOREIGN_KEYS and
        IGNORED_KEYS)."""
        return sorted(k for k in data if k in FOREIGN_KEYS or k in IGNORED_KEYS)

    def not_yet_active(self) -> dict[str, str]:
        """Keys set to a non-default value whose feature is not active in this build."""
        defaults = type(self)(savedmodel_dir=self.savedmodel_dir)
        return {key: feature for key, feature in NOT_YET_ACTIVE.items()
                if getattr(self, key) != getattr(defaults, key)}

    def redacted(self) -> dict[str, Any]:
        """The config as a dict with secrets masked, for model info and logs."""
        out = self.model_dump(mode="json")
        for key in ("oss_access_key", "oss_access_id", "redis_password"):
            if out.get(key):
                out[key] = "***"
        return out
