"""ServedModel: one model composed once (config, ModelManager, timeline tracer, batching,
prediction logger, version labels); ModelRegistry: the served models by name, used by both the
C ABI's :class:`~processor.processor.Processor` (one model) and the server's runtime (a
deployment).

Edges reach a model's lifecycle (readiness, state, admin actions, model info) through its
ServedModel and its requests through the :class:`~processor.dataplane.DataPlane`; neither
touches the :class:`~processor.manager.model_manager.ModelManager` itself.

Thread-safe: every method may be called from any thread (the manager serializes updates).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

from . import tensorflow_env
from .batching.model_batching import ModelBatching
from .config import ModelConfig
from .echo import cut, shorten
from .errors import NotFound, ProcessorError, Unavailable
from .manager.model_manager import ModelManager
from .prediction_log import PredictionLogger
from .redaction import redact_url
from .request import version_number
from .routing import RoutingSettings, VersionRouter
from .shadow import ShadowRunner
from .tracing import Tracer

log = logging.getLogger(__name__)


class ModelSpec(Protocol):
    """What a served model is composed from: one entry of a deployment's ``models`` (the server
    validates the deployment file into such entries, beside its own settings, which the core
    never reads)."""

    name: str
    config: ModelConfig
    raw_config: Mapping[str, Any]  # the model_config as given (accepted-and-unused keys reported from it)
    routing: RoutingSettings  # version labels, traffic split, shadow
    threads: int  # the threads that run its requests (reported in info())


class ManagerPort(Protocol):
    """What a ServedModel and the DataPlane use of a model's manager: the
    :class:`~processor.manager.model_manager.ModelManager`, or a test's fake of it."""

    state: Any
    ready: bool
    last_error: str | None
    stats: dict[str, Any]
    features: Any  # the FeatureStore once started, or None (embeddings in TensorFlow)

    def start(self) -> None: ...
    def close(self) -> None: ...
    def acquire_handle(self, number: int | None = None) -> Any: ...
    def served_version(self) -> Any: ...
    def served_versions(self) -> list[Any]: ...
    def serves(self, number: int) -> bool: ...
    def serves_several(self) -> bool: ...
    def memory(self) -> dict[str, dict[str, int]]: ...
    def info(self) -> dict[str, Any]: ...
    def discover(self) -> Any: ...
    def load(self, version: Any) -> None: ...
    def reload(self) -> None: ...
    def pin(self, version: int) -> None: ...
    def unpin(self) -> None: ...
    def rollback(self) -> None: ...


