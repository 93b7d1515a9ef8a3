"""Throwaway ``redis-server`` processes on 127.0.0.1, for tests and benchmarks.

:class:`LocalRedis` starts one server (no persistence) on a free port and stops it by its own
process id; :class:`LocalRedisCluster` starts N cluster-enabled servers and joins them with
``redis-cli --cluster create ... --cluster-yes``. Both can be stopped and started again on the
same port (an outage: the server comes back empty). Nothing here is used when serving.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(cluster: bool = False) -> int:
    """A free port on 127.0.0.1; for a cluster node also its bus port (port + 10000) is free."""
    if not cluster:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 30000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair (port, port + 10000) for a cluster node")


def _wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"redis-server on port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"redis-server did not listen on 127.0.0.1:{port} within {timeout} s")


class LocalRedis:
    """One redis-server on 127.0.0.1:``port`` (a free one by default)."""

    def __init__(self, port: int | None = None, cluster: bool = False, directory: str | None = None,
                 password: str | None = None) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self.cluster = cluster
        self.password = password
        self.dir = directory or tempfile.mkdtemp(prefix=f"redis-{self.port}-")
        self._own_dir = directory is None
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir, "--protected-mode", "no", "--loglevel", "warning",
                "--logfile", os.path.join(self.dir, f"redis-{self.port}.log")]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{self.port}.conf",
                     "--cluster-node-timeout", "2000"]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, 10.0, self.proc)

    def stop(self) -> None:
        """Kill the server (SIGKILL: an outage, not a shutdown); its data is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def cli(self, *args: str) -> str:
        cmd = ["redis-cli", "-p", str(self.port)]
        if self.password:
            cmd += ["-a", self.password, "--no-auth-warning"]
        return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=30, check=True).stdout

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalRedisCluster:
    """``nodes`` cluster-enabled servers joined into one Redis Cluster (no replicas)."""

    def __init__(self, nodes: int = 3) -> None:
        self.dir = tempfile.mkdtemp(prefix="redis-cluster-")
        self.servers: list[LocalRedis] = []
        try:
            for _ in range(nodes):
                port = free_port(cluster=True)
                d = os.path.join(self.dir, str(port))
                os.makedirs(d)
                self.servers.append(LocalRedis(port, cluster=True, directory=d))
            subprocess.run(["redis-cli", "--cluster", "create",
                            *[f"127.0.0.1:{s.port}" for s in self.servers],
                            "--cluster-replicas", "0", "--cluster-yes"],
                           capture_output=True, text=True, timeout=60, check=True)
            self.wait_ok()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return ",".join(s.url for s in self.servers)

    def wait_ok(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = [s.cli("cluster", "info") for s in self.servers]
            if all("cluster_state:ok" in i for i in infos):
                return
            time.sleep(0.1)
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")

    def close(self) -> None:
        for s in self.servers:
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalRedisCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
