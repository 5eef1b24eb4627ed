"""A do-nothing server on Queen's own HTTP layer: the ceiling for one request per round trip.

It runs queen.http.connection.HttpServer, the very connection loop Queen serves with (the plain
request parser, h11 for every other shape, the limits and timers, responses written as bytes),
with an app that answers every request with a fixed small JSON document and does nothing else.
Queen's one-operation rate divided by this rate is the share of the ceiling Queen reaches; what
Queen loses below it is routing, JSON, the core, the WAL and the waiting for durability.

Run: python -m bench.baseline_http --port 6640   (127.0.0.1 only; SIGTERM or SIGINT stops it)
With --tls-cert FILE --tls-key FILE it serves HTTPS, as `queen serve` does with the same flags;
with --port 0 --port-file FILE it takes a free port and names it in FILE, as `queen serve` does.
"""

from __future__ import annotations

import argparse
import signal
import sys

import trio

from queen.config import Config
from queen.http.connection import HttpServer, open_listeners
from queen.http.wire import Response
from queen.runtime import port_file

BODY = b'{"results":[{"applied":true,"version":1,"index":0,"op":"put"}]}'


class FixedAnswer:
    async def handle(self, request) -> Response:
        return Response(200, BODY, b"application/json")


async def main(host: str, port: int, tls_cert: str = "", tls_key: str = "", ports_path: str = "") -> None:
    http = HttpServer(FixedAnswer(), Config(tls_cert=tls_cert, tls_key=tls_key))
    async with trio.open_nursery() as nursery:
        listeners = open_listeners(host, port)
        bound = listeners[0].getsockname()[1]
        print(f"event=listening host={host} port={bound}", file=sys.stderr, flush=True)
        nursery.start_soon(http.serve, listeners, nursery)
        if ports_path:
            await trio.to_thread.run_sync(port_file.write, ports_path, bound)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()
    if ports_path:
        port_file.remove(ports_path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6640)
    parser.add_argument("--tls-cert", default="")
    parser.add_argument("--tls-key", default="")
    parser.add_argument("--port-file", default="", help="once listening, write {\"port\": N} here (queen serve's format)")
    args = parser.parse_args()
    trio.run(main, args.host, args.port, args.tls_cert, args.tls_key, args.port_file)
