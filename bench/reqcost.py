"""`python -m bench.reqcost`: what one request costs, measured in one process.

A real Queen server (queen.runtime.server.Server on a temporary data dir, its own WAL, fsync and
all) and a small closed-loop client run on the same trio loop, over loopback sockets. Nothing is
pinned or shared with a generator, so the figures can be taken where wall-clock ones cannot:

- `--callgrind`: run it under `valgrind --tool=callgrind`; after the warm-up the driver zeroes
  callgrind's counters (callgrind_control -z) and dumps them after the measured requests, and
  prints instructions per request. Instruction counts barely move on a loaded machine; they
  include the client's few syscalls and lines, the same for every build compared.
- otherwise it prints CPU µs per request (process_time, all threads), and is the process to point
  `py-spy record --format raw --threads --native` at; `--fold FILE` then folds such a record into
  the request's layers (the client's own frames are counted apart).

    valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p python -m bench.reqcost --callgrind \\
        --workload lock-cycle --requests 2000
    python -m bench.reqcost --workload kv-put --requests 200000 &   # then py-spy record --pid ...
    python -m bench.reqcost --fold /tmp/record.txt
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import orjson
import trio

HOST = "127.0.0.1"


def _request(path: str, body: bytes, auth: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
            % (path.encode(), HOST.encode(), len(body), auth)) + body


class _Client:
    """One keep-alive connection, one request outstanding."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    async def call(self, data: bytes) -> bytes:
        self.sock.sendall(data)
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end >= 0:
                start = self.buf.find(b"content-length: ", 0, end) + 16
                length = int(self.buf[start:self.buf.find(b"\r\n", start)])
                total = end + 4 + length
                if len(self.buf) >= total:
                    if not self.buf.startswith(b"HTTP/1.1 200"):
                        raise RuntimeError(f"answer not 200: {self.buf[:300]!r}")
                    body, self.buf = self.buf[end + 4:total], self.buf[total:]
                    return body
            await trio.lowlevel.wait_readable(self.sock)
            data_in = self.sock.recv(65536)
            if not data_in:
                raise RuntimeError("server closed the connection")
            self.buf += data_in


def lock_cycle(connection: int, auth: bytes, ops: int = 1):
    """Requests of a lock cycle: acquire `ops` free names, then release them with the answers' tokens."""
    owner = f"o{connection}"
    acquires = [_request("/api/v1/locks", orjson.dumps({"operations": [
        {"op": "acquire", "name": f"c{connection}-{g}-{i}", "ttlSeconds": 60, "owner": owner} for i in range(ops)]}),
        auth) for g in range(16)]
    position = 0

    async def one(client: _Client) -> int:
        nonlocal position
        answers = orjson.loads(await client.call(acquires[position]))["results"]
        position = (position + 1) % len(acquires)
        release = _request("/api/v1/locks", orjson.dumps({"operations": [
            {"op": "release", "name": answer["name"], "slot": answer["slot"], "token": answer["token"],
             "owner": owner} for answer in answers]}), auth)
        if (await client.call(release)).count(b'"released":true') != ops:
            raise RuntimeError("not released")
        return 2
    return one


def _cycling(ring: list[bytes]):
    """One request of `ring` per call, in turn."""
    position = 0

    async def one(client: _Client) -> int:
        nonlocal position
        await client.call(ring[position])
        position = (position + 1) % len(ring)
        return 1
    return one


def kv_put(connection: int, auth: bytes, ops: int = 1):
    return _cycling([_request("/api/v1/kv", orjson.dumps({"operations": [
        {"op": "put", "ns": "bench", "key": f"k{connection}-{i}-{j}", "value": "v" * 32, "ttlSeconds": 3600}
        for j in range(ops)]}), auth) for i in range(64)])


def kv_get(connection: int, auth: bytes, ops: int = 1):
    """Gets of absent keys: a read, answered once the versions it saw are durable (at once here)."""
    return _cycling([_request("/api/v1/kv", orjson.dumps({"operations": [
        {"op": "get", "ns": "bench", "key": f"k{connection}-{i}-{j}"} for j in range(ops)]}), auth)
        for i in range(64)])


