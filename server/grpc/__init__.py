"""gRPC front-end (grpcio)."""
