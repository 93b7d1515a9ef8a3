"""Where the demo models live, building them on demand, and their DeepRec ``model_config``.

``ensure_demo_model`` / ``ensure_toy_model`` are what the server, the benchmarks and tests call:
they build only when ``out_dir`` holds no complete build of the requested kind (a complete build
has a ``model_card.json``) and are safe to call from several processes at once (an exclusive
``flock`` on ``out_dir/.build.lock`` serialises them; the losers reuse the winner's build).

Importing this module does not import TensorFlow; building does.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from demo.layout import (
    CTR_MODEL_NAME,
    TOY_MODEL_NAME,
    ModelPaths,
    clear_model,
    read_model_card,
    read_model_paths,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DEMO_DIR = REPO_ROOT / "artifacts" / "demo"
DEFAULT_TOY_DIR = REPO_ROOT / "artifacts" / "toy"

_LOCK_NAME = ".build.lock"


def ensure_demo_model(
    out_dir: Path = DEFAULT_DEMO_DIR, preset: str = "full", *, versions: int = 2, force: bool = False
) -> ModelPaths:
    """The CTR demo model in ``out_dir``, built first if needed.

    Reuses the existing build when its model card names the same preset and number of
    versions; otherwise (or with ``force``) clears ``out_dir``'s model files and builds with
    :func:`demo.ctr_model.build_ctr_model` (seed 0). A rebuild must not happen while a server
    is reading the old files.

    Raises:
        ValueError: unknown preset or ``versions < 1``.
    """
    def build(out: Path) -> ModelPaths:
        from demo.ctr_model import build_ctr_model  # imports TensorFlow: only when building

        return build_ctr_model(out, preset=preset, versions=versions)

    def matches(card: dict[str, Any]) -> bool:
        return (card.get("model") == CTR_MODEL_NAME and card.get("preset") == preset
                and len(card.get("steps", [])) == versions)

    return _reuse_or_build(Path(out_dir), force, matches, build)


def ensure_toy_model(out_dir: Path = DEFAULT_TOY_DIR, *, tf2: bool = False, force: bool = False) -> ModelPaths:
    """The toy model in ``out_dir``, built first if needed.

    Reuses the existing build when its model card names the same flavour (TF1 or TF2);
    otherwise (or with ``force``) clears ``out_dir``'s model files and builds with
    :func:`demo.toy_model.build_toy_model`. Versions added with ``write_toy_checkpoint`` are
    kept on reuse.
    """
    def build(out: Path) -> ModelPaths:
        from demo.toy_model import build_toy_model  # imports TensorFlow: only when building

        return build_toy_model(out, tf2=tf2)

    def matches(card: dict[str, Any]) -> bool:
        return card.get("model") == TOY_MODEL_NAME and card.get("format") == ("tf2" if tf2 else "tf1")

    return _reuse_or_build(Path(out_dir), force, matches, build)


def _reuse_or_build(out_dir: Path, force: bool, matches: Callable[[dict[str, Any]], bool],
                    build: Callable[[Path], ModelPaths]) -> ModelPaths:
    """Under the build lock: the build in ``out_dir`` when its model card ``matches`` (and not
    ``force``); otherwise clear ``out_dir``'s model files and return ``build(out_dir)``."""
    with _build_lock(out_dir):
        card = read_model_card(out_dir)
        if not force and card is not None and matches(card):
            return read_model_paths(out_dir)
        clear_model(out_dir)
        return build(out_dir)


def model_config(paths: ModelPaths, **overrides: Any) -> dict[str, Any]:
    """A DeepRec-style ``model_config`` for the model at ``paths``: one session, one thread per
    pool, features in memory; ``overrides`` replace or add keys."""
    config: dict[str, Any] = {
        "savedmodel_dir": str(paths.savedmodel_dir),
        "checkpoint_dir": str(paths.checkpoint_dir),
        "signature_name": "serving_default",
        "feature_store_type": "memory",
        "serialize_protocol": "protobuf",
        "model_store_type": "local",
        "session_num": 1,
        "inter_op_parallelism_threads": 1,
        "intra_op_parallelism_threads": 1,
    }
    config.update(overrides)
    return config


# What the demo and toy models are served with (two sessions, two intra-op threads each).
_SERVING = {"session_num": 2, "select_session_policy": "MOD", "intra_op_parallelism_threads": 2}


def demo_model_config(paths: ModelPaths) -> dict[str, Any]:
    """A DeepRec-style ``model_config`` serving the CTR demo model at ``paths``."""
    return model_config(paths, **_SERVING)


def toy_model_config(paths: ModelPaths) -> dict[str, Any]:
    """A DeepRec-style ``model_config`` serving the toy model at ``paths``."""
    return model_config(paths, **_SERVING)


@contextmanager
def _build_lock(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out_dir`` (created if missing) for the duration."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / _LOCK_NAME, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
