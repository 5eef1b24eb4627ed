"""A tiny fake cluster node (trio + h11) for the SDK's leader-following and failover tests: it
answers each request as a script says, as a leader, a follower, a node that refuses, or a node
that dies under a call (reads the request, then closes the connection without answering)."""

from __future__ import annotations

import json

import h11
import trio

DROP = "drop"  # an answer: close the connection without a word, the request read (maybe applied)


def error_body(code: str, message: str, details: dict | None = None) -> dict:
    """An error document as the server writes it, in the envelope of today and of tomorrow (the
    code and details also at the top level), so the SDK reads it either way."""
    details = details or {}
    return {"error": {"code": code, "message": message, "details": details}, "code": code, "details": details,
            "detail": message}


class FakeNode:
    """Answers each request with `answer(method, target, body)` -> (status, headers, body dict), or
    DROP. `seen` lists every request read, dropped ones included."""

    def __init__(self, answer):
        self.answer = answer
        self.seen: list[tuple[str, str, bytes]] = []
        self.port = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, nursery):
        self._scope = trio.CancelScope()

        async def run(task_status):
            with self._scope:
                await trio.serve_tcp(self._handle, 0, host="127.0.0.1", task_status=task_status)

        listeners = await nursery.start(run)
        self.port = listeners[0].socket.getsockname()[1]

    def kill(self) -> None:
        """As a SIGKILL does: the listener and every connection closed, new ones refused."""
        self._scope.cancel()

    async def _handle(self, stream):
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                method = target = None
                body = b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        conn.receive_data(data)
                    elif isinstance(event, h11.Request):
                        method, target = event.method.decode(), event.target.decode()
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                self.seen.append((method, target, body))
                reply = self.answer(method, target, body)
                if reply == DROP:
                    return
                status, headers, document = reply
                payload = json.dumps(document).encode() if document is not None else b""
                head = [("content-length", str(len(payload))), ("content-type", "application/json"),
                        *headers.items()]
                await stream.send_all(conn.send(h11.Response(status_code=status, headers=head))
                                      + conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage()))
                conn.start_next_cycle()
        except (trio.BrokenResourceError, h11.ProtocolError):
            return
        finally:
            await stream.aclose()


def kv_leader(epoch: int, store: dict | None = None):
    """A leader's KV answers over `store` (key -> (value, version), shared by the leaders of one
    cluster, as replication would): get, put (with expect), putIfAbsent, incr (a put of None, for
    counting calls); each write takes the next version."""
    store = {} if store is None else store

    def answer(method, target, body):
        if not target.startswith("/api/v1/kv"):
            return 404, {}, error_body("not_found", target)
        op = json.loads(body)["operations"][0]
        key = op["key"]
        value, version = store.get(key, (None, 0))
        if op["op"] == "get":
            return 200, {"x-queen-epoch": str(epoch)}, {"results": [{"found": key in store, "value": value,
                                                                      "version": version}]}
        expected = 0 if op["op"] == "putIfAbsent" else op.get("expect")
        if expected is not None and expected != version:
            return 200, {"x-queen-epoch": str(epoch)}, {"results": [{"applied": False, "reason": "version",
                                                                      "current": {"value": value, "version": version}}]}
        version = 1 + max((row[1] for row in store.values()), default=100)  # shared by every leader of store
        store[key] = (op.get("value"), version)
        return 200, {"x-queen-epoch": str(epoch)}, {"results": [{"applied": True, "version": version}]}

    return answer