class ServedModel:
    """See the module doc. Built from its parts (``manager`` and the optional ``tracer``,
    ``batching``, ``prediction_log``); :meth:`compose` builds them from a config. Cheap: nothing
    loads or starts before :meth:`start`."""

    def __init__(self, name: str, config: ModelConfig, *, manager: ManagerPort, tracer: Tracer | None = None,
                 batching: ModelBatching | None = None, prediction_log: PredictionLogger | None = None,
                 raw_config: Mapping[str, Any] | None = None, version_labels: Mapping[str, int] | None = None,
                 routing: RoutingSettings | None = None, threads: int | None = None,
                 environment: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.config = config
        self.manager = manager
        self.tracer = tracer
        self.batching = batching
        self.prediction_log = prediction_log
        self.raw_config = dict(raw_config or {})
        if routing is None:
            routing = RoutingSettings(version_labels=dict(version_labels or {}))
        # labels, traffic split and shadow; changed at run time by update_routing
        self.router = VersionRouter(name, routing, serves=manager.serves)
        self.shadow = ShadowRunner(name)  # its thread starts with the first shadowed call
        self.threads = threads
        self.environment = dict(environment or {})

    @classmethod
    def compose(cls, name: str, config: ModelConfig, **details: Any) -> ServedModel:
        """The model ``config`` describes: its ModelManager, timeline tracer, batching and
        prediction logger (``details``: the other keyword arguments of the constructor, and
        ``budget``, the manager's MemoryBudget). A ConfigError names ``timeline_path`` or
        ``logging_config.path`` when unusable."""
        tracer = Tracer.from_config(name, config)
        # One batching per model: its row budget bounds every queue (each version's native one
        # and the reference), see processor/batching/model_batching.py.
        batching = ModelBatching(name, config.batching) if config.batching is not None else None
        try:
            manager = ModelManager(name, config, batching=batching, budget=details.pop("budget", None))
            prediction_log = PredictionLogger.from_config(name, config)
        except BaseException:
            if tracer is not None:
                tracer.close()
            raise
        return cls(name, config, manager=manager, tracer=tracer, batching=batching,
                   prediction_log=prediction_log, **details)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the batching threads, load and warm the served versions; raises ProcessorError
        (the model is then ``failed``). Labels, arms or a shadow naming a version that is not
        served are logged (and reported in :meth:`info`); requests through them are NOT_FOUND
        (a traffic arm's go to the default)."""
        if self.batching is not None:
            self.batching.start()
        self.manager.start()
        dangling = self.router.dangling()
        if dangling:
            log.warning("model %s: %s", self.name, "; ".join(
                f"{what} names version {n}, which is not served" for what, n in dangling.items()))

    @property
    def version_labels(self) -> Mapping[str, int]:
        """Label -> version number, as the router holds them now."""
        return self.router.labels

    def memory(self) -> dict[str, dict[str, int]]:
        """Bytes each served version holds, by part, by version number (the manager's)."""
        return self.manager.memory()

    @property
    def routes_versions(self) -> bool:
        """Whether a call naming no version may be answered by another version than the
        default: several versions serve, or the traffic is split."""
        return bool(self.router.routing.arms) or self.manager.serves_several()

    def update_routing(self, changes: Mapping[str, Any], require_served: bool = True) -> dict[str, Any]:
        """Change labels, traffic and shadow at run time (:meth:`VersionRouter.update`: validated
        whole, and with ``require_served`` against the served versions; InvalidArgument and
        nothing changed otherwise); returns the routing now."""
        self.router.update(changes, require_served)
        return self.router.describe()  # logged by the caller (the admin action, the reload report)

    @property
    def ready(self) -> bool:
        return self.manager.ready

    @property
    def state(self):
        """The served version's lifecycle state (see :mod:`processor.manager`)."""
        return self.manager.state

    @property
    def last_error(self) -> str | None:
        return self.manager.last_error

    @property
    def stats(self) -> dict[str, Any]:
        return self.manager.stats

    def served_version(self):
        """The served ModelVersion (the default, the newest), or None before the first load."""
        return self.manager.served_version()

    def served_versions(self) -> list:
        """Every served ModelVersion, ascending by number (several under a ``model_version_policy``
        naming more than one); empty before the first load."""
        return self.manager.served_versions()

    def reload(self) -> None:
        """Load the versions the store (and the version policy) name now, afresh."""
        self.manager.reload()

    def rollback(self, version: int | None = None) -> None:
        """Serve the previously served version, or full checkpoint ``version``; both pin it."""
        if version is None:
            self.manager.rollback()
        else:
            self.manager.pin(version)

    def pin(self, version: int) -> None:
        """Serve full checkpoint ``version`` and stop following newer ones."""
        self.manager.pin(version)

    def unpin(self) -> None:
        """Follow the newest version again."""
        self.manager.unpin()

    def drain(self, timeout: float | None = None) -> None:
        """Run what the batching queue holds; new batched requests are refused from now on."""
        if self.batching is not None and not self.batching.close(timeout):
            log.warning("model %s: batching queue not drained in %s s", self.name, timeout)

    def close(self) -> None:
        """Stop the watcher and close the served version, then write the traces and prediction
        logs still queued (the current log file is closed and renamed into place)."""
        try:
            self.shadow.close()
            self.manager.close()
        finally:
            try:
                if self.tracer is not None:
                    self.tracer.close()
            finally:
                if self.prediction_log is not None:
                    self.prediction_log.close()

    # --- what is served ---------------------------------------------------------------------

    def model_path(self) -> str:
        """The served full checkpoint prefix (or TF Serving version directory) as a URL without
        credentials; "" when the SavedModel's own variables serve (DeepRec's ServingModelInfo)."""
        version = self.manager.served_version()
        if version is None:
            return ""
        source = version.savedmodel_dir if version.is_version_dir else version.full_prefix
        return redact_url(self.manager.store.url(source)) if source else ""

    def feature_store_metrics(self) -> dict[str, Any] | None:
        """The feature store's counters (:meth:`processor.features.store_metrics.StoreMetrics.snapshot`),
        or None when the tables are TensorFlow variables."""
        features = self.manager.features
        return features.metrics.snapshot() if features is not None else None

    def context_stats(self) -> dict[str, Any] | None:
        """The default version's context counters and cache (:meth:`processor.context.runner
        .ContextRunner.stats`; counted per served version, so a new version starts at 0), or None
        when no version serves, its requests cannot broadcast, or the manager is a test fake.
        Never raises: a metrics scrape reads it."""
        acquire = getattr(self.manager, "acquire", None)
        if acquire is None or not self.manager.ready:
            return None
        try:
            with acquire() as group:
                context = getattr(group, "context", None)
                return context.stats() if context is not None and context.may_broadcast else None
        except ProcessorError:  # nothing serves (any code a manager answers with)
            return None

    def freshness(self) -> dict[str, Any] | None:
        """How old each served version's parameters are (the manager's ``freshness_info``:
        :mod:`processor.manager.freshness`), or None from a manager without it (test fakes)."""
        describe = getattr(self.manager, "freshness_info", None)
        return describe() if describe is not None else None

    def batching_info(self) -> dict[str, Any] | None:
        """The batching settings and counters (the reference queue and the served version's
        native one), or None without batching."""
        if self.batching is None:
            return None
        native = None
        try:
            with self.manager.acquire() as group:
                native = group.batch_stats()
        except Unavailable:  # no version served yet (or any more): the Python queue's counters
            pass
        return self.batching.describe(native)

    def info(self) -> dict[str, Any]:
        """Everything a user may want to know: state, version, signature, sessions, settings."""
        info = self.manager.info()
        batching = self.batching_info()
        if batching is not None:
            info["batching"] = batching
        info["config"] = self.config.redacted()
        info["accepted_not_active"] = self.config.not_yet_active()
        info["accepted_ignored"] = self.config.foreign_keys(self.raw_config)
        info["version_labels"] = dict(self.version_labels)
        info["routing"] = self.router.describe()
        info["shadow"] = self.shadow.stats()
        if self.threads is not None:
            info["inference_threads"] = self.threads
        info["environment"] = self.environment
        if self.tracer is not None:
            info["timeline"] = self.tracer.describe()
        if self.prediction_log is not None:
            info["prediction_log"] = self.prediction_log.describe()
        served = self.manager.served_version()
        info["tf_serving_version"] = version_number(served) if served is not None else None
        return info


class ModelRegistry:
    """The served models by name (in deployment order). A live model set changes it
    (:meth:`put`, :meth:`pop`: ``server/model_set.py``); each change swaps in a new dict, so a
    reader (a lookup, an iteration) always sees one whole set, without a lock."""

    def __init__(self, models: Iterable[ServedModel]) -> None:
        self._models = {m.name: m for m in models}

    def put(self, model: ServedModel) -> ServedModel | None:
        """Serve ``model`` under its name (added last, or in the place of the one it replaces);
        returns the one it replaced."""
        old = self._models.get(model.name)
        self._models = {**self._models, model.name: model}
        return old

    def pop(self, name: str) -> ServedModel | None:
        """Stop serving model ``name``; returns it (None: not served)."""
        models = dict(self._models)
        old = models.pop(name, None)
        self._models = models
        return old

    @classmethod
    def from_entries(cls, entries: Iterable[ModelSpec], budget=None) -> ModelRegistry:
        """Every model ``entries`` describe (a deployment's models), composed
        (:meth:`ServedModel.compose`); ``budget``: the server's MemoryBudget (None: the process's)."""
        entries = list(entries)
        environment = apply_environment([m.config for m in entries])  # before TF starts
        return cls(compose_entry(m, environment, budget) for m in entries)

    @classmethod
    def single(cls, name: str, config: ModelConfig, raw_config: Mapping[str, Any] | None = None) -> ModelRegistry:
        """One model (the C ABI's processor)."""
        environment = apply_environment([config])
        return cls([ServedModel.compose(name, config, raw_config=raw_config, environment=environment)])

    def get(self, name: str) -> ServedModel:
        """The model; NotFound naming the model asked for and how many are served (not their
        names: an answer to any client, who may not be told what else this server serves)."""
        model = self._models.get(name)
        if model is None:
            # TF Serving's words first: its clients and readiness helpers look for "Servable"
            count = len(self._models)
            raise NotFound(f"Servable not found for request: Latest({cut(name)}) (unknown model "
                           f"{shorten(name, 80)}; this server serves {count} model{'s' if count != 1 else ''})")
        return model

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._models.values())

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def drain(self, timeout: float | None = None) -> None:
        """Run what every batching queue holds (see :meth:`ServedModel.drain`)."""
        for model in self:
            model.drain(timeout)

    def close(self) -> None:
        """Close every model; a failure is logged and the others still close."""
        for model in self:
            try:
                model.close()
            except Exception:
                log.exception("closing model %s failed", model.name)


def compose_entry(entry: ModelSpec, environment: Mapping[str, str] | None = None, budget=None) -> ServedModel:
    """The model ``entry`` (a deployment's models[] entry) describes, composed; ``budget``: the
    MemoryBudget its loads are checked against (None: the process's)."""
    return ServedModel.compose(entry.name, entry.config, raw_config=entry.raw_config, routing=entry.routing,
                               threads=entry.threads, environment=environment, budget=budget)


def apply_environment(configs: list[ModelConfig]) -> dict[str, str]:
    """Export ``omp_num_threads`` / ``kmp_blocktime`` as DeepRec does (process-wide variables),
    and TensorFlow's switches serving sets its own way (:mod:`processor.tensorflow_env`).

    One process serves every model, so when models disagree the largest value is used and the
    conflict is logged. Reports whether each can still take effect (the engine reads them once).
    """
    applied: dict[str, str] = tensorflow_env.apply()
    for key, attr in (("OMP_NUM_THREADS", "omp_num_threads"), ("KMP_BLOCKTIME", "kmp_blocktime")):
        values = [getattr(c, attr) for c in configs if getattr(c, attr) is not None]
        if not values:
            continue
        value = max(values)
        if len(set(values)) > 1:
            log.warning("%s differs between models %s; the process uses %s", attr, values, value)
        late = "tensorflow" in sys.modules
        os.environ[key] = str(value)
        applied[key] = f"{value} (set after the engine started: takes effect on restart)" if late else str(value)
    return applied
