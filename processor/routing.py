"""VersionRouter: which served version answers a call, for one model.

A call names a version, or a label (``version_labels``: ``{"stable": 1, "canary": 2}``), or
neither. One that names neither goes to the default (the newest served version) unless the
model splits its traffic: ``traffic`` (``{"stable": 95, "canary": 5}``, arms by label or by
version number, weights relative) picks an arm by a hash of the call's routing key, so one key
(one user) always meets one arm, in every worker and after restarts (the hash is BLAKE2b, not
Python's per-process ``hash``); a call without a key draws at random. An arm whose version is
not served (any more) gives the call to the default.

``shadow`` (``{"label": "canary", "fraction": 1.0}``, or ``"version": N``) names the version that
a copy of that share of calls runs on, off the response path (:mod:`processor.shadow`).

Labels, traffic and shadow change at run time (:meth:`VersionRouter.update`, the admin API):
each change is validated whole (a label or arm naming a version that is not served is refused,
TF Serving's rule) and swapped in as one immutable :class:`Routing`, so a call reads one
consistent snapshot without a lock. Thread-safe.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .echo import shorten
from .errors import InvalidArgument
from .request import answer_note_var, requested_version

LABEL_PATTERN = r"^[A-Za-z0-9_]+$"  # TF Serving's label grammar
_ARM_PATTERN = r"^([A-Za-z0-9_]+)$"
_SCALE = float(1 << 64)


class ShadowSettings(BaseModel):
    """A copy of ``fraction`` of the calls that name no version runs on ``label``'s (or
    ``version``'s) version, off the response path; at most ``max_queued`` copies wait, more are
    dropped (counted)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    label: str | None = Field(None, pattern=LABEL_PATTERN)
    version: int | None = Field(None, ge=0)
    fraction: float = Field(1.0, ge=0, le=1)
    max_queued: int = Field(64, ge=1, le=100_000)

    @model_validator(mode="after")
    def _one_target(self) -> ShadowSettings:
        if (self.label is None) == (self.version is None):
            raise ValueError("give one of label, version")
        return self


class RoutingSettings(BaseModel):
    """A model's labels, traffic split and shadow, as the deployment entry and the admin API give
    them (validated here; checked against the served versions by :meth:`VersionRouter.update`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version_labels: dict[str, int] = Field(default_factory=dict)
    traffic: dict[str, float] = Field(default_factory=dict)
    shadow: ShadowSettings | None = Field(None, strict=False)

    @model_validator(mode="after")
    def _check(self) -> RoutingSettings:
        import re

        for label, number in self.version_labels.items():
            if not re.match(LABEL_PATTERN, label):
                raise ValueError(f"version_labels: label {shorten(label, 80)} must match {LABEL_PATTERN}")
            if number < 0:
                raise ValueError(f"version_labels: label {label!r} names a negative version")
        for arm, weight in self.traffic.items():
            if not re.match(_ARM_PATTERN, arm):
                raise ValueError(f"traffic: arm {shorten(arm, 80)} must be a label or a version number")
            if not arm.isdigit() and arm not in self.version_labels:
                raise ValueError(f"traffic: arm {arm!r} is neither a version number nor one of the "
                                 f"labels {sorted(self.version_labels)}")
            if weight < 0:
                raise ValueError(f"traffic: arm {arm!r} has a negative weight")
        if self.traffic and sum(self.traffic.values()) <= 0:
            raise ValueError("traffic: the weights must add up to more than 0")
        if self.shadow is not None and self.shadow.label is not None and self.shadow.label not in self.version_labels:
            raise ValueError(f"shadow: label {self.shadow.label!r} is not one of the labels "
                             f"{sorted(self.version_labels)}")
        return self

    def number(self, arm: str) -> int:
        """The version number an arm (a label or digits) names."""
        return int(arm) if arm.isdigit() else self.version_labels[arm]

    def shadow_number(self) -> int | None:
        shadow = self.shadow
        if shadow is None:
            return None
        return shadow.version if shadow.version is not None else self.version_labels[shadow.label]

    def named_versions(self) -> dict[str, int]:
        """What each label, arm and the shadow name: ``{"label stable": 1, ...}`` (for errors)."""
        named = {f"label {k}": v for k, v in self.version_labels.items()}
        named.update({f"traffic arm {arm}": self.number(arm) for arm in self.traffic})
        if self.shadow is not None:
            named["shadow"] = self.shadow_number()
        return named


class Routing(NamedTuple):
    """One immutable snapshot of a model's routing: the settings, the traffic arms as (upper
    bound of the arm's share of [0, 1), version number, arm name), the shadow's number."""

    settings: RoutingSettings
    arms: tuple[tuple[float, int, str], ...]
    shadow: int | None


def _compile(settings: RoutingSettings) -> Routing:
    total = sum(settings.traffic.values())
    arms, upto = [], 0.0
    for arm, weight in settings.traffic.items():
        if weight <= 0:
            continue
        upto += weight / total
        arms.append((upto, settings.number(arm), arm))
    if arms:
        arms[-1] = (1.0, arms[-1][1], arms[-1][2])  # no gap left by rounding
    return Routing(settings, tuple(arms), settings.shadow_number())


def key_point(key: str) -> float:
    """Where routing key ``key`` falls in [0, 1): the same in every process and run."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


