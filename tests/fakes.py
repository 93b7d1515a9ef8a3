"""Fakes of our own parts, for fast logic tests (never instead of the real-part tests).

* :class:`FakeGroup`: a SessionGroup over a row-wise model ``y = 2x``, ``z = x + 1``; records
  every engine call; can fail on a marker value, block until released, or answer outputs that
  are not per row.
* :class:`FakeManager`: a ModelManager for the server's transports (no engine, no model files):
  one version whose signature is :data:`SIGNATURE`, every request answered :data:`ANSWER`,
  admin actions recorded. :class:`FailingManager`: every request fails with a given code.
* :func:`fake_models` / :func:`fake_processor`: the server's models and a C ABI Processor built
  over such managers.
"""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

import numpy as np

from processor.store.model_version import ModelVersion
from processor.config import ModelConfig
from processor.processor import Processor
from processor.served_model import ModelRegistry, ServedModel


class FakeGroup:
    """See the module doc. Thread-safe."""

    lanes = 2
    serves_natively = False  # its run holds the GIL: never run in place on an event loop

    def __init__(self, fail_on: float | None = None, not_per_row: bool = False) -> None:
        self.fail_on = fail_on
        self.not_per_row = not_per_row
        self.calls: list[tuple[int, tuple[str, ...]]] = []  # (rows, fetches) per engine call
        self.lanes_used: list[int] = []
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()  # set when a call starts (to hold a batch thread)
        self._lock = threading.Lock()

    def hold(self) -> None:
        """Calls block from now on until :attr:`release` is set."""
        self.release.clear()
        self.entered.clear()

    def _compute(self, feeds: dict[str, np.ndarray], fetches: tuple[str, ...]) -> list[np.ndarray]:
        x = feeds["x"]
        with self._lock:
            self.calls.append((len(x) if x.ndim else 0, fetches))
        self.entered.set()
        self.release.wait(30)
        if self.fail_on is not None and (x == self.fail_on).any():
            raise ValueError(f"the model refused the value {self.fail_on}")
        outputs = {"y": x * 2, "z": x + 1}
        if self.not_per_row:
            outputs["y"] = x.sum(axis=0, keepdims=True)
        return [outputs[f] for f in fetches]

    def run(self, feeds, fetches):
        return self._compute(feeds, fetches)

    def run_on(self, lane, feeds, fetches):
        self.lanes_used.append(lane)
        return self._compute(feeds, fetches)

    def run_traced(self, feeds, fetches, full=True):
        return 0, self._compute(feeds, fetches), None


SIGNATURE = {
    "signature_name": "serving_default",
    "inputs": [{"name": "x", "type": "DT_FLOAT", "shape": [-1, 1]}],
    "outputs": [{"name": "y", "type": "DT_FLOAT", "shape": [-1, 1]}],
}
ANSWER = b"\x0a\x00"  # what serve() answers for any non-empty request


class _Signature:
    name = "serving_default"

    def describe(self) -> dict:
        return SIGNATURE


class _Group:
    signature = _Signature()
    version = ModelVersion(1, -1)  # answers name the version that answered
    serves_natively = False  # an event loop never runs it in place (DataPlane.submit)

    def serve(self, data) -> bytes:
        return ANSWER


class _Handle:
    group = _Group()

    def release(self) -> None:
        pass


