"""Workloads as data: what a run sends, to which server, and what every answer must contain.

Owns: the table of named workloads and the encoding of their requests into the exact bytes a
generator connection sends. A workload is a frozen record; adding one (a lock storm, a CAS
contention mix, an etcd or Redis twin) is adding a row here plus, when it needs a new request
shape, one encoder function. Nothing here opens a socket or reads a clock.

Key layout, shared by every KV workload so that a preload serves any connection count: the key
space is `keys_total` keys "k00000".."k{keys_total-1}" in namespace "bench". Connection i of C
starts at key i * keys_total // C and walks forward, wrapping, `ops` keys per request; so the
connections write disjoint stretches, no request repeats a key (while keys_total // C >= ops),
and the number of rows stays bounded at keys_total however long the run.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

NS = "bench"
KEYS_TOTAL = 10_000
# Long enough that no row expires during a run (expiry would turn puts into inserts mid-run), and
# still a TTL: every put goes through the timing wheel as a real client's would.
TTL_SECONDS = 3600
VALUE = "v" * 32
# Requests each connection pre-encodes and then cycles through; bounded so 64-op bodies for many
# connections stay a few MB.
RING_REQUESTS_MAX = 1024


@dataclass(frozen=True)
class Workload:
    name: str
    target: str  # "queen" or "baseline": which server runs it
    op: str  # KV op each operation of a request performs ("put", "get")
    preload: bool  # write every key once before measuring (reads must find what they ask for)
    # A 200 is not enough: each answer must contain this needle once per operation, so a run that
    # silently answers "found": false or "applied": false counts errors, not throughput.
    needle: bytes | None
    fixed_ops: int | None = None  # the baseline sends one shape whatever --ops says
    description: str = ""


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("kv-put", "queen", "put", preload=False, needle=b'"applied":true',
             description="put with ttlSeconds on distinct keys (rows bounded by the key space), POST /api/v1/kv"),
    Workload("kv-get", "queen", "get", preload=True, needle=b'"found":true',
             description="get of preloaded keys, POST /api/v1/kv"),
    Workload("baseline-h11", "baseline", "put", preload=False, needle=None, fixed_ops=1,
             description="the kv-put 1-op request sent to a do-nothing trio+h11 server (bench/baseline_h11.py): the per-request ceiling"),
)}


def key_name(index: int) -> str:
    return f"k{index:05d}"


def operation(op: str, key: str) -> dict:
    if op == "put":
        return {"op": "put", "ns": NS, "key": key, "value": VALUE, "ttlSeconds": TTL_SECONDS}
    if op == "get":
        return {"op": "get", "ns": NS, "key": key}
    raise ValueError(f"no encoder for op {op!r}")


def http_post(host: str, port: int, path: str, body: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: %s:%d\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (path.encode(), host.encode(), port, len(body))) + body


def kv_request(host: str, port: int, op: str, keys: list[str]) -> bytes:
    body = orjson.dumps({"operations": [operation(op, key) for key in keys]})
    return http_post(host, port, "/api/v1/kv", body)


def connection_ring(workload: Workload, ops: int, host: str, port: int, connection: int,
                    connections: int, keys_total: int = KEYS_TOTAL) -> list[bytes]:
    """The pre-encoded requests connection `connection` of `connections` cycles through."""
    stretch = max(1, keys_total // connections)
    first = connection * keys_total // connections
    requests = min(RING_REQUESTS_MAX, -(-stretch // ops))
    ring = []
    for request in range(requests):
        keys = [key_name((first + (request * ops + i) % stretch) % keys_total) for i in range(ops)]
        ring.append(kv_request(host, port, workload.op, keys))
    return ring


def preload_requests(host: str, port: int, keys_total: int = KEYS_TOTAL, ops: int = 500) -> list[bytes]:
    """Puts that create every key of the key space once, `ops` per request."""
    return [kv_request(host, port, "put", [key_name(k) for k in range(start, min(start + ops, keys_total))])
            for start in range(0, keys_total, ops)]
