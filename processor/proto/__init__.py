"""Protobuf modules generated from ``protos/`` by ``scripts/gen_protos.py`` (build output)."""
