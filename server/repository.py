"""The model repository the load / unload APIs share, transport-neutral.

KServe v2's repository extension as Triton serves it (HTTP :mod:`server.kserve.repository_routes`,
gRPC :mod:`server.kserve.grpc_service`) and TF Serving's ``ModelService/HandleReloadConfigRequest``
(:mod:`server.tfserving.grpc_service`) are thin edges over these functions; every one is an admin
action (the edges check the admin gate and pass the caller, logged here).

* :func:`index`: every model the server knows: each served version of a served model
  (``READY``), a model still loading (``LOADING``), one whose load failed (``UNAVAILABLE``, the
  error), one unloaded on request or removed from the deployment file (``UNAVAILABLE``,
  ``"unloaded"``). The set remembers the entries it stopped serving
  (:attr:`server.model_set.ModelSet.unserved`), so those load again by name.
* :func:`load`: with a ``model_config`` (a JSON model entry's object, validated by the same
  rules as the deployment file's: a ConfigError, INVALID_ARGUMENT, names the key), that model is
  served under that name: added, or loaded anew beside the one served and swapped in (its entry's
  labels, traffic split, shadow and pool settings kept); without one, the entry of that name is
  loaded again (an unloaded or failed one, or the one served: a reload). Unknown: NOT_FOUND.
* :func:`unload`: the model stops serving (its requests NOT_FOUND at once, it drains and is
  freed); its entry is remembered. Unknown: NOT_FOUND; one known and not served: nothing to do.
* :func:`reload_config`: the whole model list replaced (TF Serving's semantics); an entry naming
  a model known keeps that model's other ``model_config`` keys (and its entry's other keys), the
  ones given replaced.

Each change is the running deployment with that edit, applied by the live model set
(:meth:`server.model_set.ModelSet.change`: one change at a time, loads warm beside the served
models, a failed load leaves the served model serving). A load that fails is the caller's
error: FAILED_PRECONDITION (HTTP 400) with the load's message (the model named does not load as
configured; the fit check's refusal, a missing version, a broken file alike). Loads run on the caller's thread: the
edges call these from an executor (:func:`off_loop`), never on an event loop.

With ``workers > 1`` a request reaches one worker only: these answer FAILED_PRECONDITION there
(change the deployment file, which every worker follows). Thread-safe.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from typing import Any

from processor.errors import ConfigError, FailedPrecondition, NotFound, ProcessorError
from processor.request import version_number

from .settings import DeploymentConfig, ModelEntry

log = logging.getLogger("server")

READY, LOADING, UNAVAILABLE = "READY", "LOADING", "UNAVAILABLE"
_LOADING_STATES = ("new", "loading", "warming")  # processor.manager.model_state values before a first serve
# an entry's keys a load with a new model_config keeps from the entry known under that name
_KEPT = ("version_labels", "traffic", "shadow", "inference_threads", "max_queued_requests")


async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the running loop's default executor, the context copied (the request id
    in the log lines): the edges' way to call the functions below."""
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(None, ctx.run, fn, *args)


def index(rt, ready: bool = False) -> list[dict[str, str]]:
    """Every model the server knows (see the module doc), by name: ``{name, version, state,
    reason}`` (``version`` empty where no version serves); ``ready``: the ``READY`` rows only."""
    rows: list[dict[str, str]] = []
    for model in rt.models:
        versions = model.served_versions() if model.ready else []
        for version in versions:
            rows.append(_row(model.name, str(version_number(version)), READY))
        if not versions:
            state = str(model.state)
            loading = state in _LOADING_STATES
            rows.append(_row(model.name, "", LOADING if loading else UNAVAILABLE,
                             "" if loading else (model.last_error or state)))
    served = {m.name for m in rt.models}
    for name, (_, reason) in rt.model_set.unserved.items():
        if name not in served:
            rows.append(_row(name, "", UNAVAILABLE, reason))
    rows.sort(key=lambda r: (r["name"], _version_key(r["version"])))
    return [r for r in rows if r["state"] == READY] if ready else rows


def load(rt, name: str, config: dict[str, Any] | None = None, caller: str = "-") -> dict[str, Any]:
    """Serve model ``name`` (see the module doc); returns what changed (``added`` or
    ``replaced``). Raises InvalidArgument (a bad ``config``, naming the key), NotFound (no
    ``config`` and no entry of that name known), or the failed load's error."""
    _one_process(rt)

    def edit(running: DeploymentConfig) -> DeploymentConfig:
        known = _known(rt, running, name)
        if config is None:
            if known is None:
                raise _unknown(rt, running, name)
            entry = known
        else:
            entry = _entry(name, config, known)
        return _with(running, [entry])

    return _change(rt, "load", name, caller, edit, frozenset({name}))


def unload(rt, name: str, caller: str = "-") -> dict[str, Any]:
    """Stop serving model ``name`` (see the module doc); returns what changed (``removed``).
    NotFound for a name the server does not know."""
    _one_process(rt)

    def edit(running: DeploymentConfig) -> DeploymentConfig:
        if _known(rt, running, name) is None:
            raise _unknown(rt, running, name)
        return running.model_copy(update={"models": tuple(e for e in running.models if e.name != name)})

    return _change(rt, "unload", name, caller, edit)


