"""Redis key layout of the embedding store (layout ``sp1``), the same for one node and a cluster.

::

    sp1:{<ns>}:meta                      HASH  per model: version states, delta steps, writers
        v:<ver>        "ready" once every row of version <ver> is in
        d:<ver>        newest delta step written into <ver>
        active         newest ready version
        w:<ver>:<step> how many times that load / delta was written (1 with one writer)
    sp1:{<ns>}:lock:<ver>                STRING the writer lock of <ver>: SET NX EX lock_timeout,
                                         released / extended only by its token (compare-and-X)
    sp1:{<ns>/<ver>/<tag_p>}             HASH  partition p (of P) of version <ver>, all tables:
        field  = <id: 8 bytes int64 little-endian> <table: 3 bytes big-endian> 0x01    (12 bytes)
        value  = dim x float32 little-endian (float16 for a version ending in .f16)
        field "\\x00ready" = <ver>, written after the partition's rows: its absence means the
                 partition lost its data (a Redis that restarted empty) and is refilled

* ``<ns>`` is the model name, ``<ver>`` the full version (``<run>-<full step>``): a new full version
  loads into new keys beside the served one; versions other than the active and the loading one
  are deleted (UNLINK of P keys) when a load starts (DeepRec's two-DB double buffer, by key).
* The partition of a row is ``mix64(id ^ table salt) % P``: a table partition lives in one hash,
  so in one cluster slot; the P partition tags are chosen so their slots spread evenly over the
  16384 slots, hence over the nodes of a cluster with the usual even slot ranges.
* All tables of a version share the P partition hashes, so a request for any number of tables
  costs at most P commands (one ``HMGET`` per partition), pipelined per node.
* ``<table>`` is a 24-bit id from the CRC-32 of the table name (collisions are rejected).

Pure functions; thread-safe.
"""

from __future__ import annotations

import binascii
import re
import zlib

import numpy as np

from .hash_index import mix64

SLOTS = 16384
PREFIX = b"sp1"
SENTINEL = b"\x00ready"
FIELD_DTYPE = np.dtype([("id", "<i8"), ("table", ">u4")])  # packed: 12 bytes
DEFAULT_PARTITIONS = 32
_RESP_FIELD = np.dtype([("head", "S5"), ("field", "V12"), ("end", "S2")])  # "$12\r\n" <field> "\r\n"


def key_slot(key: bytes) -> int:
    """The Redis Cluster slot of ``key`` (CRC16/XMODEM of the hash tag, if any, mod 16384)."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1: end]
    return binascii.crc_hqx(key, 0) % SLOTS


def safe_name(text: str) -> str:
    """``text`` with every character outside ``[A-Za-z0-9_.-]`` replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text) or "_"


def table_id(name: str) -> int:
    """24-bit id of a table name."""
    return zlib.crc32(name.encode()) & 0xFFFFFF


class KeyLayout:
    """Keys of one model namespace. See the module doc."""

    def __init__(self, namespace: str, partitions: int = DEFAULT_PARTITIONS) -> None:
        if not 1 <= partitions <= 4096:
            raise ValueError(f"partitions must be in [1, 4096], got {partitions}")
        self.namespace = safe_name(namespace)
        self.partitions = partitions
        ns = self.namespace.encode()
        self.meta_key = PREFIX + b":{" + ns + b"}:meta"
        self.meta_slot = key_slot(self.meta_key)
        self._versions: dict[str, tuple[list[bytes], np.ndarray]] = {}

    def lock_key(self, version: str) -> bytes:
        return PREFIX + b":{" + self.namespace.encode() + b"}:lock:" + safe_name(version).encode()

    def partition_keys(self, version: str) -> tuple[list[bytes], np.ndarray]:
        """(the P hash keys of ``version``, their slots)."""
        cached = self._versions.get(version)
        if cached is None:
            keys, slots = [], []
            span = SLOTS / self.partitions
            base = f"{self.namespace}/{safe_name(version)}/p"
            for p in range(self.partitions):
                lo, hi = int(p * span), max(int((p + 1) * span), int(p * span) + 1)
                n = 0
                while True:  # the first tag whose slot falls in partition p's share of the slots
                    tag = f"{base}{p}.{n}".encode()
                    slot = binascii.crc_hqx(tag, 0) % SLOTS
                    if lo <= slot < hi or n > 100_000:
                        break
                    n += 1
                keys.append(PREFIX + b":{" + tag + b"}")
                slots.append(slot)
            cached = (keys, np.asarray(slots, np.int64))
            self._versions[version] = cached
        return cached

    def partition_of(self, tid: int, ids: np.ndarray) -> np.ndarray:
        """Partition (0..P-1) of each id of table ``tid``."""
        return (mix64(ids, salt=tid * 0x9E3779B1) % np.uint64(self.partitions)).astype(np.int64)

    @staticmethod
    def packed_fields(tids: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The 12-byte hash field of each (table id, id), as a numpy ``V12`` array."""
        packed = np.empty(len(ids), FIELD_DTYPE)
        packed["id"] = ids
        packed["table"] = (np.asarray(tids, np.uint32) << np.uint32(8)) | np.uint32(1)
        return packed.view("V12")

    @classmethod
    def fields(cls, tids: np.ndarray, ids: np.ndarray) -> list[bytes]:
        """The 12-byte hash field of each (table id, id), as bytes."""
        return cls.packed_fields(tids, ids).tolist()

    @staticmethod
    def pack_hmget(key: bytes, fields: np.ndarray) -> bytes:
        """The RESP encoding of ``HMGET key <sentinel> <fields...>`` (see :meth:`pack`)."""
        return KeyLayout.pack(b"HMGET", key, fields, lead=(SENTINEL,))

    @staticmethod
    def pack(verb: bytes, key: bytes, fields: np.ndarray, rows: np.ndarray | None = None,
             lead: tuple[bytes, ...] = ()) -> bytes:
        """The RESP encoding of ``<verb> key <lead...> <field> [<row>] ...``: ``HMGET`` / ``HDEL``
        with ``fields`` alone, ``HSET`` with each field followed by its row of ``rows`` as
        little-endian bytes of its dtype (float32, or float16 for ``embedding_dtype`` float16: the
        version's keys then end in ``.f16``). Built in one numpy pass, without a Python object per
        field or row (a load writes millions); ``fields`` from :meth:`packed_fields`."""
        per_field = 1 if rows is None else 2
        head = b"*%d\r\n" % (2 + len(lead) + per_field * len(fields)) + b"".join(
            b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in (verb, key, *lead))
        if rows is None:
            body = np.empty(len(fields), _RESP_FIELD)
        else:
            rows = np.ascontiguousarray(rows, rows.dtype.newbyteorder("<"))
            width = rows.shape[1] * rows.dtype.itemsize
            row_head = b"$%d\r\n" % width
            body = np.empty(len(fields), _RESP_FIELD.descr + [
                ("row_head", f"S{len(row_head)}"), ("row", f"V{width}"), ("row_end", "S2")])
            body["row_head"] = row_head
            body["row"] = rows.view(f"V{width}").reshape(-1)
            body["row_end"] = b"\r\n"
        body["head"] = b"$12\r\n"
        body["field"] = fields
        body["end"] = b"\r\n"
        return head + body.tobytes()
