"""RedisNodes: connection pools per node and slot routing, for one Redis or a Redis Cluster.

Commands are sent as ``(slot, args)`` (``args`` a tuple, or bytes already RESP-encoded);
:meth:`RedisNodes.execute` groups them by the node that
owns the slot (one node for a single Redis), writes every node's batch first and then reads the
replies, so the nodes work in parallel without threads and each node costs one round trip.

* reads take connections from a per-node pool of ``read_thread_num`` connections, writes
  (loads, deltas, meta, lock) from a pool of ``update_thread_num`` (DeepRec's meaning of the
  two keys: numbers of connections); a caller waits for a free connection;
* no retries inside redis-py: a refused or broken connection, a connect slower than
  ``connect_timeout`` (``redis_connect_timeout_seconds``) or a reply slower than
  ``socket_timeout``, raises :class:`StoreDown` at once (the store turns it into a 503);
* :meth:`RedisNodes.check` (at start) reaches every node within one time budget in all, so a
  dead endpoint (or a cluster of dead seeds) fails fast;
* a cluster's slot map comes from ``CLUSTER SLOTS`` of any reachable seed (or known node), and
  is refreshed on ``MOVED`` (``CLUSTERDOWN``, ``TRYAGAIN``) replies, then those commands are sent
  again once, and by :meth:`refresh`; a command answered ``ASK`` (its slot is migrating and the
  key has moved) is sent once more to the node the reply names, after ``ASKING``.

Thread-safe.

**Why not redis-py's RedisCluster** (issue 49, item 4; ``benchmarks/bench_redis_cluster_client.py``,
results in ``benchmarks/results/redis_cluster_client.md``): it was tried as the transport of the
same store (``ClusterPipeline`` per batch, ``BlockingConnectionPool`` per node, ``Retry(NoBackoff(),
0)``, the same timeouts, hiredis) against a 3-node cluster and kept neither rule:

* speed: its batch throughput is 0.43-0.64 of this module's in the kept run (0.32-0.72 over
  three runs; lookups of 1, 64, 512 and 4,096 ids): e.g. 1,462 vs 581 us for 64 ids, 2,933 vs
  1,895 us for 512, 9,381 vs 6,544 us for 4,096; 2.2-2.8x the client CPU from 64 ids up (a noisy
  1.0-1.6x for 1 id); 0.53-0.59 with 4 threads. Same commands and round trips (one ``HMGET`` per
  partition, one write per node); the cost is redis-py's per command routing (key extraction
  and slot twice per command) and per argument encoding of the ~4,096 fields, which
  ``KeyLayout.pack_hmget`` encodes in one numpy pass (redis-py cannot send pre-encoded commands);
* fail-fast: a hung node (SIGSTOP) fails a lookup after 4.0 s (1 id) and 22 s (4,096 ids)
  instead of 2.0 s (``socket_timeout``): ``ClusterPipeline`` re-sends every command that timed
  out one at a time, each waiting the timeout again, whatever ``retry`` says; at start, three
  hung seeds take 6.0 s (the socket timeout per seed) instead of 1.0 s (the connect timeout in
  all). A killed node fails both at once (1-9 ms). Its error does not name the node.

Its one functional edge, following ``ASK`` during a slot migration, is done here too (above).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from .key_layout import SLOTS
from .redis_url import RedisAddress

SOCKET_TIMEOUT = 2.0
CONNECT_TIMEOUT = 1.0  # default of redis_connect_timeout_seconds
POOL_WAIT = 5.0


class StoreDown(Exception):
    """Redis could not be reached or did not answer in time."""


def _redis():
    import redis

    return redis


class RedisNode:
    """Pools for one Redis server."""

    def __init__(self, address: RedisAddress, password: str | None, read_conns: int, write_conns: int,
                 socket_timeout: float = SOCKET_TIMEOUT, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        redis = _redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.address = address
        kwargs: dict[str, Any] = dict(
            host=address.host, port=address.port, db=address.db, username=address.username,
            password=address.password or password or None, socket_timeout=socket_timeout,
            socket_connect_timeout=min(connect_timeout, socket_timeout), retry=Retry(NoBackoff(), 0),
            timeout=POOL_WAIT)
        if address.tls:
            kwargs["connection_class"] = redis.SSLConnection
        self.read_pool = redis.BlockingConnectionPool(max_connections=read_conns, **kwargs)
        self.write_pool = redis.BlockingConnectionPool(max_connections=write_conns, **kwargs)
        self.client = redis.Redis(connection_pool=self.write_pool)

    @property
    def name(self) -> str:
        return f"{self.address.host}:{self.address.port}"

    def probe(self, args: tuple, deadline: float) -> Any:
        """One command on a fresh connection that must connect and answer before ``deadline``
        (``time.monotonic()``); raises StoreDown otherwise (an error reply included)."""
        redis = _redis()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StoreDown(f"{self.name}: not tried, the connect timeout was spent on other nodes")
        pool = self.write_pool
        conn = pool.connection_class(**{**pool.connection_kwargs, "socket_connect_timeout": remaining,
                                        "socket_timeout": remaining})
        try:
            conn.connect()
            sock = getattr(conn, "_sock", None)
            if sock is not None:  # the answer too must come before the deadline
                sock.settimeout(max(0.001, deadline - time.monotonic()))
            conn.send_command(*args, check_health=False)
            return conn.read_response()
        except (redis.RedisError, OSError) as exc:  # refused, timed out, an error reply, not Redis
            raise StoreDown(f"{self.name}: {type(exc).__name__}: {exc}") from None
        finally:
            conn.disconnect()

    def close(self) -> None:
        self.read_pool.disconnect()
        self.write_pool.disconnect()


class RedisNodes:
    """See the module doc. ``cluster``: the addresses are seeds of a Redis Cluster."""

    def __init__(self, addresses: Sequence[RedisAddress], password: str | None, read_conns: int,
                 write_conns: int, cluster: bool, socket_timeout: float = SOCKET_TIMEOUT,
                 connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.cluster = cluster
        self.seeds = list(addresses)
        self._password = password
        self._read_conns = read_conns
        self._write_conns = write_conns
        self._socket_timeout = socket_timeout
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._nodes_lock = threading.Lock()
        self._nodes: dict[tuple[str, int], RedisNode] = {}
        self._owner = np.zeros(SLOTS, np.int32)  # slot -> index into _order
        self._order: list[RedisNode] = []
        if not cluster:
            node = self._node(self.seeds[0])
            self._order = [node]

    def _node(self, address: RedisAddress) -> RedisNode:
        key = (address.host, address.port)
        with self._nodes_lock:  # refresh and ASK replies add nodes from request threads
            node = self._nodes.get(key)
            if node is None:
                node = RedisNode(address, self._password, self._read_conns, self._write_conns,
                                 self._socket_timeout, self._connect_timeout)
                self._nodes[key] = node
        return node

    @property
    def nodes(self) -> list[RedisNode]:
        return list(self._order)

    def names(self, limit: int = 8) -> str:
        """``host:port`` of the nodes (the seeds while a cluster's map is unknown), for messages."""
        names = [n.name for n in self._order] or [f"{a.host}:{a.port}" for a in self.seeds]
        return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")

    def describe(self) -> dict[str, Any]:
        return {"nodes": [n.name for n in self._order], "cluster": self.cluster,
                "read_connections_per_node": self._read_conns, "write_connections_per_node": self._write_conns}

    # --- cluster topology -------------------------------------------------------------------

    def check(self, budget: float) -> None:
        """Reach the store within ``budget`` seconds in all, or raise StoreDown: PING a single
        Redis; for a cluster read the slot map from the first seed that answers, then PING every
        master. Fresh connections, each bounded by what is left of the budget."""
        deadline = time.monotonic() + budget
        if self.cluster:
            self.refresh(deadline)
        for node in self._order:
            node.probe(("PING",), deadline)

    def refresh(self, deadline: float | None = None) -> None:
        """Re-read the cluster's slot map (a no-op for one node). Raises StoreDown.

        ``deadline`` (``time.monotonic()``): ask on fresh connections that must answer by then
        (see :meth:`check`); None: on the pools' connections, with their timeouts.
        """
        if not self.cluster:
            return
        redis = _redis()
        candidates = [n.address for n in self._order] + self.seeds
        failures: list[str] = []
        for address in candidates:
            node = self._node(address)
            try:
                if deadline is not None:
                    ranges = node.probe(("CLUSTER", "SLOTS"), deadline)
                else:
                    ranges = node.client.execute_command("CLUSTER SLOTS")
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError, OSError, StoreDown) as exc:
                failures.append(str(exc) if isinstance(exc, StoreDown) else f"{node.name}: {type(exc).__name__}: {exc}")
                continue
            owner = np.full(SLOTS, -1, np.int32)
            order: list[RedisNode] = []
            index: dict[tuple[str, int], int] = {}
            for entry in ranges:
                start, end, master = int(entry[0]), int(entry[1]), entry[2]
                host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
                host = host or address.host
                addr = RedisAddress(host, int(master[1]), 0, address.username, address.password, address.tls)
                k = (addr.host, addr.port)
                if k not in index:
                    index[k] = len(order)
                    order.append(self._node(addr))
                owner[start: end + 1] = index[k]
            if (owner < 0).any():
                failures.append(f"cluster at {node.name} does not cover all slots")
                continue
            with self._lock:
                self._owner, self._order = owner, order
            return
        shown = "; ".join(failures[:3]) + (f"; and {len(failures) - 3} more" if len(failures) > 3 else "")
        raise StoreDown(f"no Redis Cluster node answered CLUSTER SLOTS ({shown})")

    # --- commands ---------------------------------------------------------------------------

    def execute(self, commands: Sequence[tuple[int, tuple]], write: bool = False) -> list[Any]:
        """Run ``(slot, args)`` commands; replies in order (a ResponseError object for an error
        reply). Raises StoreDown when a node cannot be reached or answers too slowly.

        In a cluster, commands answered ``MOVED`` (or ``CLUSTERDOWN`` / ``TRYAGAIN``) are sent
        again once after a :meth:`refresh`; commands answered ``ASK`` (their slot is being
        migrated and the key has moved already) once to the node the reply names, each after
        ``ASKING``, pipelined per node."""
        results = self._execute_once(commands, write)
        if self.cluster:
            moved = [i for i, r in enumerate(results) if _is_redirect(r) and not _is_ask(r)]
            if moved:
                self.refresh()
                for i, r in zip(moved, self._execute_once([commands[i] for i in moved], write)):
                    results[i] = r
            asked = [i for i, r in enumerate(results) if _is_ask(r)]
            if asked:
                for i, r in zip(asked, self._ask([(results[i], commands[i][1]) for i in asked], write)):
                    results[i] = r
        return results

    def _execute_once(self, commands: Sequence[tuple[int, tuple]], write: bool) -> list[Any]:
        owner, order = self._owner, self._order
        by_node: dict[int, list[int]] = defaultdict(list)
        for i, (slot, _) in enumerate(commands):
            by_node[int(owner[slot]) if self.cluster else 0].append(i)
        groups = list(by_node.items())
        results: list[Any] = [None] * len(commands)
        replies = self._send([(order[n], [commands[i][1] for i in idxs]) for n, idxs in groups], write)
        for (_, idxs), got in zip(groups, replies):
            for i, r in zip(idxs, got):
                results[i] = r
        return results

    def _ask(self, asked: list[tuple[Any, tuple]], write: bool) -> list[Any]:
        """(ASK reply, args) -> the replies of the commands sent after ``ASKING`` to the nodes the
        ASK replies name (one round, the nodes in parallel)."""
        seed = self.seeds[0]
        by_node: dict[tuple[str, int], list[int]] = defaultdict(list)
        for i, (reply, _) in enumerate(asked):
            by_node[(reply.host or seed.host, int(reply.port))].append(i)
        groups = list(by_node.items())
        batches = []
        for (host, port), idxs in groups:
            node = self._node(RedisAddress(host, port, 0, seed.username, seed.password, seed.tls))
            batches.append((node, [c for i in idxs for c in (("ASKING",), asked[i][1])]))
        results: list[Any] = [None] * len(asked)
        for (_, idxs), got in zip(groups, self._send(batches, write)):
            for i, r in zip(idxs, got[1::2]):  # the ASKING replies dropped
                results[i] = r
        return results

    def _send(self, batches: list[tuple[RedisNode, list]], write: bool) -> list[list[Any]]:
        """Each node's commands in one write, every node written before any is read; the replies
        per batch (a ResponseError object for an error reply). Raises StoreDown."""
        redis = _redis()
        replies: list[list[Any]] = []
        taken = []
        node = None  # the node being connected to, written to or read from
        try:
            for node, cmds in batches:
                pool = node.write_pool if write else node.read_pool
                conn = pool.get_connection()
                taken.append((pool, conn, node, len(cmds)))
                conn.send_packed_command([b"".join(_pack(conn, cmds))], check_health=False)  # one sendall
            for _, conn, node, count in taken:
                got: list[Any] = []
                replies.append(got)
                for _ in range(count):
                    try:
                        got.append(conn.read_response())
                    except redis.ResponseError as exc:
                        got.append(exc)
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.InvalidResponse, OSError) as exc:
            for _, conn, _, _ in taken:
                conn.disconnect()
            raise StoreDown(f"{node.name if node else 'redis'}: {type(exc).__name__}: {exc}") from None
        finally:
            for pool, conn, _, _ in taken:
                pool.release(conn)
        return replies

    def ping_all(self) -> None:
        """PING every node (after a refresh for a cluster); raises StoreDown."""
        self.refresh()
        self.execute([(self._first_slot(n), ("PING",)) for n in range(len(self._order))], write=True)

    def _first_slot(self, n: int) -> int:
        if not self.cluster:
            return 0
        return int(np.flatnonzero(self._owner == n)[0])

    def close(self) -> None:
        for node in list(self._nodes.values()):
            node.close()


def _pack(conn, commands: list) -> list[bytes]:
    """RESP bytes of ``commands``: argument tuples are packed by redis-py, ``bytes`` are already
    RESP-encoded (see :meth:`~.key_layout.KeyLayout.pack_hmget`)."""
    out: list[bytes] = []
    plain: list[tuple] = []
    for cmd in commands:
        if isinstance(cmd, bytes):
            if plain:
                out.extend(conn.pack_commands(plain))
                plain = []
            out.append(cmd)
        else:
            plain.append(cmd)
    if plain:
        out.extend(conn.pack_commands(plain))
    return out


def _is_ask(result: Any) -> bool:
    if not isinstance(result, Exception):
        return False
    from redis.exceptions import AskError, MovedError

    return isinstance(result, AskError) and not isinstance(result, MovedError)  # MovedError is an AskError


def _is_redirect(result: Any) -> bool:
    if not isinstance(result, Exception):
        return False
    from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError

    return isinstance(result, (AskError, ClusterDownError, MovedError, TryAgainError)) or \
        str(result).startswith(("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN"))
