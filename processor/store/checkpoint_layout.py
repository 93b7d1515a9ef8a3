"""Reads the checkpoint layout (docs/checkpoints.md) and names the version that should be served.

```
<checkpoint_dir>/<run>/checkpoint                          newest run = newest mtime of this file
<checkpoint_dir>/<run>/model.ckpt-<step>.index|data-*      full checkpoints; served = highest step
<checkpoint_dir>/<run>/.incremental_checkpoint/            deltas (or .incremental_ckpt/)
    incremental_model.ckpt-<step>.index|data-*             served = the served full's newest delta
```

A delta belongs to the full checkpoint it follows: for full F, only deltas with
F < step < (the next full's step) apply to it (a delta written after full F2 holds changes against
F2's parameters; applied to an older full it would serve parameters that never existed).

TF Serving's layout works too, with no ``checkpoint_dir``: ``savedmodel_dir`` may be a model base
directory whose numeric subdirectories are versions (``<base>/<number>/saved_model.pb``). Each
complete one is a full version whose step is its number (``ModelVersion(number, -1,
savedmodel_dir=<base>/<number>, run_dir=<base>)``, parameters from its own ``variables/``);
the highest number serves, and a pin names a number. Deltas never apply to such a version.

Several versions serve side by side under a ``model_version_policy``
(:mod:`processor.store.version_policy`, :func:`served_versions`): TF Serving's version
directories, or in DeepRec's layout the full checkpoints of the newest run, each with its own
newest delta.

A checkpoint counts only when its ``.index`` and every ``.data-NNNNN-of-MMMMM`` shard it names
exist, so a checkpoint still being copied in is not picked up; likewise a version directory
counts only once it holds ``saved_model.pb`` (or ``.pbtxt``) and a complete
``variables/variables`` checkpoint (or a ``.onnx`` model). Pure functions over a
:class:`~processor.store.model_store.ModelStore`; thread-safe.
"""

from __future__ import annotations

import posixpath
import re

from ..errors import ConfigError, NotFound, Unavailable
from .model_store import ModelStore
from .model_version import ModelVersion
from .version_policy import VersionPolicy

DELTA_DIRS = (".incremental_checkpoint", ".incremental_ckpt")
_STEP = re.compile(r"^(?P<prefix>.+)-(?P<step>\d+)\.index$")
_SHARD = re.compile(r"\.data-(\d{5})-of-(\d{5})$")


def find_savedmodel(store: ModelStore, savedmodel_dir: str) -> str:
    """Return ``savedmodel_dir`` if it holds saved_model.pb(txt) or a .onnx model; else raise Unavailable."""
    if _holds_model(set(store.list_files(savedmodel_dir))):
        return savedmodel_dir
    raise Unavailable(f"savedmodel_dir {savedmodel_dir!r} holds no saved_model.pb (nor a .onnx model)")


def _holds_model(files: set[str]) -> bool:
    return bool(files & {"saved_model.pb", "saved_model.pbtxt"}) or any(f.endswith(".onnx") for f in files)


def version_dirs(store: ModelStore, base: str) -> dict[int, str]:
    """TF Serving's layout: map number -> directory for every complete version under ``base``.

    A numeric subdirectory is complete once it holds ``saved_model.pb(txt)`` and a complete
    ``variables/variables`` checkpoint, or a ``.onnx`` model; one still being written is left out.
    """
    found: dict[int, str] = {}
    for directory in store.list_dirs(base):
        name = posixpath.basename(directory.rstrip("/"))
        if not name.isdigit():
            continue
        files = set(store.list_files(directory))
        if any(f.endswith(".onnx") for f in files):
            found[int(name)] = directory
        elif files & {"saved_model.pb", "saved_model.pbtxt"}:
            variables = set(store.list_files(posixpath.join(directory, "variables")))
            shards = [f for f in variables if f.startswith("variables.data-")]
            if "variables.index" in variables and _all_shards("variables", shards):
                found[int(name)] = directory
    return found


def _is_base_dir(store: ModelStore, savedmodel_dir: str) -> bool:
    """True when ``savedmodel_dir`` holds no model itself but numeric subdirectories."""
    if _holds_model(set(store.list_files(savedmodel_dir))):
        return False
    return any(posixpath.basename(d.rstrip("/")).isdigit() for d in store.list_dirs(savedmodel_dir))


def _version_dir_versions(store: ModelStore, base: str, checkpoint_dir: str | None,
                          policy: VersionPolicy | None, pin_step: int | None) -> list[ModelVersion]:
    if checkpoint_dir is not None:
        raise ConfigError(f"savedmodel_dir {base!r} is a TF Serving model base directory (numbered "
                          "version directories); leave checkpoint_dir unset: each version carries its "
                          "own variables")
    versions = version_dirs(store, base)
    if not versions:
        raise Unavailable(f"savedmodel_dir {base!r} holds no complete version directory yet "
                          "(<number>/saved_model.pb with its variables)")
    if pin_step is None:
        numbers = _select(policy, versions, repr(base))
    elif pin_step in versions:
        numbers = [pin_step]
    else:
        raise NotFound(f"version {pin_step} names no complete version directory in {base!r}; "
                       f"versions: {sorted(versions)}")
    return [ModelVersion(n, -1, savedmodel_dir=versions[n], run_dir=base) for n in numbers]


def newest_run(store: ModelStore, checkpoint_dir: str) -> str:
    """The run directory whose ``checkpoint`` file is newest; the dir itself if it is a run."""
    if store.exists(posixpath.join(checkpoint_dir, "checkpoint")):
        candidates = [checkpoint_dir]
    else:
        candidates = [d for d in store.list_dirs(checkpoint_dir)
                      if store.exists(posixpath.join(d, "checkpoint"))]
    if not candidates:
        raise Unavailable(f"checkpoint_dir {checkpoint_dir!r} holds no run with a 'checkpoint' file")
    return max(candidates, key=lambda d: (store.mtime(posixpath.join(d, "checkpoint")), d))


