"""VersionPolicy: which of a model's versions serve side by side (TF Serving's
``model_version_policy``), in its three JSON forms::

    {"latest": {"num_versions": 2}}      the N highest versions (default: N = 1)
    {"all": {}}                          every version there is
    {"specific": {"versions": [1, 3]}}   exactly these (those that exist; the rest are waited for)

Versions are TF Serving's numbers: a version directory's number in TF Serving's layout, a full
checkpoint's global step in DeepRec's (:mod:`processor.store.checkpoint_layout`). A policy is a
frozen pydantic object, validated once with the model's config; :meth:`VersionPolicy.select` is
pure. Thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Latest(_Strict):
    num_versions: int = Field(1, ge=1, le=1024)


class All(_Strict):
    pass


class Specific(_Strict):
    # a JSON list (strict=False lets the list become a tuple; its items stay strict integers)
    versions: tuple[StrictInt, ...] = Field(min_length=1, max_length=1024, strict=False)

    @model_validator(mode="after")
    def _distinct(self) -> Specific:
        if any(v < 0 for v in self.versions) or len(set(self.versions)) != len(self.versions):
            raise ValueError("versions must be distinct non-negative numbers")
        return self


class VersionPolicy(_Strict):
    """Exactly one of ``latest``, ``all``, ``specific`` (none given: ``latest`` with N = 1)."""

    latest: Latest | None = Field(None, strict=False)
    all: All | None = Field(None, strict=False)
    specific: Specific | None = Field(None, strict=False)

    @model_validator(mode="after")
    def _one_form(self) -> VersionPolicy:
        given = [name for name in ("latest", "all", "specific") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of latest, all, specific (got {', '.join(given)})")
        if not given:
            object.__setattr__(self, "latest", Latest())
        return self

    @property
    def single(self) -> bool:
        """True when the policy never serves more than one version (today's default)."""
        return (self.latest is not None and self.latest.num_versions == 1) or (
            self.specific is not None and len(self.specific.versions) == 1)

    def select(self, available: Iterable[int]) -> list[int]:
        """The numbers of ``available`` this policy serves, ascending."""
        numbers = sorted(set(available))
        if self.all is not None:
            return numbers
        if self.specific is not None:
            wanted = set(self.specific.versions)
            return [n for n in numbers if n in wanted]
        return numbers[-self.latest.num_versions:]

    def describe(self) -> dict:
        """The policy as its JSON form."""
        return self.model_dump(mode="json", exclude_none=True)
