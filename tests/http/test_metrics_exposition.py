"""/metrics as a Prometheus operator scrapes it, from a real `queen serve --auth-file`: the whole
text accepted by prometheus_client's parser (and `promtool check metrics` where promtool is
installed), request histograms by route template and status, the WAL's fsync and frame
histograms, timer lateness, build_info and process_*, and a tenant's token seeing none of the
server-wide series. The alert rules in ops/queen-alerts.yml are checked here too.
"""

from __future__ import annotations

import platform
import re
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import queen
from queen.auth import AuthFile
from queen.histogram import REQUEST_SECONDS
from queen.runtime.metrics import render_cluster
from queen.testing import ServerProcess
from tests import system_tools

ALERTS = Path(__file__).resolve().parents[2] / "ops" / "queen-alerts.yml"
KV = "/api/v1/kv/{ns}/{key}"
# Families only the operator (or anyone, on an open server) may see: they are about the server.
SERVER_WIDE = ("queen_http_request_duration_seconds", "queen_requests_total", "queen_wal_fsync_seconds",
               "queen_wal_frame_bytes", "queen_log_durable_version", "queen_timer_fire_late_seconds",
               "queen_lock_waiters", "queen_build_info", "process_cpu_seconds_total", "process_open_fds",
               "process_resident_memory_bytes", "process_start_time_seconds")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("metrics")
    auth = AuthFile.load(str(directory / "auth.json"), missing_ok=True)
    secrets = {"operator": auth.add("ops", "admin", "*"), "alpha": auth.add("alpha-writer", "writer", "alpha"),
               "alpha-admin": auth.add("alpha-admin", "admin", "alpha")}
    auth.save()
    process = ServerProcess(str(directory / "data"), "--auth-file", str(directory / "auth.json")).start()
    process.secrets = secrets
    try:
        yield process
    finally:
        process.stop()


def call(server, who: str, method: str, target: str, body=None):
    return server.request(method, target, body, {"authorization": f"Bearer {server.secrets[who]}"})


def scrape(server, who: str = "operator") -> tuple[str, dict[str, dict[tuple, float]]]:
    """The text and its samples as prometheus_client reads them: {family: {sorted labels + name: value}}."""
    status, body = call(server, who, "GET", "/metrics")
    assert status == 200, (status, body)
    text = body.decode()
    families = {}
    for family in text_string_to_metric_families(text):
        samples = {(sample.name, *sorted(sample.labels.items())): sample.value for sample in family.samples}
        families[family.name] = samples
        if family.type == "counter":  # the parser names a counter's family without its _total
            families[family.name + "_total"] = samples
    return text, families


def sample(families, family: str, name: str, **labels) -> float:
    return families[family].get((name, *sorted(labels.items())), 0.0)


def requests_counted(families, route: str, method: str, status: int) -> float:
    return sample(families, "queen_http_request_duration_seconds", "queen_http_request_duration_seconds_count",
                  route=route, method=method, status=str(status))


