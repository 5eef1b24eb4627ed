"""A do-nothing trio + h11 server: the ceiling for one request per round trip in this stack.

It does per request what Queen's HTTP layer must do anyway (receive bytes, let h11 parse the
request head and the body, build and send a response through h11, keep the connection alive) and
nothing else: the body is read and dropped, the answer is a fixed small JSON document. Queen's
one-operation rate divided by this rate is the share of the ceiling Queen reaches; what Queen
loses below it is routing, JSON, the core, the WAL and the waiting for durability.

The connection loop mirrors queen/http/connection.py's shape (receive_some, next_event, one
send_all per response) so the comparison measures Queen's work, not a different HTTP strategy.

Run: python -m bench.baseline_h11 --port 6640   (127.0.0.1 only; SIGTERM or SIGINT stops it)
"""

from __future__ import annotations

import argparse
import signal
import sys

import h11
import trio

RECEIVE_BYTES = 65536
BODY = b'{"results":[{"applied":true,"version":1,"index":0,"op":"put"}]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY))]


async def serve_connection(stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(RECEIVE_BYTES))
                continue
            kind = type(event)
            if kind is h11.EndOfMessage:
                data = conn.send(h11.Response(status_code=200, headers=HEADERS, reason=b"OK"))
                data += conn.send(h11.Data(data=BODY))
                data += conn.send(h11.EndOfMessage())
                await stream.send_all(data)
                if conn.our_state is not h11.DONE:
                    return
                conn.start_next_cycle()
            elif kind is h11.ConnectionClosed:
                return
    except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        await stream.aclose()


async def main(host: str, port: int) -> None:
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(port, host=host)
        print(f"event=listening host={host} port={listeners[0].socket.getsockname()[1]}", file=sys.stderr, flush=True)
        nursery.start_soon(trio.serve_listeners, serve_connection, listeners)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6640)
    args = parser.parse_args()
    trio.run(main, args.host, args.port)
