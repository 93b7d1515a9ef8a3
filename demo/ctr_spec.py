"""Shape of the demo CTR model: its features, embedding tables and presets.

Criteo-like features: 13 dense counts ``I1..I13`` and 26 categorical features. ``C1..C20`` arrive
as raw int64 ids (column ``i-1`` of the ``sparse_ids`` input) and are mapped into their table
with ``floormod(id, rows)``; ``C21..C26`` arrive as strings (column ``i-21`` of
``sparse_tokens``) and are mapped with ``tf.strings.to_hash_bucket_fast(token, rows)``.
Each categorical feature has its own 2-D embedding table ``embeddings/C<i>`` of ``[rows, dim]``.

Presets:

- ``full``: tables of 1k to 1M rows, dims 16 to 64, about 185 MB of float32 parameters;
- ``small``: the same features and dims with at most 5k rows per table (``rows // 200``, at
  least 100), for tests.

This module does not import TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

NUM_DENSE = 13
NUM_ID_FEATURES = 20
NUM_TOKEN_FEATURES = 6

DENSE_INPUT = "dense"
IDS_INPUT = "sparse_ids"
TOKENS_INPUT = "sparse_tokens"
PROBABILITY_OUTPUT = "probability"
LOGITS_OUTPUT = "logits"

# (rows, dim) of C1..C26 in the full preset. The synthetic data draws each feature's raw values
# from a vocabulary of this many distinct values, whatever the preset.
FULL_TABLE_SHAPES: tuple[tuple[int, int], ...] = (
    (1_000_000, 16), (250_000, 16), (100_000, 32), (50_000, 32), (20_000, 64),
    (8_000, 64), (3_000, 64), (1_000, 32), (200_000, 16), (60_000, 32),
    (30_000, 64), (10_000, 32), (5_000, 16), (2_000, 16), (120_000, 16),
    (40_000, 32), (15_000, 64), (4_000, 32), (1_500, 16), (1_000, 64),
    (200_000, 16), (80_000, 32), (25_000, 64), (6_000, 32), (2_500, 16),
    (1_200, 16),
)  # fmt: skip
SMALL_MAX_ROWS = 5_000


@dataclass(frozen=True)
class TableSpec:
    """One categorical feature and its embedding table.

    Attributes:
        feature: ``C1`` .. ``C26``.
        input: the signature input alias that carries it (``sparse_ids`` or ``sparse_tokens``).
        column: its column in that input.
        rows: table rows (the id space after floormod / hashing).
        dim: embedding width.
    """

    feature: str
    input: str
    column: int
    rows: int
    dim: int

    @property
    def name(self) -> str:
        """The variable name of the table, ``embeddings/<feature>``."""
        return f"embeddings/{self.feature}"

    @property
    def id_mapping(self) -> str:
        """How a raw value becomes a row, as written in the model card."""
        if self.input == IDS_INPUT:
            return "floormod(id, rows)"
        return "tf.strings.to_hash_bucket_fast(token, rows)"


@dataclass(frozen=True)
class CtrPreset:
    """A size of the CTR model and how long to train it.

    Attributes:
        name: ``full`` or ``small``.
        tables: C1..C26 in order.
        hidden_units: widths of the deep MLP's hidden layers.
        batch_size: training examples per step.
        steps_per_version: training steps between two full checkpoints.
        learning_rate: Adagrad learning rate.
        eval_examples: size of the held-out batch the model card's AUC is measured on.
    """

    name: str
    tables: tuple[TableSpec, ...]
    hidden_units: tuple[int, ...]
    batch_size: int
    steps_per_version: int
    learning_rate: float
    eval_examples: int


def _tables(max_rows: int | None) -> tuple[TableSpec, ...]:
    tables = []
    for index, (rows, dim) in enumerate(FULL_TABLE_SHAPES):
        if max_rows is not None:
            rows = min(max_rows, max(100, rows // 200))
        if index < NUM_ID_FEATURES:
            input_alias, column = IDS_INPUT, index
        else:
            input_alias, column = TOKENS_INPUT, index - NUM_ID_FEATURES
        tables.append(TableSpec(f"C{index + 1}", input_alias, column, rows, dim))
    return tuple(tables)


PRESETS: dict[str, CtrPreset] = {
    "full": CtrPreset(
        name="full",
        tables=_tables(None),
        hidden_units=(256, 128),
        batch_size=1024,
        steps_per_version=200,
        learning_rate=0.1,
        eval_examples=20_000,
    ),
    "small": CtrPreset(
        name="small",
        tables=_tables(SMALL_MAX_ROWS),
        hidden_units=(256, 128),
        batch_size=256,
        steps_per_version=40,
        learning_rate=0.1,
        eval_examples=5_000,
    ),
}


def get_preset(name: str) -> CtrPreset:
    """The preset called ``name``.

    Raises:
        ValueError: unknown name.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown CTR preset {name!r}; expected one of {sorted(PRESETS)}") from None
