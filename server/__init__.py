"""HTTP and gRPC front-ends of the serving processor (see ``server.app``, ``python -m server``)."""
