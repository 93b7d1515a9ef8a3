"""The floors of the network edges: servers that do nothing but answer, on the stack ours runs on.

* ``http``: a bare ASGI app on uvicorn + httptools + uvloop that answers every POST with a fixed
  body; ``--hop`` runs a trivial function on a thread pool first (as our edge runs the model on
  the model's pool), so the floor includes the hop;
* ``grpc``: a bare grpcio server (sync, thread pool) with a generic handler for any method that
  returns fixed bytes (``--aio``: ``grpc.aio``).

Run as a process (``python -m benchmarks.edge_floors http --port N [--hop] [--body-bytes N]``);
it prints ``READY <port>`` once serving and runs until killed. ``bench_edges`` loads it with the
same native load generators and settings as our server, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from concurrent.futures import ThreadPoolExecutor


def serve_http(port: int, hop: bool, body: bytes, threads: int) -> None:
    import uvicorn

    pool = ThreadPoolExecutor(threads)
    start = {"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"application/x-protobuf"), (b"content-length", str(len(body)).encode())]}
    message = {"type": "http.response.body", "body": body}

    def work() -> bytes:
        return body

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            event = await receive()
            more = event.get("more_body", False)
        if hop:
            await asyncio.get_running_loop().run_in_executor(pool, work)
        await send(start)
        await send(message)

    # as our server runs it: httptools, uvloop, no lifespan, no access log, no Server header
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http="httptools", lifespan="off", ws="none",
                            access_log=False, log_level="warning", server_header=False)
    server = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.05)
        print(f"READY {port}", flush=True)
        await task

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def serve_grpc(port: int, use_aio: bool, body: bytes, threads: int) -> None:
    import grpc

    def answer(request: bytes, context) -> bytes:
        return body

    class Generic(grpc.GenericRpcHandler):
        def service(self, details):
            return grpc.unary_unary_rpc_method_handler(answer)  # bytes in, bytes out

    if use_aio:
        async def main() -> None:
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((Generic(),))
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            print(f"READY {port}", flush=True)
            await server.wait_for_termination()
        asyncio.run(main())
        return
    server = grpc.server(ThreadPoolExecutor(threads))
    server.add_generic_rpc_handlers((Generic(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print(f"READY {port}", flush=True)
    server.wait_for_termination()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=["http", "grpc"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hop", action="store_true", help="http: run a trivial function on a thread pool first")
    parser.add_argument("--aio", action="store_true", help="grpc: grpc.aio instead of the sync server")
    parser.add_argument("--body-bytes", type=int, default=40, help="size of the fixed answer")
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    body = b"\x00" * args.body_bytes
    if args.kind == "http":
        serve_http(args.port, args.hop, body, args.threads)
    else:
        serve_grpc(args.port, args.aio, body, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