class FakeManager:
    """See the module doc."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state, self.ready, self.last_error, self.stats = "ready", True, None, {}
        self.features = None
        self.actions: list[str] = []
        self.pinned: int | None = None

    def acquire_handle(self, number=None):
        return _Handle()

    @contextlib.contextmanager
    def acquire(self, number=None):
        yield _Handle.group

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def served_version(self):
        return None

    def served_versions(self) -> list:
        return []

    def serves(self, number: int) -> bool:
        return False

    def serves_several(self) -> bool:
        return False

    def memory(self) -> dict:
        return {}

    def default_group(self):
        return _Handle.group

    def follow_default(self, listener) -> None:
        listener(_Handle.group)

    def info(self) -> dict:
        return {"name": self.name, "state": self.state, "version": None, "pinned": self.pinned is not None}

    # admin
    def discover(self):
        return SimpleNamespace(label="1")

    def load(self, version) -> None:
        self.actions.append("reload")

    def reload(self) -> None:
        self.load(self.discover())

    def pin(self, version: int) -> None:
        self.actions.append(f"pin {version}")
        self.pinned = version

    def unpin(self) -> None:
        self.actions.append("unpin")
        self.pinned = None

    def rollback(self) -> None:
        self.actions.append("rollback")


class FailingManager(FakeManager):
    """A FakeManager whose every request fails with ``code``."""

    def __init__(self, name: str, code) -> None:
        super().__init__(name)
        self.code = code

    def message(self) -> str:
        return f"fake failure {self.code.name} from {self.name}"

    def acquire_handle(self, number=None):
        from processor.errors import ProcessorError

        raise ProcessorError(self.message(), self.code)

    @contextlib.contextmanager
    def acquire(self, number=None):
        self.acquire_handle()
        yield


# --- the ModelManager's parts: a store, an engine, a clock ------------------------------------
#
# * :class:`FakeStore`: an in-memory ModelStore holding one SavedModel and one run of full and
#   delta checkpoints by step (the real layout reader, ``latest_version``, reads it).
# * :class:`FakeBackend`: the engine, through ``VersionLoader(open_group=..., warm=...)``: opens a
#   :class:`FakeServingGroup` per version, reads deltas, warms up; ``broken`` steps fail.
#   :class:`FailingBackend`: every open (or every warmup) fails. :class:`SlowBackend`: every open
#   waits until released (to act while a load is under way).
# * :class:`ManualClock`: ``monotonic()`` / ``sleep()`` that move only when told.
# :func:`fake_manager` builds a ModelManager over them.


class ManualClock:
    """A clock for the manager (``monotonic``, ``sleep``): time moves by :meth:`advance` and
    by ``sleep`` (which returns at once, having moved the clock). Records the sleeps."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeStore:
    """See the section doc. Paths are the real layout's: ``<run>/model.ckpt-<step>.index`` with
    one data shard, deltas in ``<run>/.incremental_checkpoint/``. ``remote``: materialize
    returns a copy under ``/cache`` (as a remote store does); ``unreachable``: it raises
    Unavailable. Records every materialized version. Thread-safe enough for the tests (the
    manager reads it under its lock)."""

    savedmodel_dir = "/fake/savedmodel"
    checkpoint_dir = "/fake/run"
    delta_dir = "/fake/run/.incremental_checkpoint"

    def __init__(self, fulls=(), remote: bool = False) -> None:
        self.files: set[str] = {f"{self.savedmodel_dir}/saved_model.pb", f"{self.checkpoint_dir}/checkpoint"}
        self.parents: dict[int, int | None] = {}  # delta step -> the step it was computed against
        self.remote = remote
        self.unreachable = False
        self.materialized: list = []
        for step in fulls:
            self.add_full(step)

    # what a trainer does
    def add_full(self, step: int) -> str:
        return self._add(self.checkpoint_dir, "model.ckpt", step)

    def add_delta(self, step: int, parent: int | None = None) -> str:
        """A delta at ``step``; ``parent``: the step it says it was computed against (None:
        it does not say)."""
        self.parents[step] = parent
        return self._add(self.delta_dir, "incremental_model.ckpt", step)

    def add_partial_full(self, step: int) -> None:
        """A full still being copied in: its index, no data shard."""
        self.files.add(f"{self.checkpoint_dir}/model.ckpt-{step}.index")

    def _add(self, directory: str, name: str, step: int) -> str:
        prefix = f"{directory}/{name}-{step}"
        self.files |= {f"{prefix}.index", f"{prefix}.data-00000-of-00001"}
        return prefix

    def config(self, **overrides):
        """A ModelConfig over this store (no watcher unless asked)."""
        from processor.config import ModelConfig

        return ModelConfig.from_dict({"savedmodel_dir": self.savedmodel_dir, "checkpoint_dir": self.checkpoint_dir,
                                      "file_system_poll_wait_seconds": 0, **overrides})

    # the ModelStore interface the manager and the layout reader use
    @property
    def is_local(self) -> bool:
        return not self.remote

    def strip(self, path: str) -> str:
        return path.removeprefix("fake://")

    def url(self, path: str) -> str:
        return f"fake://{path}" if self.remote and path else path

    def exists(self, path: str) -> bool:
        path = path.rstrip("/")
        return path in self.files or any(f.startswith(path + "/") for f in self.files)

    def list_dirs(self, path: str) -> list[str]:
        path = path.rstrip("/")
        return sorted({f"{path}/{f[len(path) + 1:].split('/')[0]}" for f in self.files
                       if f.startswith(path + "/") and "/" in f[len(path) + 1:]})

    def list_files(self, path: str) -> list[str]:
        path = path.rstrip("/")
        return sorted(f[len(path) + 1:] for f in self.files
                      if f.startswith(path + "/") and "/" not in f[len(path) + 1:])

    def mtime(self, path: str) -> float:
        return 0.0

    def materialize(self, version):
        from dataclasses import replace

        from processor.errors import Unavailable

        if self.unreachable:
            raise Unavailable(f"cannot fetch version {version.label} from the fake store: unreachable")
        self.materialized.append(version)
        if not self.remote:
            return version
        local = lambda p: f"/cache{p}" if p else ""  # noqa: E731
        return replace(version, savedmodel_dir=local(version.savedmodel_dir),
                       full_prefix=local(version.full_prefix), delta_prefix=local(version.delta_prefix),
                       delta_chain=tuple((s, local(p)) for s, p in version.delta_chain),
                       run_dir=local(version.run_dir))


