"""The exceptions the SDK raises: one family, `ClientError`, translated from the wire in one place
(`from_response`).

Normal outcomes are results, never exceptions: a held lock is `acquired=False`, a missed `expect`
is `applied=False` with a `reason`. Exceptions are for calls that could not be made or were
refused (`ApiError`, carrying the server's snake_case `code`), and for the structured forms of a
lock (`LockLost` out of `hold()`, `LockNotAcquired` when `hold()` could not start the block).
"""

from __future__ import annotations

import sys

import orjson


class ClientError(Exception):
    """Everything the SDK raises on purpose derives from this."""


class TransportError(ClientError):
    """The server could not be reached, or the connection broke before a whole answer arrived.
    The call may or may not have been applied."""


class RequestTimeout(TransportError):
    """No whole answer within the call's timeout. The call may or may not have been applied."""


class CannotConnect(TransportError):
    """Nothing was sent: no connection to `url` could be made (refused: nothing listens there; an
    unknown or unreachable host; or no TLS session, `certificate` when the server's certificate was
    not trusted). The call was not applied, so the SDK tries any call again, on the next node,
    within its failover timeout; a certificate it does not trust is raised at once (waiting does
    not help). The message ends with a hint: `queen serve`, or `ca_file=` / QUEEN_CA_FILE, or (a
    certificate for another host name or address) a name the certificate lists."""

    def __init__(self, url: str, cause: str, *, certificate: bool = False):
        self.url = url
        self.cause = cause
        self.certificate = certificate
        super().__init__(f"cannot connect to {url}: {cause}; {self.hint}")

    @property
    def hint(self) -> str:
        if not self.certificate:
            return "is a Queen server running there? (`queen serve` starts one)"
        cause = self.cause.lower()
        if "hostname mismatch" in cause or "ip address mismatch" in cause:
            return ("the server's certificate is not for this host name or address: use a name the certificate "
                    "lists in the URL")
        return ("the server's certificate is not signed by a CA this client trusts: give the CA's certificate "
                "file as ca_file=... (Client or SyncClient) or in QUEEN_CA_FILE")


class OutcomeUnknown(TransportError):
    """The call was sent and whether it was applied is unknown, and it is not one the SDK may send
    again blindly: the connection broke or timed out before the whole answer came, or the node
    stopped leading while it held the call (503 `leader_lost`, or `sync_unavailable` with
    `details.applied` "unknown"), or a conditional write sent again after such an attempt missed
    (the miss may be its own first attempt's doing). `cause` is the error that left it unknown.
    Read the state (the key's version, the lock's holders, the message's state) before doing it
    again. Calls safe to repeat are repeated instead, and never raise this."""

    def __init__(self, method: str, path: str, cause: ClientError):
        super().__init__(f"{method} {path.split('?', 1)[0]}: the outcome is unknown ({cause}); it may or may not "
                         "have been applied: read the state before doing it again")
        self.method = method
        self.path = path
        self.cause = cause


class ApiError(ClientError):
    """The server answered with its error document: `code` (snake_case), `message`, `details`,
    and the HTTP `status`."""

    def __init__(self, status: int, code: str, message: str, details: dict | None = None):
        super().__init__(f"{code}: {message} (HTTP {status})")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}


class BadRequestError(ApiError):
    """400/413/431 and the like: the call was rejected whole, nothing of it was applied. Sending it
    again will not help."""


class AuthError(BadRequestError):
    """401 (`unauthenticated`: no token, or not a valid one) or 403 (`forbidden`: the token's
    role may not make this call). Nothing was applied."""


class RateLimited(ApiError):
    """429: over the tenant's write rate (`rate_limited`; the SDK waits `retry_after_s` and tries
    again, within its retries) or over one of its quotas (`quota_keys`, `quota_bytes`,
    `quota_messages`, `quota_timers`: waiting does not help until something is deleted or
    consumed). Nothing was applied."""

    def __init__(self, status, code, message, details=None, retry_after_s: float | None = None):
        super().__init__(status, code, message, details)
        self.retry_after_s = retry_after_s


class UnavailableError(ApiError):
    """503: the server cannot make writes durable, is shutting down, is at its connection limit, or
    an admin paused the tenant's KV or queues (`paused`), or the node is not the cluster's leader.
    `retry_after_s` is the server's hint (to the millisecond when it gives one)."""

    def __init__(self, status, code, message, details=None, retry_after_s: float | None = None):
        super().__init__(status, code, message, details)
        self.retry_after_s = retry_after_s


class LockLost(ClientError):
    """The lock stopped being ours while a `hold()` block ran, and the block was cancelled.
    `reason` is "renew" (the broker said so), "expired" (the lifetime passed on our own clock
    without a renewal getting through) or "guard" (a guarded transaction found another holder)."""

    def __init__(self, name: str | None = None, reason: str | None = None):
        super().__init__(f"lost the lock {name!r}: {reason}" if name is not None else "lost the lock")
        self.name = name
        self.reason = reason


class Interrupted(SystemExit):
    """Ctrl-C stopped a worker's `process()` after its graceful stop (handlers finished or cut,
    acks sent, leases released). Uncaught, the program exits with 130, the shell's code for
    Ctrl-C, with no traceback; catch it (or SystemExit) to go on instead."""

    def __init__(self) -> None:
        super().__init__(130)


def say_interrupted(queue_name: str) -> None:
    """The one line a worker stopped by Ctrl-C leaves on stderr before raising Interrupted. Printed,
    not logged: it stands in for the traceback Ctrl-C would print, so it shows whether or not the
    program configured logging (the `queen_client` logger has only a NullHandler until it does)."""
    print(f"queen: interrupted; the worker on {queue_name!r} stopped, its leases released", file=sys.stderr,
          flush=True)


class LockNotAcquired(ClientError):
    """`hold()` could not take the lock, so its block did not run. `reason` is the broker's
    ("held", or "timeout" after a wait) and `holders` who has it."""

    def __init__(self, name: str, reason: str, holders: list | None = None):
        super().__init__(f"lock {name!r} not acquired: {reason}")
        self.name = name
        self.reason = reason
        self.holders = holders or []


def from_response(status: int, body: bytes, retry_after: str | None = None) -> ApiError:
    """The one translation from an HTTP error answer to an exception."""
    code, message, details = f"http_{status}", body[:200].decode(errors="replace"), {}
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("error"), dict):
        nested = document["error"]  # an older server's envelope: {"error": {"code", "message", "details"}}
        document = {"code": nested.get("code"), "detail": nested.get("message"), "details": nested.get("details")}
    if isinstance(document, dict) and isinstance(document.get("code"), str):
        # {"error": "<message>", "code", "details", "detail": "<message>"}
        code = document["code"]
        message = str(document.get("detail") or document.get("error") or message)
        details = document.get("details") or {}
    if status in (429, 503):
        # The hint to the millisecond where the server gives one (details.retryAfterMs: a rate's
        # refill, a node that is not the leader); Retry-After can only say whole seconds.
        precise_ms = details.get("retryAfterMs") if isinstance(details, dict) else None
        try:
            retry_after_s = (precise_ms / 1000 if isinstance(precise_ms, int) and not isinstance(precise_ms, bool)
                             else float(retry_after) if retry_after is not None else None)
        except ValueError:
            retry_after_s = None
        kind = RateLimited if status == 429 else UnavailableError
        return kind(status, code, message, details, retry_after_s)
    if status in (401, 403):
        return AuthError(status, code, message, details)
    if 400 <= status < 500:
        return BadRequestError(status, code, message, details)
    return ApiError(status, code, message, details)