def reload_config(rt, entries: list[dict[str, Any]], caller: str = "-") -> dict[str, Any]:
    """Serve exactly ``entries`` (JSON model entries: ``name``, ``model_config``, optionally the
    entry's other keys), every other model unloaded; an entry naming a known model is merged
    over that model's entry (its ``model_config`` keys given replace those keys, the rest kept).
    Validated whole before anything changes (ConfigError naming ``models[i]`` and the key);
    returns what changed; raises the error of any model that failed to load (the others
    applied)."""
    _one_process(rt)
    names = ", ".join(str(e.get("name")) for e in entries if isinstance(e, dict)) or "(none)"

    def edit(running: DeploymentConfig) -> DeploymentConfig:
        items = []
        for item in entries:
            known = _known(rt, running, item.get("name")) if isinstance(item, dict) else None
            items.append(_merged(known, item) if known is not None else item)
        models = DeploymentConfig.from_dict({"models": items}).models if items else ()
        return running.model_copy(update={"models": tuple(models)})

    return _change(rt, "config reload", names, caller, edit)


# --- helpers -----------------------------------------------------------------------------------


def _row(name: str, version: str, state: str, reason: str = "") -> dict[str, str]:
    return {"name": name, "version": version, "state": state, "reason": reason}


def _version_key(version: str) -> int:
    return int(version) if version else -1


def _one_process(rt) -> None:
    if rt.deployment.workers > 1:
        raise FailedPrecondition(f"this server runs {rt.deployment.workers} workers and a request reaches one: "
                                 f"load and unload models through the deployment file (every worker follows it)")


def _known(rt, running: DeploymentConfig, name: Any) -> ModelEntry | None:
    """The entry of model ``name``: the running deployment's, else the one the set remembers."""
    for entry in running.models:
        if entry.name == name:
            return entry
    remembered = rt.model_set.unserved.get(name)
    return remembered[0] if remembered is not None else None


def _unknown(rt, running: DeploymentConfig, name: str) -> NotFound:
    known = sorted({e.name for e in running.models} | set(rt.model_set.unserved))
    return NotFound(f"model {name!r} is not in the repository; it knows {known} (load it with a model_config)")


def _entry(name: str, config: Any, known: ModelEntry | None) -> ModelEntry:
    """Model ``name`` with ``config`` as its ``model_config``, validated as a deployment file's
    entry is, and the other keys of the entry ``known`` under that name."""
    try:
        entry = DeploymentConfig.from_dict({"models": [{"name": name, "model_config": config}]}).models[0]
    except ConfigError as exc:
        raise ConfigError(exc.message.removeprefix("models[0] ")) from None
    if known is None:
        return entry
    return entry.model_copy(update={k: getattr(known, k) for k in _KEPT})


def _merged(known: ModelEntry, item: dict[str, Any]) -> dict[str, Any]:
    """A JSON entry: ``known``'s, with ``item``'s keys over it (its ``model_config`` keys over
    the known ``model_config``'s)."""
    out: dict[str, Any] = {"name": known.name, "model_config": dict(known.raw_config)}
    for key in _KEPT:
        value = getattr(known, key)
        if value is not None and value != {}:
            out[key] = value.model_dump(exclude_none=True) if key == "shadow" else value
    for key, value in item.items():
        if key == "model_config" and isinstance(value, dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _with(running: DeploymentConfig, entries: list[ModelEntry]) -> DeploymentConfig:
    """The running deployment with ``entries`` in place of those of their names (or added)."""
    new = {e.name: e for e in entries}
    models = [new.pop(e.name, e) for e in running.models] + list(new.values())
    return running.model_copy(update={"models": tuple(models)})


def _change(rt, action: str, target: str, caller: str, edit: Callable[[DeploymentConfig], DeploymentConfig],
            reload: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Apply ``edit`` through the live model set, logged with the caller; what changed, or the
    failed loads' error."""
    log.info("repository %s of %s requested by %s", action, target, caller, extra={"client": caller})
    try:
        report = rt.model_set.change(edit, f"repository {action} by {caller}", reload)
    except ProcessorError as exc:
        log.warning("repository %s of %s by %s refused: %s", action, target, caller, exc.message,
                    extra={"client": caller})
        raise
    failed = report["failed"]
    if failed:
        log.error("repository %s of %s by %s: failed %s", action, target, caller, failed, extra={"client": caller})
        raise FailedPrecondition("; ".join(f"model {n!r} did not load: {m}" for n, m in failed.items()))
    log.info("repository %s of %s by %s done: added %s, replaced %s, removed %s", action, target, caller,
             report["added"], report["replaced"], report["removed"], extra={"client": caller})
    return {"action": action, **{k: report[k] for k in ("added", "replaced", "removed", "routing")}}
