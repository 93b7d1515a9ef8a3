"""VersionLoader: turns a version the store names into a serving group, or into deltas applied.

The steps of one load, in order:

1. **materialize**: a local copy of the version's files (:meth:`ModelStore.materialize`: the
   same paths for a local store, a cached download for a remote one);
2. **open**: a new group over the local copy (``open_group``, by default
   :func:`~processor.engine.open_group.open_session_group`); the group serves, and reports,
   the store's version, not the local paths;
3. **apply deltas**: every delta of the version, each read and checked (its parent step must be
   the step it follows here) before the first is applied;
4. **warm up** every lane (``warm``, by default the warmup plan of :mod:`.warmup`);
5. **close on failure**: if 3 or 4 fail the new group is closed and the error says which
   version was rejected; nothing of it stays open.


:meth:`VersionLoader.apply_delta` updates a live group in place instead (materialize, read and
check the newer links, apply them). The loader swaps nothing and keeps no state between calls:
the :class:`~processor.manager.model_manager.ModelManager` decides what to load and swaps.
Errors are :class:`~processor.errors.ProcessorError`.

With OpenTelemetry on (:mod:`processor.spans`), a load is a trace of its own (``model.load``:
``materialize``, ``open``, one ``delta.apply`` per delta, ``warmup``) and so is a delta
application (``model.delta``: ``materialize``, ``delta.read``, one ``delta.apply`` per delta);
a failed step carries the error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import load_priority, memory, spans
from ..checkpoint.delta import CheckpointError
from ..config import ModelConfig
from ..engine.open_group import open_session_group
from ..import_guard import first_tensorflow_import
from ..errors import as_processor_error
from ..store.model_store import ModelStore
from ..store.model_version import ModelVersion
from .freshness import Written, written_of
from .warmup import plan_warmup, warm_up


def warm_with_plan(group, local: ModelVersion, warmup_file: bytes | None, config: ModelConfig) -> dict:
    """The default warmup: the plan for the group's signature (the warmup file, TF Serving's
    records or synthetic requests) run on every lane; returns the warmup report."""
    return warm_up(group, plan_warmup(group.signature, local.savedmodel_dir, warmup_file), config=config)


@dataclass(frozen=True)
class Loaded:
    """A group that opened, took its deltas and warmed up, its warmup report, and when the step
    it serves was written (:mod:`.freshness`)."""

    group: Any
    warmup: dict | None
    written: Written | None = None


@dataclass(frozen=True)
class DeltaApplied:
    """What :meth:`VersionLoader.apply_delta` did: requests held (s), rows written, dense tensors,
    ids removed, and when the step it serves now was written (:mod:`.freshness`)."""

    hold_seconds: float
    rows: int
    dense: int
    removed: int = 0
    written: Written | None = None


class VersionLoader:
    """See the module doc. ``batching``: the model's ModelBatching, which every group it opens
    gets (their native queues share its row budget). ``open_group(config, version, features=...,
    batching=...)`` and ``warm(group, local_version, warmup_file, config)`` may be replaced (tests
    use fakes). ``model``: the model's name, for its traces."""

    def __init__(self, config: ModelConfig, store: ModelStore, features=None,
                 open_group: Callable[..., Any] = open_session_group,
                 warm: Callable[..., dict | None] = warm_with_plan, batching=None, model: str = "") -> None:
        self.model = model
        self.config = config
        self.store = store
        self.features = features
        self.batching = batching
        self._open_group = open_group
        self._warm = warm

    def file_bytes(self, version: ModelVersion) -> int:
        """The bytes of ``version``'s parameter files, before they are read (the fit check's
        estimate, :mod:`processor.memory_budget`); 0 when the store cannot size them."""
        try:
            return memory.estimate_load_bytes(self.store, version, self.config)
        except Exception:  # noqa: BLE001 - an estimate only: a store that cannot size files counts 0
            return 0

    def materialize(self, version: ModelVersion) -> ModelVersion:
        return self.store.materialize(version)

    def open(self, version: ModelVersion, local: ModelVersion, pinned: bool = False):
        """A new group over ``local`` that serves ``version`` (no delta applied yet)."""
        try:
            group = self._open_group(self.config, local, features=self.features, batching=self.batching,
                                     pinned=pinned)
        except Exception as exc:
            raise as_processor_error(exc) from exc
        group.version = version  # loaded from the local copy; serves (and reports) the store's version
        return group

    def load(self, version: ModelVersion, warmup_file: bytes | None = None,
             on_warming: Callable[[], None] | None = None, pinned: bool = False) -> Loaded:
        """Materialize, open, apply every delta, warm up (``on_warming`` is called first);
        on failure close the new group and raise. The caller swaps the group in. ``pinned``:
        the version is loaded to be pinned (an admin pin or rollback); with workers, its ONNX
        parameters then get a segment of the pin's own, which no delta of a worker still
        following the newest version writes."""
        with first_tensorflow_import():  # other models load on other threads
            with spans.background("model.load", self._attributes(version, {"sp.pinned": pinned})):
                return self._load(version, warmup_file, on_warming, pinned)

    def _attributes(self, version: ModelVersion, more: dict[str, Any]) -> dict[str, Any]:
        """A load's or a delta's trace attributes."""
        return {"sp.model": self.model, "sp.model.version": version.label, "sp.backend": self.config.backend,
                **more}

    def _load(self, version: ModelVersion, warmup_file: bytes | None,
              on_warming: Callable[[], None] | None, pinned: bool) -> Loaded:
        with spans.stage("materialize"):
            local = self.materialize(version)
        with spans.stage("open"):
            group = self.open(version, local, pinned)
        try:
            deltas = self.read_deltas(group.backend, local, None)  # every link checked first
            for delta in deltas:
                self._apply(group, delta, version)
            if on_warming is not None:
                on_warming()
            # a leaf: the warm-up's runs make no spans of their own (hundreds of them)
            with spans.stage("warmup", leaf=True) as warming:
                report = self._warm(group, local, warmup_file, self.config)
                if isinstance(report, dict):
                    warming.set("sp.warmup.runs", int(report.get("runs", 0)) + int(report.get("batch_runs", 0)))
        except Exception as exc:
            group.close()
            err = as_processor_error(exc)
            raise type(err)(f"version {version.label} rejected: {err.message}", err.code) from exc
        return Loaded(group, report, written_of(self.store, version, local, deltas[-1].written_at if deltas else None))

    def apply_delta(self, group, version: ModelVersion) -> DeltaApplied:
        """Bring the live ``group`` (serving ``group.version``) to ``version``, a version of
        the same full with newer deltas: all read and checked first, then applied in order."""
        with first_tensorflow_import():  # other models load on other threads
            with spans.background("model.delta", self._attributes(version, {"sp.served_version": group.version.label})):
                return self._apply_delta(group, version)

    def _apply_delta(self, group, version: ModelVersion) -> DeltaApplied:
        # read and checked below serving priority, as a load is; the apply holds requests at the
        # gate, so it runs at serving priority (a lowered writer would keep them waiting longer)
        with load_priority.lowered(self.config.load_nice):
            with spans.stage("materialize"):
                local = self.materialize(version)
            with spans.stage("delta.read"):
                deltas = self.read_deltas(group.backend, local, group.version)  # all checked first
        hold = sum(self._apply(group, delta, version) for delta in deltas)
        return DeltaApplied(hold, sum(d.changed_rows for d in deltas), sum(len(d.dense) for d in deltas),
                            sum(d.removed_rows for d in deltas),
                            written_of(self.store, version, local, deltas[-1].written_at if deltas else None))

    @staticmethod
    def _apply(group, delta, version: ModelVersion) -> float:
        """One checked delta into ``group``: its shared rows staged (written before the gate, in
        a shared store), then applied under the gate; the seconds requests were held."""
        with spans.stage("delta.apply", leaf=True) as applying:
            group.backend.stage_delta(delta)
            hold = group.apply_delta(delta, version)
            applying.set("sp.delta.step", int(delta.step))
            applying.set("sp.delta.rows", int(delta.changed_rows))
            applying.set("sp.hold_seconds", float(hold))
        return hold

    def read_deltas(self, backend, local: ModelVersion, served: ModelVersion | None) -> list:
        """The deltas that bring ``served`` (None: the bare full) to ``local``, read and checked,
        in order; CheckpointError if one was computed against another step than the one it
        follows here (a link of a chain missing, or a delta written after another full)."""
        chained = self.config.delta_mode == "chain"
        if not chained:  # the newest delta alone, computed against the full
            links, previous = local.delta_chain[-1:], local.full_step
        elif served is None or not served.delta_chain:
            links, previous = local.delta_chain, local.full_step
        else:  # the links after the ones served
            links, previous = local.delta_chain[len(served.delta_chain):], served.delta_step
        deltas = []
        for step, prefix in links:
            delta = backend.read_delta(prefix, step)
            if delta.parent_step is not None and delta.parent_step != previous:
                raise CheckpointError(f"delta {step} was computed against step {delta.parent_step} but follows "
                                      f"step {previous} here (a missing link, or a delta of another full)")
            deltas.append(delta)
            if chained:
                previous = step
        return deltas