def txn_step(connection: int, auth: bytes, ops: int = 1):
    """A workflow step as the bench's txn-step makes it (bench/queue_sessions.py, QueenTxnStep): pop
    up to `ops` messages of the preloaded queue, then one transaction that acks them, pushes each
    one's successor to the next queue and puts a KV row per message. Two requests a step."""
    from bench.queue_sessions import PAYLOAD, TXN_NS, next_queue_name, queue_name
    queue, next_queue = queue_name(TXN_TAG), next_queue_name(TXN_TAG)
    pop = (b"GET /api/v1/pop/queue/%s?batch=%d HTTP/1.1\r\nhost: %s\r\n%s\r\n"
           % (queue.encode(), ops, HOST.encode(), auth))
    keys = [[f"c{connection}-{g}-{i}" for i in range(ops)] for g in range(16)]
    position = 0

    async def one(client: _Client) -> int:
        nonlocal position
        doc = orjson.loads(await client.call(pop))
        messages = doc.get("messages") or []
        if not doc.get("success") or not messages:
            raise RuntimeError(f"the pop found nothing (preload too small?): {doc!r:.300}")
        partition_id, lease_id = doc["partitionId"], doc["leaseId"]
        txn = {
            "ack": [{"partitionId": partition_id, "leaseId": lease_id, "transactionId": m["transactionId"]}
                    for m in messages],
            "push": [{"queue": next_queue, "partition": m["partition"], "transactionId": f"{m['transactionId']}-next",
                      "payload": PAYLOAD} for m in messages],
            "kv": [{"op": "put", "ns": TXN_NS, "key": key, "value": {"step": 2, "from": m["transactionId"]},
                    "forever": True} for key, m in zip(keys[position], messages, strict=False)],
        }
        position = (position + 1) % len(keys)
        answer = await client.call(_request("/api/v1/transaction", orjson.dumps(txn), auth))
        if not answer.startswith(b'{"success":true'):
            raise RuntimeError(f"transaction failed: {answer[:300]!r}")
        return 2
    return one


def txn_step_setup(messages: int, auth: bytes) -> list[bytes]:
    """The queues a txn-step run uses, and `messages` messages over 64 partitions."""
    from bench.queue_sessions import (
        LEASE_SECONDS,
        PARTITIONS,
        PAYLOAD,
        QUEUE_MAX_SIZE,
        next_queue_name,
        partition_name,
        queue_name,
    )
    queue = queue_name(TXN_TAG)
    out = [_request("/api/v1/configure", orjson.dumps({"queue": name, "options": {
        "leaseTimeSeconds": LEASE_SECONDS, "maxSize": QUEUE_MAX_SIZE}}), auth) for name in (queue, next_queue_name(TXN_TAG))]
    for start in range(0, messages, 1000):
        items = [{"queue": queue, "partition": partition_name(m % PARTITIONS), "payload": PAYLOAD,
                  "transactionId": f"pre-{m}"} for m in range(start, min(start + 1000, messages))]
        out.append(_request("/api/v1/push", orjson.dumps({"items": items}), auth))
    return out


TXN_TAG = "reqcost"
WORKLOADS = {"lock-cycle": lock_cycle, "kv-put": kv_put, "kv-get": kv_get, "txn-step": txn_step}


def _callgrind(command: str) -> None:
    subprocess.run(["callgrind_control", command, str(os.getpid())], check=True, stdout=subprocess.DEVNULL)