class FakeServingGroup(FakeGroup):
    """A servable the manager can hold: a :class:`FakeGroup` (it answers requests) with the
    version it serves, the parameters it holds (the full step and the delta steps applied, in
    order), where it was opened from, and whether it was closed."""

    def __init__(self, backend: FakeBackend, version, opened_from) -> None:
        super().__init__()
        self.backend = backend
        self.version = version
        self.opened_from = opened_from  # the local copy it was opened on
        self.deltas: list[int] = []
        self.closed = 0  # how many times close() was called (1 when closed once)
        self.signature = _Signature()

    @property
    def params(self) -> tuple[int, tuple[int, ...]]:
        return self.opened_from.full_step, tuple(self.deltas)

    def apply_delta(self, delta, version) -> float:
        self.deltas.append(delta.step)
        self.version = version
        return 0.0

    def memory(self) -> dict:
        return {"weights": 0, "tables": 0, "caches": 0, "shared": 0, "device": 0}

    def describe(self) -> dict:
        return {"session_num": self.lanes, "engine": "fake"}

    def close(self) -> None:
        self.closed += 1


class FakeBackend:
    """See the section doc. ``broken``: steps (full or delta) whose checkpoint cannot be read."""

    def __init__(self, store: FakeStore, broken=()) -> None:
        self.store = store
        self.broken = set(broken)
        self.groups: list[FakeServingGroup] = []  # every group opened, in order
        self.warmups = 0
        self.staged: list[int] = []

    def loader(self, config, store=None):
        from processor.manager.loader import VersionLoader

        return VersionLoader(config, store or self.store, None, open_group=self.open, warm=self.warm)

    # open_group and warm of the VersionLoader
    def open(self, config, version, features=None, batching=None, pinned=False) -> FakeServingGroup:
        from processor.checkpoint.delta import CheckpointError

        if version.full_step in self.broken:
            raise CheckpointError(f"cannot read checkpoint {version.full_prefix!r}: truncated")
        group = FakeServingGroup(self, version, version)
        group.pinned = pinned  # loaded to be pinned (the loader's word to the engine)
        self.groups.append(group)
        return group

    def warm(self, group, local, warmup_file, config) -> dict:
        self.warmups += 1
        return {"source": "fake", "runs": group.lanes}

    # what the loader asks of group.backend
    def read_delta(self, prefix: str, step: int):
        from processor.checkpoint.delta import CheckpointError, Delta

        if step in self.broken:
            raise CheckpointError(f"cannot read delta {prefix!r}: truncated")
        return Delta(step, rows={"emb": (np.array([step], np.int64), np.ones((1, 2), np.float32))},
                     parent_step=self.store.parents.get(step))

    def stage_delta(self, delta) -> None:
        self.staged.append(delta.step)


class FailingBackend(FakeBackend):
    """A FakeBackend whose every open (``at="open"``) or every warmup (``at="warmup"``) fails."""

    def __init__(self, store: FakeStore, at: str = "open") -> None:
        super().__init__(store)
        self.at = at

    def open(self, config, version, features=None, batching=None, pinned=False) -> FakeServingGroup:
        from processor.errors import Internal

        if self.at == "open":
            raise Internal("the fake engine refused the model")
        return super().open(config, version, features)

    def warm(self, group, local, warmup_file, config) -> dict:
        if self.at == "warmup":
            raise ValueError("warmup request failed")
        return super().warm(group, local, warmup_file, config)


class SlowBackend(FakeBackend):
    """A FakeBackend whose opens wait until :attr:`release` is set; :attr:`entered` is set when
    one starts waiting. Released from the start unless :meth:`hold` was called."""

    def __init__(self, store: FakeStore, broken=()) -> None:
        super().__init__(store, broken)
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()

    def hold(self) -> None:
        self.release.clear()
        self.entered.clear()

    def open(self, config, version, features=None, batching=None, pinned=False) -> FakeServingGroup:
        self.entered.set()
        if not self.release.wait(30):
            raise TimeoutError("SlowBackend was never released")
        return super().open(config, version, features)


def fake_manager(store: FakeStore, backend: FakeBackend | None = None, clock: ManualClock | None = None,
                 name: str = "m", **config):
    """A real ModelManager over ``store`` and ``backend`` (a FakeBackend by default) on a
    ManualClock, with no watcher unless ``file_system_poll_wait_seconds`` is given."""
    from processor.manager.model_manager import ModelManager

    config = store.config(**config)
    backend = backend or FakeBackend(store)
    return ModelManager(name, config, store=store, loader=backend.loader(config),
                        clock=clock or ManualClock())


def fake_models(deployment, managers: dict) -> ModelRegistry:
    """The deployment's models named in ``managers``, each served by its fake manager (no
    tracer, batching or prediction log): for ``ServingApp(deployment, models=...)``."""
    return ModelRegistry(ServedModel(m.name, m.config, manager=managers[m.name], raw_config=m.raw_config,
                                     version_labels=m.version_labels, threads=m.threads)
                         for m in deployment.models if m.name in managers)


def fake_processor(name: str, manager) -> Processor:
    """A C ABI Processor whose one model is served by ``manager``."""
    return Processor(ModelRegistry([ServedModel(name, ModelConfig(savedmodel_dir="/nonexistent"), manager=manager)]))
