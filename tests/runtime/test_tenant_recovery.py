"""Tenants survive a restart: after a SIGKILL whose restart replays the log, and after one whose
restart loads a snapshot, each tenant sees exactly what it saw before (its keys, locks, queues,
DLQ, timers, and the usage figures of GET /api/v1/tenant) and nothing of the other's.

A tenant's names are stored with its prefix in the log itself (queen/core/tenants.py), so recovery
and snapshots need not know tenants exist; these tests hold the server to that, and to its usage
figures being rebuilt exactly from what it recovered.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time

import pytest

from queen.auth import AuthFile
from queen.testing import ServerProcess
from queen.wal.segment import list_dir

_RECOVERED = re.compile(r"event=recovered snapshot_version=(\d+) snapshot_records=(\d+) .*? records=(\d+) ")


def call(server: ServerProcess, secret: str, method: str, target: str, body=None):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=15)
    try:
        connection.request(method, target, body=None if body is None else json.dumps(body).encode(),
                           headers={"content-type": "application/json", "authorization": f"Bearer {secret}"})
        response = connection.getresponse()
        raw = response.read()
    finally:
        connection.close()
    assert response.status == 200, (method, target, response.status, raw)
    return json.loads(raw) if raw[:1] in (b"{", b"[") else raw


def fill(server: ServerProcess, secret: str, tag: str) -> int:
    """One tenant's things, each named as the other tenant names its own, with its own values; the
    id of the lease it holds."""
    for n in range(3):
        call(server, secret, "PUT", f"/api/v1/kv/app/k{n}", {"value": f"{tag}-{n}", "forever": True})
    call(server, secret, "PUT", f"/api/v1/kv/app/{tag}-only", {"value": tag * 10, "ttlSeconds": 3600})
    [lock] = call(server, secret, "POST", "/api/v1/locks", {"operations": [
        {"op": "acquire", "name": "job", "ttlSeconds": 3600, "owner": f"{tag}-worker"}]})["results"]
    assert lock["acquired"] is True
    call(server, secret, "POST", "/api/v1/configure", {"queue": "orders", "options": {"retryLimit": 2}})
    call(server, secret, "POST", "/api/v1/push", {"items": [
        {"queue": "orders", "partition": "p", "payload": f"{tag}-message-{n}"} for n in range(3)]})
    call(server, secret, "POST", "/api/v1/push", {"items": [{"queue": "orders", "partition": "dead", "payload": tag}]})
    popped = call(server, secret, "GET", "/api/v1/pop/queue/orders/partition/dead")
    [message] = popped["messages"]
    call(server, secret, "POST", "/api/v1/ack", {"partitionId": message["partitionId"], "leaseId": message["leaseId"],
                                                 "offset": message["offset"], "status": "dlq", "error": tag})
    leased = call(server, secret, "GET", "/api/v1/pop/queue/orders/partition/p")  # a lease that lasts the restart
    assert leased["success"] is True
    call(server, secret, "POST", "/api/v1/timers", {"operations": [
        {"op": "schedule", "queue": "orders", "key": "reminder", "delayMs": 3_600_000, "payload": f"{tag}-timer"}]})
    return leased["leaseId"]


def view(server: ServerProcess, secret: str) -> dict:
    """Everything a tenant can see of its own."""
    reads = {
        "tenant": ("GET", "/api/v1/tenant", None),
        "keys": ("GET", "/api/v1/kv/app?prefix=", None),
        "locks": ("GET", "/api/v1/locks", None),
        "queues": ("GET", "/api/v1/resources/queues", None),
        "orders": ("GET", "/api/v1/resources/queues/orders", None),
        "partitions": ("GET", "/api/v1/resources/queues/orders/partitions", None),
        "dlq": ("GET", "/api/v1/dlq?queue=orders", None),
        "timers": ("GET", "/api/v1/timers?queue=orders", None),
    }
    return {name: without_live_counts(call(server, secret, *read)) for name, read in reads.items()}


# What a queue view counts of this process's traffic and callers (since it started), not of its state:
# a restart starts them again.
LIVE_COUNTS = frozenset(("totals", "consumers", "parkedPops"))


def without_live_counts(document):
    if isinstance(document, dict):
        return {key: without_live_counts(value) for key, value in document.items() if key not in LIVE_COUNTS}
    if isinstance(document, list):
        return [without_live_counts(item) for item in document]
    return document


def snapshots_written(server: ServerProcess, operator: str) -> float:
    text = call(server, operator, "GET", "/metrics").decode()
    match = re.search(r"^queen_snapshots_total (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def wait_for_a_snapshot_of_everything(server: ServerProcess, operator: str) -> None:
    """A snapshot that ends now may have been started before the last write: wait for the end of
    the one after it, nudging the server with default-tenant writes (each may start one; the
    default tenant's usage is not counted)."""
    target = snapshots_written(server, operator) + 2
    for n in range(500):  # waiting on the real server's snapshots, not on time to pass
        if snapshots_written(server, operator) >= target:
            return
        call(server, operator, "PUT", f"/api/v1/kv/nudge/k{n}", {"value": "x" * 200, "forever": True})
        time.sleep(0.01)
    raise AssertionError("no snapshot was written")


def recovered(server: ServerProcess) -> tuple[int, int, int]:
    """(snapshot version, snapshot records, log records) of the server's last start."""
    *_, last = _RECOVERED.finditer(server.log_text())
    return int(last.group(1)), int(last.group(2)), int(last.group(3))


@pytest.mark.parametrize("from_snapshot", [False, True], ids=["replay-after-sigkill", "from-snapshot"])
def test_tenants_see_the_same_things_and_usage_after_a_restart(tmp_path, from_snapshot):
    path = str(tmp_path / "auth.json")
    file = AuthFile.load(path, missing_ok=True)
    alpha, beta = file.add("alpha-admin", "admin", "alpha"), file.add("beta-admin", "admin", "beta")
    operator = file.add("ops", "admin", "*")
    file.save()
    data_dir = str(tmp_path / "data")
    args = ["--auth-file", path, "--snapshot-wal-bytes", "4096" if from_snapshot else str(1 << 30)]
    server = ServerProcess(data_dir, *args).start()
    try:
        leases = {"alpha": fill(server, alpha, "alpha"), "beta": fill(server, beta, "beta")}
        call(server, operator, "PUT", "/api/v1/kv/app/k0", {"value": "default-0", "forever": True})
        before = {"alpha": view(server, alpha), "beta": view(server, beta)}
        usage = before["alpha"]["tenant"]["usage"]
        # alpha holds 4 keys and a lock permit, 4 messages (one in the DLQ) and a timer.
        assert (usage["keys"], usage["messages"], usage["timers"]) == (5, 4, 1) and usage["bytes"] > 0, usage
        beta_usage = before["beta"]["tenant"]["usage"]
        assert (beta_usage["keys"], beta_usage["messages"], beta_usage["timers"]) == (5, 4, 1), beta_usage
        if from_snapshot:
            wait_for_a_snapshot_of_everything(server, operator)
            assert list_dir(os.listdir(data_dir))[1], "no snapshot file to restart from"
        else:
            assert not list_dir(os.listdir(data_dir))[1], "a snapshot was taken: this restart would not replay"
        server.kill()  # SIGKILL: nothing is flushed or snapshotted on the way down
        server.start()
        snapshot_version, snapshot_records, log_records = recovered(server)
        if from_snapshot:
            assert snapshot_version > 0 and snapshot_records > 0
        else:
            assert snapshot_version == 0 and log_records > 0
        after = {"alpha": view(server, alpha), "beta": view(server, beta)}
        for tenant in ("alpha", "beta"):
            for name, seen in before[tenant].items():
                assert after[tenant][name] == seen, (tenant, name)
        # And each still sees only its own.
        for tenant, secret in (("alpha", alpha), ("beta", beta)):
            other = "beta" if tenant == "alpha" else "alpha"
            keys = {item["key"]: item["value"] for item in after[tenant]["keys"]["items"]}
            assert keys == {"k0": f"{tenant}-0", "k1": f"{tenant}-1", "k2": f"{tenant}-2",
                            f"{tenant}-only": tenant * 10}
            assert [(item["name"], item["owner"]) for item in after[tenant]["locks"]["items"]] == [
                ("job", f"{tenant}-worker")]
            assert [item["queue"] for item in after[tenant]["queues"]["items"]] == ["orders"]
            assert [m["error"] for m in after[tenant]["dlq"]["messages"]] == [tenant]
            assert [item["key"] for item in after[tenant]["timers"]["items"]] == ["reminder"]
            assert call(server, secret, "GET", f"/api/v1/kv/app/{other}-only")["found"] is False
            timer = call(server, secret, "GET", "/api/v1/timers/orders/reminder")
            assert timer["found"] is True and timer["payload"] == f"{tenant}-timer", timer
            # The leases came back as their tenant's: the other's id is lost to it, its own is live.
            lost = call(server, secret, "POST", f"/api/v1/lease/{leases[other]}/extend", {})
            assert lost["success"] is False and lost["reason"] == "lease_lost"
            assert call(server, secret, "POST", f"/api/v1/lease/{leases[tenant]}/release", {})["success"] is True
            popped = call(server, secret, "GET", "/api/v1/pop/queue/orders?batch=10&partitions=5")
            assert [m["data"] for m in popped["messages"]] == [f"{tenant}-message-{n}" for n in range(3)]
        assert call(server, operator, "GET", "/api/v1/kv/app/k0")["value"] == "default-0"
        assert call(server, operator, "GET", "/api/v1/kv/app?prefix=")["items"][0]["value"] == "default-0"
    finally:
        server.stop()