async def drive(args, data_dir: str, auth_file: str, token: str | None) -> None:
    from queen.config import Config
    from queen.http import connection as connection_module
    from queen.runtime import server as server_module
    from queen.runtime.server import Server

    if args.callgrind:
        # Ticks and the reaper run by wall-clock time, which under callgrind (and on a loaded
        # machine) stretches unevenly: their work would be charged to requests at a varying rate.
        # Every lease here outlives the run, so ticks have nothing to do that requests wait for.
        server_module.TICK_MS = 3_600_000
        connection_module.REAPER_INTERVAL_S = 3600.0

    config = Config(port=0, data_dir=data_dir, auth_file=auth_file, shard_count=args.shards, log_level="warning")
    auth = b"authorization: Bearer %s\r\n" % token.encode() if token else b""
    async with trio.open_nursery() as nursery:
        server = await nursery.start(Server(config).run)
        if args.commit != "auto":
            # Where frames are written, held fixed: a run under callgrind is slow enough that the
            # writer's own choice (by fsync time) would flip between runs and blur the counts.
            server.writer._inline_allowed = False
            server.writer._inline = args.commit == "inline"
        clients = []
        for c in range(args.connections):
            sock = socket.create_connection((HOST, server.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            clients.append((_Client(sock), WORKLOADS[args.workload](c, auth, args.ops)))
        if args.workload == "txn-step":
            # Every step takes up to `ops` messages (a pop takes one partition's): enough for all,
            # with a partition's worth to spare for each connection.
            steps = (args.warmup + args.requests) // 2 + args.connections
            for setup in txn_step_setup(steps * args.ops + 64 * args.ops, auth):
                await clients[0][0].call(setup)

        async def run(count: int) -> int:
            done = 0

            async def loop(client, one, share):
                nonlocal done
                sent = 0
                while sent < share:
                    sent += await one(client)
                done += sent
            async with trio.open_nursery() as runners:
                for client, one in clients:
                    runners.start_soon(loop, client, one, count // len(clients))
            return done

        await run(args.warmup)
        if args.callgrind:
            _callgrind("-z")
        cpu, wall = time.process_time(), time.perf_counter()
        done = await run(args.requests)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if args.callgrind:
            _callgrind("-d")
        stats = server.writer.statistics()
        print(f"workload={args.workload} ops={args.ops} connections={args.connections} auth={'on' if token else 'off'} "
              f"requests={done} cpu_us_per_request={cpu / done * 1e6:.1f} wall_s={wall:.2f} "
              f"frames={stats.batches} inline_commits={stats.inline_commits}", flush=True)
        for client, _ in clients:
            client.sock.close()
        server.request_shutdown()


def callgrind_totals(pattern: str) -> int:
    """Ir of the last dump (the measured part) among callgrind's files."""
    dumps = sorted(glob.glob(pattern), key=os.path.getmtime)
    with open(dumps[-1]) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError("no totals in " + dumps[-1])


# -- folding a py-spy record into the request's layers -------------------------------------------

# (path fragment, function names or None for any, layer), innermost frame first; the first match names
# the layer. Finer than bench/profile.py's rules: this is one request's path, end to end.
LAYERS = (
    ("bench/reqcost.py", None, "(client, not counted)"),
    ("queen/wal/frame.py", None, "record encode (WAL frame: cbor2 + zstd + crc)"),
    ("queen/core/records.py", None, "record encode (WAL frame: cbor2 + zstd + crc)"),
    ("queen/wal/disk.py", None, "WAL write + fdatasync"),
    ("queen/wal/", None, "WAL commit (writer task, wake-ups)"),
    ("queen/core/locks.py", {"parse_lock_ops", "parse_lock_op", "_parse_one"}, "op parse + validation"),
    ("queen/core/kv.py", {"parse_kv_ops", "parse_kv_op", "_text", "_int", "parse_lifetime", "check_value",
                          "check_fields"}, "op parse + validation"),
    ("queen/http/queen_mq.py", None, "op parse + validation"),
    ("queen/core/", None, "apply (core state)"),
    ("queen/runtime/steps.py", None, "apply (core state)"),
    ("queen/runtime/shard_actor.py", None, "router + hand-off (split, actor, channels, events)"),
    ("queen/runtime/router.py", None, "router + hand-off (split, actor, channels, events)"),
    ("trio/_channel.py", None, "router + hand-off (split, actor, channels, events)"),
    ("trio/_sync.py", None, "router + hand-off (split, actor, channels, events)"),
    ("queen/http/codec.py", {"decode_body"}, "body decode (orjson)"),
    ("queen/http/codec.py", {"encode_body"}, "answer encode (orjson + head)"),
    ("queen/http/wire.py", {"encode_response", "encode_head"}, "answer encode (orjson + head)"),
    ("queen/http/wire.py", None, "HTTP parse"),
    ("queen/http/connection.py", {"parse_simple_request"}, "HTTP parse"),
    ("queen/auth.py", None, "routing + auth"),
    ("queen/http/tenancy.py", None, "routing + auth"),
    ("queen/http/routes.py", None, "routing + auth"),
    ("queen/http/connection.py", {"_send_all"}, "send (socket)"),
    ("queen/http/connection.py", {"_receive"}, "receive (socket, epoll)"),
    ("queen/http/connection.py", None, "HTTP connection loop"),
    ("trio/_core/_io_epoll.py", None, "receive (socket, epoll)"),
    ("trio/", None, "trio scheduling (run loop, task switches)"),
    ("queen/", None, "queen, other"),
)


FSYNC = "(in write + fdatasync: the kernel and the device, not counted)"


def fold(raw_path: str) -> list[tuple[str, int, float]]:
    """(layer, samples, share of the server's samples) of the event-loop thread of a py-spy raw record."""
    from bench.profile import IDLE_FRAMES, OFF_CPU_FRAMES, _frame_parts, _matches

    counts: dict[str, int] = {}
    with open(raw_path, errors="replace") as f:
        for line in f:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            if not count_text.isdigit():
                continue
            parts = stack.split(";")
            if parts[0].startswith("thread (") and not parts[0].endswith("): MainThread"):
                continue  # the event loop's own thread only: commits are inline (--commit)
            frames = parts[1:] if parts[0].startswith("thread (") else parts
            if frames and _matches(frames[-1], IDLE_FRAMES):
                continue
            if frames and _matches(frames[-1], OFF_CPU_FRAMES):
                counts[FSYNC] = counts.get(FSYNC, 0) + int(count_text)
                continue
            layer = "other (interpreter, stdlib)"
            for frame in reversed(frames):
                function, path = _frame_parts(frame)
                hit = next((name for fragment, functions, name in LAYERS
                            if fragment in path and (functions is None or function in functions)), None)
                if hit is not None:
                    layer = hit
                    break
            counts[layer] = counts.get(layer, 0) + int(count_text)
    server = sum(count for layer, count in counts.items() if not layer.startswith("("))
    return [(layer, count, count / server if not layer.startswith("(") else 0.0)
            for layer, count in sorted(counts.items(), key=lambda item: -item[1])]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reqcost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="lock-cycle")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--ops", type=int, default=1, help="operations per request")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--auth", action="store_true", help="with an auth file; the client sends a tenant admin's token")
    parser.add_argument("--callgrind", action="store_true", help="running under callgrind: zero and dump around the measured part")
    parser.add_argument("--commit", choices=("auto", "inline", "thread"), default="inline",
                        help="where WAL frames are written: held on the event loop (as on a fast disk), in the disk "
                             "thread (as on a slow one), or the writer's own choice")
    parser.add_argument("--data-parent", default=None)
    parser.add_argument("--fold", metavar="RAW", help="fold a py-spy raw record of this driver into layers, and exit")
    args = parser.parse_args(argv)
    if args.fold:
        for layer, count, share in fold(args.fold):
            print(f"{share * 100:5.1f}%  {count:7d}  {layer}")
        return
    data_dir = tempfile.mkdtemp(prefix="queen-reqcost-", dir=args.data_parent)
    try:
        auth_file, token = "", None
        if args.auth:
            auth_file = os.path.join(data_dir, "auth.json")
            token = subprocess.run([sys.executable, "-m", "queen", "auth", "add", "bench", "--role", "admin",
                                    "--tenant", "bench", "--auth-file", auth_file], capture_output=True, text=True,
                                   check=True).stdout.strip()
        wal_dir = os.path.join(data_dir, "data")
        from queen.runtime import server as server_module
        if hasattr(server_module, "settle_collector"):
            server_module.settle_collector()  # as `queen serve` does, once its modules are imported
        trio.run(drive, args, wal_dir, auth_file, token)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
