"""Command line: build the demo models.

::

    python -m demo build [--out artifacts/demo] [--preset full|small] [--versions N] [--force]
    python -m demo toy   [--out artifacts/toy] [--tf2] [--force]

Each command builds only when ``--out`` holds no complete build of the requested kind (or with
``--force``), then prints the model's paths and a matching DeepRec ``model_config`` as JSON.
Exit status 0 on success, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from demo.ctr_spec import PRESETS
from demo.paths import (
    DEFAULT_DEMO_DIR,
    DEFAULT_TOY_DIR,
    demo_model_config,
    ensure_demo_model,
    ensure_toy_model,
    toy_model_config,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "build":
        paths = ensure_demo_model(args.out, args.preset, versions=args.versions, force=args.force)
        config = demo_model_config(paths)
    else:
        paths = ensure_toy_model(args.out, tf2=args.tf2, force=args.force)
        config = toy_model_config(paths)
    summary = {
        "out_dir": str(paths.out_dir),
        "steps": paths.steps,
        "latest_checkpoint_prefix": str(paths.latest_checkpoint_prefix),
        "model_config": config,
    }
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m demo", description="Build the demo models.")
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="build the CTR model (wide & deep, synthetic Criteo-like data)")
    build.add_argument("--out", type=Path, default=DEFAULT_DEMO_DIR, help="model directory (default: %(default)s)")
    build.add_argument("--preset", choices=sorted(PRESETS), default="full", help="model size (default: full)")
    build.add_argument("--versions", type=_positive_int, default=2, help="full checkpoints to write (default: 2)")
    build.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")

    toy = commands.add_parser("toy", help="build the toy model y = a*x + b")
    toy.add_argument("--out", type=Path, default=DEFAULT_TOY_DIR, help="model directory (default: %(default)s)")
    toy.add_argument("--tf2", action="store_true", help="export from a TF2 tf.Module, not TF1 graph mode")
    toy.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    return parser


if __name__ == "__main__":
    # Keep TensorFlow's C++ start-up chatter out of the output unless the user asked for it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
