"""A refused call as the SDK and the CLI show it: the server's code, its message (never the JSON
text of its body), its details; from the envelope `{"error": "<message>", "code", "details",
"detail"}`, and from an older server's `{"error": {"code", "message", "details"}}` too."""

import os
import subprocess
import sys

import orjson
import pytest

import queen_client
from queen_client.errors import BadRequestError, RateLimited, from_response


def test_the_envelope_gives_code_message_and_details():
    body = orjson.dumps({"error": "ns must be 1 to 128 bytes", "code": "invalid_ns", "details": {"index": 2},
                         "detail": "ns must be 1 to 128 bytes"})
    error = from_response(400, body)
    assert type(error) is BadRequestError
    assert (error.code, error.message, error.details, error.status) == ("invalid_ns", "ns must be 1 to 128 bytes",
                                                                        {"index": 2}, 400)
    assert str(error) == "invalid_ns: ns must be 1 to 128 bytes (HTTP 400)"


def test_an_older_server_s_nested_envelope_is_read_the_same():
    body = orjson.dumps({"error": {"code": "rate_limited", "message": "over the write rate",
                                   "details": {"retryAfterMs": 250}},
                         "code": "rate_limited", "detail": "over the write rate"})
    error = from_response(429, body, retry_after="1")
    assert type(error) is RateLimited
    assert (error.code, error.message, error.details, error.retry_after_s) == (
        "rate_limited", "over the write rate", {"retryAfterMs": 250}, 0.25)


def test_a_body_that_is_no_envelope_is_shown_as_it_came():
    error = from_response(502, b"<html>bad gateway</html>")
    assert (error.code, error.message, error.details) == ("http_502", "<html>bad gateway</html>", {})


def test_a_real_refusal_reaches_the_caller_as_its_code_and_message(server):
    with queen_client.SyncClient(server.url) as client:
        with pytest.raises(BadRequestError) as refused:
            client.kv.put("queen-locks", "x", 1, forever=True)
    status, body = server.request("PUT", "/api/v1/kv/queen-locks/x", {"value": 1, "forever": True})
    assert refused.value.code == body["code"] == "reserved_namespace"
    assert refused.value.message == body["error"] == body["detail"] and "{" not in refused.value.message
    assert refused.value.details["ns"] == body["details"]["ns"] == "queen-locks"  # the SDK sends a batch: index too


def test_the_cli_prints_the_code_and_the_message(server):
    done = subprocess.run([sys.executable, "-m", "queen", "kv", "put", "queen-locks", "x", "1", "--ttl", "60"],
                          env=dict(os.environ, QUEEN_URL=server.url), capture_output=True, text=True, timeout=60)
    status, body = server.request("PUT", "/api/v1/kv/queen-locks/x", {"value": 1, "ttlSeconds": 60})
    assert done.returncode == 65
    assert done.stderr == f"queen: rejected: reserved_namespace: {body['error']}\n"
