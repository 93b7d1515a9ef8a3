"""The serving signature: input and output aliases, tensor names, dtypes and shapes.

Engines build a :class:`Signature` when they open a model; the codec and the front-ends only
read it. Instances are immutable and safe to share between threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .echo import shorten
from .dtypes import dtype_name
from .errors import InvalidArgument


@dataclass(frozen=True)
class TensorSpec:
    """One signature tensor. ``shape`` is None for unknown rank; -1 marks a free dimension."""

    alias: str
    name: str  # engine tensor name, e.g. "x:0"
    dtype: int  # ArrayDataType / TF DataType number
    shape: tuple[int, ...] | None

    def describe(self) -> dict:
        return {
            "name": self.alias,
            "shape": list(self.shape) if self.shape is not None else None,
            "type": dtype_name(self.dtype),
        }


@dataclass(frozen=True)
class Signature:
    """A predict signature: aliases map to engine tensors; tensor names are accepted too."""

    name: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    method: str = "tensorflow/serving/predict"
    _inputs_by_key: dict[str, TensorSpec] = field(init=False, repr=False, compare=False)
    _outputs_by_key: dict[str, TensorSpec] = field(init=False, repr=False, compare=False)
    # every name an input is taken by (alias or tensor name) -> its alias
    input_aliases: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for attr, specs in (("_inputs_by_key", self.inputs), ("_outputs_by_key", self.outputs)):
            by_key = {s.name: s for s in specs.values()}
            by_key.update(specs)  # an alias wins over an equal tensor name
            object.__setattr__(self, attr, by_key)
        object.__setattr__(self, "input_aliases", {k: s.alias for k, s in self._inputs_by_key.items()})

    def input(self, key: str) -> TensorSpec:
        """The input named by alias or tensor name; InvalidArgument if unknown."""
        spec = self._inputs_by_key.get(key)
        if spec is None:
            raise InvalidArgument(
                f"unknown input {shorten(key, 80)}; signature {self.name!r} takes {sorted(self.inputs)}")
        return spec

    def output(self, key: str) -> TensorSpec:
        """The output named by alias or tensor name; InvalidArgument if unknown."""
        spec = self._outputs_by_key.get(key)
        if spec is None:
            raise InvalidArgument(
                f"unknown output {shorten(key, 80)} in output_filter; signature {self.name!r} "
                f"has {sorted(self.outputs)}")
        return spec

    def describe(self) -> dict:
        """DeepRec's signature description (what ``process`` returns for an empty request)."""
        return {
            "signature_name": self.name,
            "inputs": [s.describe() for s in self.inputs.values()],
            "outputs": [s.describe() for s in self.outputs.values()],
        }
