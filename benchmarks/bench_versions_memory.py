"""Memory of several versions at once: two versions cost two copies of the weights, no more.

The DLRM-like ``.onnx`` model (``demo.dlrm_onnx``, 26 tables of ``--rows`` x 16) as TF Serving's
base directory with versions 1 and 2, loaded by ``Processor`` (the C ABI's, no server) in a fresh
process per row under ``model_version_policy`` latest 1 and latest 2 (and, the limit, the bare
engine: one ``onnxruntime.InferenceSession`` of one version's file). Per row: the process's RSS
growth from before the load to after it, and the weights one version holds as model info
counts them (its parameter buffers' MiB). Writes ``benchmarks/results/versions_memory.json``
and ``.md``.

    .venv/bin/python -m benchmarks.bench_versions_memory [--rows 200000] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import memory_of, write_results


def child(base: str, versions: int) -> dict:
    """In this fresh process: RSS before and after loading ``versions`` versions (0: the bare
    engine on version 1's file)."""
    import gc

    import onnxruntime  # noqa: F401 - imported before the first reading, as the load would

    from processor.processor import Processor

    gc.collect()
    before = memory_of()["rss_mib"]
    if versions == 0:
        session = onnxruntime.InferenceSession(str(Path(base) / "1" / "model.onnx"))
        after = memory_of()["rss_mib"]
        del session
        return {"rss_growth_mib": after - before}
    config = {"savedmodel_dir": base, "backend": "onnxruntime", "session_num": 1,
              "file_system_poll_wait_seconds": 0, "model_version_policy": {"latest": {"num_versions": versions}}}
    processor = Processor.create("dlrm", json.dumps(config))
    try:
        gc.collect()
        after = memory_of()["rss_mib"]
        info = processor.model_info()
        found: list[float] = []

        def walk(node) -> None:
            if isinstance(node, dict):
                if "mib" in node and "parameters" in node:
                    found.append(node["mib"])
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        walk(info["session_group"])
        return {"rss_growth_mib": after - before, "versions": [v["version"] for v in info["versions"]],
                "weights_mib_per_version": max(found) if found else None}
    finally:
        processor.close()


def bench(args) -> dict:
    from demo import dlrm_onnx

    base = Path(tempfile.mkdtemp(prefix="bench_versions_memory_")) / "dlrm"
    for number in (1, 2):
        dlrm_onnx.build(base / str(number) / "model.onnx", rows=args.rows, dim=16, seed=number)
    file_mib = (base / "1" / "model.onnx").stat().st_size / 2**20
    rows = {}
    for name, versions in (("bare engine, 1 version", 0), ("latest 1", 1), ("latest 2", 2)):
        out = subprocess.run([sys.executable, "-m", "benchmarks.bench_versions_memory", "--child", str(base),
                              str(versions)], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    one, two = rows["latest 1"]["rss_growth_mib"], rows["latest 2"]["rss_growth_mib"]
    return {"rows_per_table": args.rows, "model_file_mib": file_mib, "loads": rows,
            "second_version_mib": two - one,
            "second_version_over_weights": (two - one) / rows["latest 2"]["weights_mib_per_version"]}


def markdown(result: dict) -> str:
    lines = [f"# Several versions: memory (DLRM-like, 26 tables of {result['rows_per_table']:,} x 16; "
             f"model file {result['model_file_mib']:.0f} MiB)", "",
             "| load | versions served | RSS growth MiB | weights per version (model info) MiB |", "|---|---|---:|---:|"]
    for name, row in result["loads"].items():
        weights = row.get("weights_mib_per_version")
        lines.append(f"| {name} | {row.get('versions', [1])} | {row['rss_growth_mib']:.0f} | "
                     f"{'' if weights is None else f'{weights:.0f}'} |")
    lines += ["", f"The second version adds {result['second_version_mib']:.0f} MiB: "
              f"{result['second_version_over_weights']:.2f}x its weights."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--child", nargs=2, metavar=("BASE", "VERSIONS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    result = bench(args)
    write_results("versions_memory", result, markdown(result), args.out_dir)


if __name__ == "__main__":
    main()