def complete_checkpoints(store: ModelStore, directory: str) -> dict[int, str]:
    """Map step -> prefix for every complete checkpoint directly inside ``directory``."""
    files = set(store.list_files(directory))
    found: dict[int, str] = {}
    for name in files:
        m = _STEP.match(name)
        if not m:
            continue
        prefix = name[: -len(".index")]
        shards = [f for f in files if f.startswith(prefix + ".data-")]
        if not shards or not _all_shards(prefix, shards):
            continue
        found[int(m.group("step"))] = posixpath.join(directory, prefix)
    return found


def _all_shards(prefix: str, shards: list[str]) -> bool:
    numbers = set()
    total = None
    for shard in shards:
        m = _SHARD.search(shard)
        if not m:
            return False
        numbers.add(int(m.group(1)))
        total = int(m.group(2))
    return total is not None and numbers == set(range(total))


def latest_version(store: ModelStore, savedmodel_dir: str, checkpoint_dir: str | None,
                   pin_step: int | None = None, delta_mode: str = "cumulative") -> ModelVersion:
    """The version to serve now: the newest full plus its own newest delta (see the module doc).

    ``pin_step`` names the parameters at that step: a full step serves exactly that full; a
    delta step serves the full it follows plus that delta. Raises Unavailable when nothing
    servable exists yet, NotFound for a pinned step that exists nowhere (the message lists the
    full and delta steps there are). A TF Serving base directory as ``savedmodel_dir`` serves
    its newest complete version directory (a pin names a number); ConfigError with a
    ``checkpoint_dir``. ``delta_mode`` ``chain``: the version applies every delta of
    its full up to its delta step (see :class:`ModelVersion`). Paths may be URLs of the store;
    the version holds the store's own paths.
    """
    return served_versions(store, savedmodel_dir, checkpoint_dir, None, pin_step, delta_mode)[-1]


def served_versions(store: ModelStore, savedmodel_dir: str, checkpoint_dir: str | None,
                    policy: VersionPolicy | None = None, pin_step: int | None = None,
                    delta_mode: str = "cumulative") -> list[ModelVersion]:
    """The versions to serve side by side now, ascending by TF Serving number, the last the
    newest: those ``policy`` selects (None: the newest only) among the version directories of a
    TF Serving base directory, or among the full checkpoints of the newest run, each with its
    own newest delta (a delta belongs to the full it follows). A SavedModel's own variables are
    one version whatever the policy. ``pin_step``: exactly the version at that step (see
    :func:`latest_version`). Unavailable when the policy selects none of the versions there are
    (the message lists both); the other errors as :func:`latest_version`'s."""
    savedmodel_dir = store.strip(savedmodel_dir)
    if _is_base_dir(store, savedmodel_dir):
        return _version_dir_versions(store, savedmodel_dir, checkpoint_dir, policy, pin_step)
    find_savedmodel(store, savedmodel_dir)
    if checkpoint_dir is None:
        return [ModelVersion(-1, -1, savedmodel_dir=savedmodel_dir)]
    run = newest_run(store, store.strip(checkpoint_dir))
    fulls = {s: p for s, p in complete_checkpoints(store, run).items()
             if not posixpath.basename(p).startswith("incremental_")}
    if not fulls:
        raise Unavailable(f"run {run!r} holds no complete full checkpoint (model.ckpt-<step>)")
    deltas: dict[int, str] = {}
    for name in DELTA_DIRS:
        delta_dir = posixpath.join(run, name)
        if store.exists(delta_dir):
            deltas.update(complete_checkpoints(store, delta_dir))
    if pin_step is None:
        chosen = [(s, max(_own_deltas(s, fulls, deltas), default=-1))
                  for s in _select(policy, fulls, f"run {run!r}")]
    elif pin_step in fulls:
        chosen = [(pin_step, -1)]
    elif pin_step in deltas and any(s < pin_step for s in fulls):
        chosen = [(max(s for s in fulls if s < pin_step), pin_step)]
    else:
        raise NotFound(f"step {pin_step} names no checkpoint in {run!r}; full steps: {sorted(fulls)}, "
                       f"delta steps: {sorted(deltas)}")
    out = []
    for full_step, delta_step in chosen:
        if delta_step < 0:
            chain: tuple[tuple[int, str], ...] = ()
        elif delta_mode == "chain":
            chain = tuple((s, deltas[s]) for s in sorted(_own_deltas(full_step, fulls, deltas)) if s <= delta_step)
        else:
            chain = ((delta_step, deltas[delta_step]),)
        out.append(ModelVersion(full_step, delta_step, full_prefix=fulls[full_step],
                                delta_prefix=deltas.get(delta_step, ""), savedmodel_dir=savedmodel_dir,
                                run_dir=run, delta_chain=chain))
    return out


def _select(policy: VersionPolicy | None, available, where: str) -> list[int]:
    """The numbers ``policy`` (None: the newest) serves of ``available``; Unavailable if none."""
    chosen = policy.select(available) if policy is not None else sorted(available)[-1:]
    if not chosen:
        raise Unavailable(f"model_version_policy {policy.describe()} selects none of the versions in "
                          f"{where}: {sorted(available)}")
    return chosen


def _own_deltas(full_step: int, fulls: dict[int, str], deltas: dict[int, str]) -> list[int]:
    """The delta steps that follow ``full_step`` and precede the next full."""
    next_full = min((s for s in fulls if s > full_step), default=None)
    return [s for s in deltas if s > full_step and (next_full is None or s < next_full)]
