"""How the code is laid out, checked (docs/architecture.md).

``server/`` by protocol: each protocol's modules (its REST routes, gRPC services and codecs) live
in its package (``server/eas``, ``server/tfserving``, ``server/kserve``), the transports
(``server/http``, ``server/grpc``) import no protocol package (the composition root hands them
the protocols' registrations, server/protocols.py), and the modules of ``server`` import each
other without a cycle. Every module is parsed (not imported) and every import counts, at module
level and inside functions alike (tests/import_graph.py).
"""

from __future__ import annotations

from pathlib import Path

import import_graph

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "server"
PROTOCOL_PACKAGES = ("server.eas", "server.tfserving", "server.kserve")
TRANSPORTS = ("server.http", "server.grpc")


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_each_protocols_modules_live_in_its_package():
    misplaced = []
    for name in import_graph.modules("server"):
        leaf = name.rpartition(".")[2]
        if leaf.startswith("tfs") and not _inside(name, "server.tfserving"):
            misplaced.append(f"{name}: TF Serving's, belongs under server/tfserving/")
        if (leaf.startswith("v2") or leaf.startswith("open_inference")) and not _inside(name, "server.kserve"):
            misplaced.append(f"{name}: KServe v2's, belongs under server/kserve/")
    assert not misplaced, "protocol modules outside their package:\n" + "\n".join(misplaced)
    # the packages are there, each with its registration (server/protocols.py)
    for package in PROTOCOL_PACKAGES:
        init = SERVER / package.split(".")[1] / "__init__.py"
        assert "PROTOCOL = Protocol(" in init.read_text(), package


def test_transports_import_no_protocol_package():
    graph = import_graph.graph("server")
    offenders = {name: sorted(t for t in targets if any(_inside(t, p) for p in PROTOCOL_PACKAGES))
                 for name, targets in graph.items() if any(_inside(name, t) for t in TRANSPORTS)}
    offenders = {name: targets for name, targets in offenders.items() if targets}
    assert not offenders, f"transport modules import a protocol package: {offenders}"
    # the check sees what it looks for: a protocol's routes import the HTTP transport, relatively
    assert "server.http.predict" in graph["server.kserve.rest_routes"]
    assert "server.grpc.interceptor" in graph["server.tfserving.grpc_service"]


def test_no_import_cycle_between_server_modules():
    graph = import_graph.graph("server")
    assert "server.tfserving.rest_routes" in graph["server.tfserving"]  # deferred imports count
    cycles = import_graph.cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