def poll(condition, what: str, timeout_s: float = 30.0):
    """condition() until it returns something true; a busy machine gets a generous deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)  # between polls of the server, not a wait for time to pass
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_requests_are_counted_by_route_template_method_and_status(server):
    _, before = scrape(server)
    assert call(server, "operator", "PUT", "/api/v1/kv/shop/cart-42", {"value": 1, "forever": True})[0] == 200
    assert call(server, "operator", "GET", "/api/v1/kv/shop/cart-42")[0] == 200
    assert call(server, "operator", "GET", "/api/v1/kv/shop/cart-43")[0] == 200
    assert call(server, "operator", "PUT", "/api/v1/kv/shop/cart-42", {"value": 1})[0] == 400  # no ttl
    assert call(server, "operator", "GET", "/api/v1/kv/shop?prefix=cart-")[0] == 200
    assert call(server, "operator", "POST", "/api/v1/kv/shop/visits/incr", {"by": 1, "forever": True})[0] == 200
    assert call(server, "operator", "GET", "/api/v1/no-such-route/cart-42")[0] == 404
    assert call(server, "alpha", "GET", "/api/v1/tenants")[0] == 403
    assert server.request("GET", "/healthz")[0] == 200
    text, after = scrape(server)

    def delta(route, method, status):
        return requests_counted(after, route, method, status) - requests_counted(before, route, method, status)

    assert delta(KV, "PUT", 200) == 1
    assert delta(KV, "GET", 200) == 2
    assert delta(KV, "PUT", 400) == 1
    assert delta("/api/v1/kv/{ns}", "GET", 200) == 1
    assert delta("/api/v1/kv/{ns}/{key}/incr", "POST", 200) == 1
    assert delta("unmatched", "", 404) == 1
    assert delta("/api/v1/tenants", "GET", 403) == 1
    assert delta("/healthz", "GET", 200) == 1
    assert delta("/metrics", "GET", 200) == 1  # the first scrape, counted once answered
    # Raw paths are never labels: the keys and the unknown path appear nowhere.
    assert "cart-42" not in text and "no-such-route" not in text
    # Each series is a whole histogram: every bound, cumulative counts, +Inf equal to _count.
    series = after["queen_http_request_duration_seconds"]
    labels = (("method", "GET"), ("route", KV), ("status", "200"))
    buckets = sorted((float(dict(key[1:])["le"]), value) for key, value in series.items()
                     if key[0].endswith("_bucket") and tuple(p for p in key[1:] if p[0] != "le") == labels)
    assert [bound for bound, _ in buckets] == [*REQUEST_SECONDS, float("inf")]
    assert all(a <= b for (_, a), (_, b) in zip(buckets, buckets[1:], strict=False))
    assert buckets[-1][1] == series[("queen_http_request_duration_seconds_count", *labels)] >= 2
    assert 0 < series[("queen_http_request_duration_seconds_sum", *labels)] < 60


def test_wal_fsync_and_frame_histograms_follow_the_writes(server):
    _, before = scrape(server)
    for n in range(3):
        assert call(server, "operator", "PUT", f"/api/v1/kv/wal/k{n}", {"value": "x" * 300, "forever": True})[0] == 200
    _, after = scrape(server)
    fsyncs = sample(after, "queen_wal_fsync_seconds", "queen_wal_fsync_seconds_count")
    assert fsyncs - sample(before, "queen_wal_fsync_seconds", "queen_wal_fsync_seconds_count") >= 1
    # One observation per frame, of each: the batch counter, the frame sizes and the bytes written agree.
    assert fsyncs == sample(after, "queen_wal_batches_total", "queen_wal_batches_total")
    assert sample(after, "queen_wal_frame_bytes", "queen_wal_frame_bytes_count") == fsyncs
    assert sample(after, "queen_wal_frame_bytes", "queen_wal_frame_bytes_sum") == sample(
        after, "queen_wal_bytes_total", "queen_wal_bytes_total")
    assert sample(after, "queen_wal_fsync_seconds", "queen_wal_fsync_seconds_bucket", le="+Inf") == fsyncs
    assert sample(after, "queen_log_durable_version", "queen_log_durable_version") >= 3
    assert "queen_version" not in after  # renamed: it is the log's position, not Queen's version


def test_build_info_and_process_metrics(server):
    _, seen = scrape(server)
    assert sample(seen, "queen_build_info", "queen_build_info", version=queen.__version__,
                  python=platform.python_version(), compiled=str(queen._native.COMPILED).lower()) == 1
    assert sample(seen, "process_cpu_seconds_total", "process_cpu_seconds_total") > 0
    assert sample(seen, "process_resident_memory_bytes", "process_resident_memory_bytes") > 1 << 20
    assert sample(seen, "process_virtual_memory_bytes", "process_virtual_memory_bytes") >= sample(
        seen, "process_resident_memory_bytes", "process_resident_memory_bytes")
    assert 0 < sample(seen, "process_open_fds", "process_open_fds") <= sample(seen, "process_max_fds", "process_max_fds")
    started = sample(seen, "process_start_time_seconds", "process_start_time_seconds")
    assert time.time() - 3600 < started <= time.time() + 1


def test_a_fired_timer_is_observed_late_and_pending_timers_are_per_queue(server):
    _, before = scrape(server)
    late_before = sample(before, "queen_timer_fire_late_seconds", "queen_timer_fire_late_seconds_count")
    answer = call(server, "operator", "POST", "/api/v1/timers", {"operations": [
        {"op": "schedule", "queue": "reminders", "key": "soon", "delayMs": 50, "payload": 1},
        {"op": "schedule", "queue": "reminders", "key": "in-an-hour", "delayMs": 3_600_000, "payload": 2}]})
    assert answer[0] == 200, answer

    def fired():
        _, seen = scrape(server)
        count = sample(seen, "queen_timer_fire_late_seconds", "queen_timer_fire_late_seconds_count")
        return seen if count > late_before else None

    seen = poll(fired, "the 50 ms timer fired")
    assert sample(seen, "queen_timer_fire_late_seconds", "queen_timer_fire_late_seconds_bucket", le="+Inf") == \
        sample(seen, "queen_timer_fire_late_seconds", "queen_timer_fire_late_seconds_count")
    assert sample(seen, "queen_timer_fire_late_seconds", "queen_timer_fire_late_seconds_sum") >= 0
    assert sample(seen, "queen_queue_timers_pending", "queen_queue_timers_pending", queue="reminders") == 1


def test_a_tenant_token_sees_its_own_series_and_none_of_the_servers(server):
    assert call(server, "alpha", "POST", "/api/v1/timers", {"operations": [
        {"op": "schedule", "queue": "alpha-later", "key": "k", "delayMs": 3_600_000, "payload": 1}]})[0] == 200
    assert call(server, "operator", "POST", "/api/v1/timers", {"operations": [
        {"op": "schedule", "queue": "operators-later", "key": "k", "delayMs": 3_600_000, "payload": 1}]})[0] == 200
    for who in ("alpha", "alpha-admin"):
        text, seen = scrape(server, who)
        assert sample(seen, "queen_queue_timers_pending", "queen_queue_timers_pending", queue="alpha-later") == 1
        assert "operators-later" not in text and "tenant=" not in text.replace('tenant="alpha"', "")
        shown = [family for family in SERVER_WIDE if family in seen]
        assert shown == [], (who, shown)
        assert not any(name.startswith(("process_", "queen_wal_", "queen_log_", "queen_lock_")) for name in seen)
    _, operator = scrape(server)
    assert all(family in operator for family in SERVER_WIDE), [f for f in SERVER_WIDE if f not in operator]
    assert sample(operator, "queen_queue_timers_pending", "queen_queue_timers_pending", queue="alpha-later",
                  tenant="alpha") == 1


def test_promtool_accepts_the_whole_exposition(server):
    promtool = system_tools.require("promtool", "`promtool check metrics` on /metrics")
    text, _ = scrape(server)
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_accepts_the_alert_rules():
    promtool = system_tools.require("promtool", f"`promtool check rules {ALERTS.name}`")
    done = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_queen_metric_an_alert_uses_exists(server):
    """Without a YAML parser (none is a dependency): the rules' expressions name only series the
    server exposes, and each alert has its summary and description."""
    rules = ALERTS.read_text()
    text, _ = scrape(server)
    # A cluster node's own series come on top (this server runs alone): the cluster alerts use them.
    text += render_cluster({"node": "n1", "role": "leader", "epoch": 1, "degraded": False, "syncUnavailable": False,
                            "followers": []})
    exposed = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        exposed |= {name, *(name + suffix for suffix in ("_bucket", "_sum", "_count") if kind == "histogram")}
    used = set(re.findall(r"\b((?:queen|process)_[a-z0-9_]+)", rules))
    assert used and used - exposed == set(), f"alerts use series /metrics does not have: {sorted(used - exposed)}"
    alerts = rules.count("- alert:")
    assert alerts >= 9
    assert rules.count("summary:") == alerts and rules.count("description:") == alerts
