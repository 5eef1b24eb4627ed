"""The lock handle's overhead: acquire+release cycles per second through the SDK (`queen_client.Client`,
a handle per worker) against raw HTTP (pre-built JSON on h11 keep-alive connections), with the
same number of connections and workers, against one fresh `queen serve`.

    python -m bench.sdk_locks                      # 1 and 16 connections, 5 s each
    python -m bench.sdk_locks --connections 1,4,16 --duration 10

Each worker loops acquire + release on its own lock name, so nothing waits on contention: what is
measured is the cost of a cycle. Raw HTTP is the floor: two requests, their JSON, nothing else.
The SDK adds its handle (owner, lease state machine, starting and cancelling the background
renewer, typed results) and its pooled transport with the retry policy. The server runs pinned to
CPU 0 and this process to CPU 1 (when there are two), as bench/ does elsewhere, so the client's
own CPU shows as fewer cycles only when it is the bottleneck.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import anyio
import h11
import orjson

import queen_client
from queen.testing import ServerProcess

RAW = "raw HTTP (trio+h11)"


async def raw_cycles(port: int, connections: int, duration_s: float) -> int:
    """Acquire+release cycles through plain h11 connections, one worker per connection."""
    counts = [0] * connections
    stop_at = anyio.current_time() + duration_s

    async def worker(index: int) -> None:
        stream = await anyio.connect_tcp("127.0.0.1", port)
        conn = h11.Connection(h11.CLIENT)
        name = f"raw-{index}"
        owner = f"bench:{os.getpid()}:{index}"

        async def call(document) -> dict:
            body = orjson.dumps(document)
            await stream.send(conn.send(h11.Request(method="POST", target="/api/v1/locks", headers=[
                ("host", "queen"), ("content-type", "application/json"), ("content-length", str(len(body)))]))
                + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
            parts = []
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive(65536))
                elif isinstance(event, h11.Data):
                    parts.append(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
            conn.start_next_cycle()
            return orjson.loads(b"".join(parts))["results"][0]

        while anyio.current_time() < stop_at:
            granted = await call({"operations": [{"op": "acquire", "name": name, "ttlSeconds": 30, "owner": owner}]})
            assert granted["acquired"], granted
            released = await call({"operations": [{"op": "release", "name": name, "slot": 0, "token": granted["token"], "owner": owner}]})
            assert released["released"], released
            counts[index] += 1
        await stream.aclose()

    async with anyio.create_task_group() as tasks:
        for index in range(connections):
            tasks.start_soon(worker, index)
    return sum(counts)


async def sdk_cycles(url: str, connections: int, duration_s: float) -> int:
    """Acquire+release cycles through `queen_client.Client` handles, as many workers as connections."""
    counts = [0] * connections
    stop_at = anyio.current_time() + duration_s
    async with queen_client.Client(url, connections_max=connections) as client:
        async def worker(index: int) -> None:
            lock = client.lock(f"sdk-{index}-{anyio.current_time()}", ttl="30s")
            while anyio.current_time() < stop_at:
                assert await lock.acquire()
                assert await lock.release()
                counts[index] += 1

        async with anyio.create_task_group() as tasks:
            for index in range(connections):
                tasks.start_soon(worker, index)
    return sum(counts)


def _measure(fn, *args, backend: str) -> tuple[int, float]:
    """(cycles, this process's CPU seconds): the client's own cost per cycle does not depend on how
    busy the server or a neighbour on the machine is, where cycles/s does."""
    cpu_before = time.process_time()
    cycles = anyio.run(fn, *args, backend=backend)
    return cycles, time.process_time() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", default="1,16", help="comma-separated connection counts (1,16)")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per run (5)")
    parser.add_argument("--backends", default="trio,asyncio", help="event loops to run the SDK on (trio,asyncio)")
    parser.add_argument("--repeat", type=int, default=1, help="interleaved rounds; the table shows medians (1)")
    args = parser.parse_args()
    counts = [int(c) for c in args.connections.split(",")]
    backends = args.backends.split(",")
    two_cpus = len(os.sched_getaffinity(0)) >= 2
    results: dict[tuple[int, str], list[tuple[int, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(os.path.join(tmp, "data")) as server:
        if two_cpus:
            os.sched_setaffinity(server.process.pid, {0})
            os.sched_setaffinity(0, {1})
        anyio.run(sdk_cycles, server.url, 4, 1.0, backend="trio")  # warm up: imports, first connections
        for _ in range(args.repeat):
            for connections in counts:
                key = (connections, RAW)
                results.setdefault(key, []).append(_measure(raw_cycles, server.port, connections, args.duration, backend="trio"))
                for backend in backends:
                    key = (connections, f"SDK Client ({backend})")
                    results.setdefault(key, []).append(_measure(sdk_cycles, server.url, connections, args.duration, backend=backend))
    print(f"\nacquire+release cycles, {args.duration:g} s per run, median of {args.repeat}; server on CPU 0, client on "
          f"CPU 1{'' if two_cpus else ' (one CPU: not pinned)'}; {time.strftime('%Y-%m-%d %H:%M')}\n")
    print("| connections | client | cycles/s | vs raw | client CPU µs/cycle |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for connections in counts:
        raw_rate = statistics.median(c for c, _ in results[(connections, RAW)]) / args.duration
        for (count, label), runs in results.items():
            if count != connections:
                continue
            rate = statistics.median(c for c, _ in runs) / args.duration
            cpu_us = statistics.median(cpu / c * 1e6 for c, cpu in runs if c)
            print(f"| {connections} | {label} | {rate:,.0f} | {rate / raw_rate:.2f} | {cpu_us:,.0f} |")


if __name__ == "__main__":
    main()
