"""One benchmark, two revisions of the code, in alternating rounds: a change's effect on speed
measured against the machine's drift (issue 49: a refactor must leave every figure within noise).

The base revision (``--base``, default ``HEAD``: the last commit, against the working tree) is
checked out into a temporary git worktree beside this checkout's native builds (the extension,
the generated protos, the C ABI library: a base whose native sources differ from the working
tree's is built there with ``--build``), the virtual environment shared. Then, for ``--rounds``
rounds, the benchmark (``--bench``, a module of ``benchmarks``, with the arguments after ``--``)
runs once in each tree, the order alternating (base first in even rounds), each run writing its
results under a tag of its own. A row is matched across the two by its identifying fields
(``--id-fields``); each figure (``--figures``) gives one ratio per round, working tree / base,
and the report is the median of those ratios with their range: 1.00 is no change; for times
(``*_ms``, ``*_us``, ``cpu_*``) below 1 is faster, for rates above 1 is faster.

Writes ``benchmarks/results/ab-NAME.json`` and ``.md`` (``NAME``: the benchmark's result name,
``--tag`` appended).

    .venv/bin/python -m benchmarks.ab_revisions --bench bench_request_path --result request_path \\
        [--base REV] [--rounds 2] [--build] [--tag NAME] -- --models dlrm-onnx --batches 1,256
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS, write_results

ROOT = Path(__file__).resolve().parent.parent
BUILT = ("processor/_native*.so", "processor/proto/*_pb2*", "cpp_processor/build")  # ignored, built by setup
ID_FIELDS = "model,server,edge,batch,threads,device,connections"
FIGURES = "req_per_s,p50_ms,p99_ms,cpu_us_per_request,process_rps,raw_rps,ratio,process_p50_us,process_p99_us"


def base_tree(rev: str, where: Path, build: bool) -> Path:
    """A worktree of ``rev`` at ``where`` with this checkout's builds (or its own: ``build``)."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True,
                   capture_output=True)
    (where / ".venv").symlink_to(ROOT / ".venv")
    if build:
        subprocess.run(["bash", "scripts/setup.sh"], cwd=where, check=True)
        return where
    for pattern in BUILT:
        for path in ROOT.glob(pattern):
            target = where / path.relative_to(ROOT)
            if path.is_dir():
                shutil.copytree(path, target, symlinks=True, dirs_exist_ok=True)
            else:
                shutil.copy2(path, target)
    return where


def run(tree: Path, bench: str, args: list[str], tag: str, result: str) -> dict:
    """One run of ``bench`` in ``tree``: its result JSON (read, then removed from the tree)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([str(ROOT / ".venv/bin/python"), "-m", f"benchmarks.{bench}", *args, "--tag", tag],
                   cwd=tree, env=env, check=True)
    out = {}
    for suffix in (".json", ".md"):
        path = tree / "benchmarks" / "results" / f"{result}-{tag}{suffix}"
        if suffix == ".json":
            out = json.loads(path.read_text())
        path.unlink(missing_ok=True)
    return out


def figures(doc: dict, ids: list[str], names: list[str]) -> dict[tuple, dict[str, float]]:
    """Each row's figures by its identifying fields (several rows of one key, e.g. one per round
    of the benchmark's own: their median)."""
    grouped: dict[tuple, dict[str, list[float]]] = {}
    for row in doc.get("rows", []):
        key = tuple((f, row[f]) for f in ids if f in row)
        for name in names:
            value = row.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                grouped.setdefault(key, {}).setdefault(name, []).append(float(value))
    return {key: {name: statistics.median(values) for name, values in fields.items()}
            for key, fields in grouped.items()}


def compare(rounds: list[tuple[dict, dict]], ids: list[str], names: list[str]) -> list[dict]:
    """Per row and figure: the median and range of the per-round ratios working tree / base."""
    ratios: dict[tuple, dict[str, list[float]]] = {}
    for base, head in rounds:
        b, h = figures(base, ids, names), figures(head, ids, names)
        for key in b.keys() & h.keys():
            for name in b[key].keys() & h[key].keys():
                if b[key][name]:
                    ratios.setdefault(key, {}).setdefault(name, []).append(h[key][name] / b[key][name])
    out = []
    for key, fields in sorted(ratios.items(), key=lambda item: str(item[0])):
        row = dict(key)
        for name, values in fields.items():
            row[name] = {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                         "max": round(max(values), 3)}
        out.append(row)
    return out


def markdown(result: dict) -> str:
    names = [n for n in result["figures"] if any(n in row for row in result["rows"])]
    lines = [f"# {result['bench']}: working tree / {result['base']}, {result['rounds']} alternating rounds",
             "", f"Machine: {result['machine']}. Each cell: median ratio (min-max over rounds); rates above 1 "
             "and times below 1 are faster.", ""]
    ids = [f for f in result["id_fields"] if any(f in row for row in result["rows"])]
    lines.append("| " + " | ".join(ids + names) + " |")
    lines.append("|" + "---|" * (len(ids) + len(names)))
    for row in result["rows"]:
        cells = [str(row.get(f, "")) for f in ids]
        cells += [f"{row[n]['median']:.3f} ({row[n]['min']:.2f}-{row[n]['max']:.2f})" if n in row else ""
                  for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, help="module of benchmarks/, e.g. bench_edges")
    parser.add_argument("--result", required=True, help="its result name, e.g. edges, request_path")
    parser.add_argument("--base", default="HEAD")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--build", action="store_true", help="build the base tree (scripts/setup.sh)")
    parser.add_argument("--id-fields", default=ID_FIELDS)
    parser.add_argument("--figures", default=FIGURES)
    parser.add_argument("--tag", default="")
    args, rest = parser.parse_known_args()
    bench_args = rest[1:] if rest[:1] == ["--"] else rest
    ids, names = args.id_fields.split(","), args.figures.split(",")
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], check=True,
                         capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="ab_revisions_") as tmp:
        base = base_tree(args.base, Path(tmp) / "base", args.build)
        try:
            rounds = []
            for i in range(args.rounds):
                order = [("base", base), ("head", ROOT)] if i % 2 == 0 else [("head", ROOT), ("base", base)]
                docs = {name: run(tree, args.bench, bench_args, f"ab-{name}-{i}", args.result) for name, tree in order}
                print(f"[ab] round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
                rounds.append((docs["base"], docs["head"]))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False,
                           capture_output=True)
    machine = rounds[0][1].get("machine", "")
    result = {"bench": args.bench, "args": bench_args, "base": rev, "rounds": args.rounds,
              "machine": machine if isinstance(machine, str) else json.dumps(machine),
              "id_fields": ids, "figures": names, "rows": compare(rounds, ids, names)}
    text = markdown(result)
    print(text)
    write_results(f"ab-{args.result}" + (f"-{args.tag}" if args.tag else ""), result, text)


if __name__ == "__main__":
    main()