class VersionRouter:
    """See the module doc. ``serves(number)``: whether that version is served now (the model's
    manager's)."""

    def __init__(self, model: str, settings: RoutingSettings | None = None,
                 serves: Callable[[int], bool] | None = None) -> None:
        self.model = model
        self._serves = serves or (lambda number: False)
        self.routing = _compile(settings or RoutingSettings())
        self._watchers: list[Callable[[], None]] = []

    def watch(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each change of :attr:`routing` (the DataPlane's plan follows
        it). It must be quick and must not raise."""
        self._watchers.append(listener)

    @property
    def labels(self) -> Mapping[str, int]:
        return self.routing.settings.version_labels

    def resolve(self, version: int | None, label: str | None) -> int | None:
        """The version number a call asks for (None: it names none). InvalidArgument for both
        named, or an unknown label (TF Serving's words)."""
        if label is None:
            return version
        return requested_version(self.model, version, label, self.routing.settings.version_labels)

    def route(self, call) -> int | None:
        """The version number a :class:`~processor.request.PredictCall` runs on: the one it names,
        its label's, else its traffic arm's (the arm written into the edge's ``answer_note_var``
        note, when it set one); None: the default."""
        if call.label is not None:
            return self.resolve(call.version, call.label)
        if call.version is None and self.routing.arms:
            chosen = self.choose(call.routing_key)
            if chosen is not None:
                note = answer_note_var.get()
                if note is not None:
                    note[1] = chosen[1]
                return chosen[0]
        return call.version

    def choose(self, routing_key: str | None) -> tuple[int, str] | None:
        """The traffic arm (version number, arm name) of a call that names no version; None: no
        split, or the arm's version is not served (the default answers)."""
        arms = self.routing.arms
        if not arms:
            return None
        point = key_point(routing_key) if routing_key else random.random()
        for upto, number, arm in arms:
            if point < upto:
                return (number, arm) if self._serves(number) else None
        return None

    def update(self, changes: Mapping[str, Any], require_served: bool = True) -> RoutingSettings:
        """Apply ``changes`` (any of ``version_labels``, ``traffic``, ``shadow``; a key given
        replaces that part whole, ``null`` clears it) as one new snapshot; InvalidArgument naming
        the problem, and nothing changed, when the result is invalid or (``require_served``)
        names a version that is not served."""
        unknown = set(changes) - {"version_labels", "traffic", "shadow"}
        if unknown:
            raise InvalidArgument(f"unknown routing key(s) {sorted(unknown)}: give version_labels, traffic, shadow")
        merged = self.routing.settings.model_dump()
        for key, value in changes.items():
            merged[key] = value if value is not None else ({} if key != "shadow" else None)
        try:
            settings = RoutingSettings.model_validate(merged)
        except ValueError as exc:
            raise InvalidArgument(f"model {shorten(self.model, 80)}: {_first_error(exc)}") from None
        if require_served:
            missing = {what: n for what, n in settings.named_versions().items() if not self._serves(n)}
            if missing:
                raise InvalidArgument(
                    f"model {shorten(self.model, 80)}: " + "; ".join(
                        f"{what} names version {n}, which is not served" for what, n in missing.items()))
        self.routing = _compile(settings)
        for listener in self._watchers:
            listener()
        return settings

    def dangling(self) -> dict[str, int]:
        """Labels, arms and the shadow that name a version not served now."""
        return {what: n for what, n in self.routing.settings.named_versions().items() if not self._serves(n)}

    def describe(self) -> dict[str, Any]:
        settings = self.routing.settings
        out: dict[str, Any] = {"version_labels": dict(settings.version_labels), "traffic": dict(settings.traffic),
                               "shadow": settings.shadow.model_dump() if settings.shadow is not None else None}
        dangling = self.dangling()
        if dangling:
            out["not_served"] = dangling
        return out


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = str(first.get("msg", exc)).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return str(exc)
