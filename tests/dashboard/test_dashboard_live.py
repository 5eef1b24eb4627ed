"""The dashboard as a live monitor, in a real headless Chromium (conftest.py's): against a real
`queen serve`, the page follows the server's state without a reload (counts, push/pop/ack rates,
in-flight messages and consumers per group: a live lease, a parked pop), shows the node's role
"single" and its epoch, and says so when the server stops answering; the operator's tenant
selector shows one tenant's queues and locks at a time, read-only; and against a stub serving a
canned /api/v1/cluster (a degraded cluster is heavy to start), a warning banner comes and goes with
`degraded`, `syncUnavailable` and `serving`.

Every wait is one of Playwright's auto-waiting expectations (polling the page until a deadline);
the page refreshes itself every 3 s, so each wait spans a refresh or two.
"""

from __future__ import annotations

import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files

from queen.auth import AuthFile
from queen.testing import ServerProcess

# A rate the page shows as a number above zero ("0.7", "2", "0.33"), not "0" or "—".
NONZERO = re.compile(r"^(?!0$)(?!0\.0+$)\d+(\.\d+)?$")
RATE = re.compile(r"^\d+(\.\d+)?$")


def _ok(answer):
    status, body = answer
    assert status == 200, answer
    return body


def _watch(page, server_url: str) -> tuple[list, list]:
    """The page's script errors, and any request it makes somewhere other than the server."""
    errors, foreign = [], []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("request", lambda request: None if request.url.startswith(server_url) else foreign.append(request.url))
    return errors, foreign


def test_the_page_follows_the_server_rates_in_flight_consumers_and_the_node_without_a_reload(
        tmp_path, browser_page, shots):
    from playwright.sync_api import expect

    server = ServerProcess(str(tmp_path / "data")).start()  # no auth file: the caller is the operator
    parked: list = []
    waiter = threading.Thread(target=lambda: parked.append(server.request(
        "GET", "/api/v1/pop/queue/idle?consumerGroup=watchers&waitMs=60000", timeout_s=90)))
    try:
        _ok(server.request("POST", "/api/v1/push", {"items": [{"queue": "orders", "payload": {"n": 0}}]}))
        page = browser_page
        errors, foreign = _watch(page, server.url)
        page.goto(server.url + "/#/queues")
        expect(page.locator("#node")).to_have_text("single · epoch 0")
        expect(page.locator("#live")).to_contain_text("Live: updated ")
        expect(page.locator("#live")).to_contain_text("every 3 s")
        orders = page.locator('#queues-rows tr[data-queue="orders"]')
        expect(orders.locator("td[data-field=depth]")).to_have_text("1")
        page.evaluate("window.stillTheSamePage = true")  # gone if anything reloads the page

        # 1. Pushes: the depth follows, and the push rate shows them.
        _ok(server.request("POST", "/api/v1/push", {"items": [{"queue": "orders", "payload": {"n": n}}
                                                              for n in range(1, 6)]}))
        expect(orders.locator("td[data-field=depth]")).to_have_text("6")
        expect(orders.locator("td[data-field=pushRate]")).to_have_text(NONZERO)

        # 2. A consumer pops two under a lease: in flight, one consumer, a pop rate. Another waits
        # on an empty queue (a parked pop): a consumer too.
        got = _ok(server.request("GET", "/api/v1/pop/queue/orders?batch=2"))
        assert len(got["messages"]) == 2, got
        waiter.start()
        expect(orders.locator("td[data-field=inFlight]")).to_have_text("2")
        expect(orders.locator("td[data-field=consumers]")).to_have_text("1")
        expect(orders.locator("td[data-field=popRate]")).to_have_text(NONZERO)
        idle = page.locator('#queues-rows tr[data-queue="idle"]')
        expect(idle.locator("td[data-field=consumers]")).to_have_text("1")
        expect(orders.locator("td[data-field=pushRate]")).to_have_text("0")  # no push in the last interval
        page.screenshot(path=os.path.join(shots, "live-1-queues.png"), full_page=True)

        # 3. The queue's page: the group's in flight and consumers, then the acks, without a reload.
        orders.get_by_role("link", name="orders").click()
        expect(page.locator("#queue-title")).to_have_text("Queue orders")
        group = page.locator('#groups-rows tr[data-group="__QUEUE_MODE__"]')
        expect(group.locator("td[data-field=inFlight]")).to_have_text("2")
        expect(group.locator("td[data-field=consumers]")).to_have_text("1")
        expect(group.locator("td[data-field=leases]")).to_have_text("1")
        expect(group.locator("td[data-field=parkedPops]")).to_have_text("0")
        page.screenshot(path=os.path.join(shots, "live-2-queue.png"), full_page=True)
        for message in got["messages"]:
            _ok(server.request("POST", "/api/v1/ack", {"partitionId": message["partitionId"],
                                                       "leaseId": message["leaseId"], "offset": message["offset"]}))
        expect(group.locator("td[data-field=inFlight]")).to_have_text("0")
        expect(group.locator("td[data-field=consumers]")).to_have_text("0")
        expect(page.locator("#queue-facts dd[data-field=ackRate]")).to_have_text(NONZERO)
        expect(page.locator("#queue-facts dd[data-field=depth]")).to_have_text("4")

        # 4. The Server page: the node's role and epoch, and the request rates (the operator's).
        page.click("#tabs >> text=Server")
        node = page.locator("#node-facts")
        expect(node.locator("dd[data-field=role]")).to_have_text("single")
        expect(node.locator("dd[data-field=epoch]")).to_have_text("0")
        expect(node.locator("dd[data-field=serving]")).to_have_text("yes")
        expect(node.locator("dd[data-field=degraded]")).to_have_text("no")
        expect(page.locator("#rate-facts dd[data-field=requestRate]")).to_have_text(NONZERO)  # the page's own
        expect(page.locator("#rate-facts dd[data-field=serverErrorRate]")).to_have_text(RATE)
        expect(page.locator("#cluster-banner")).to_be_hidden()
        page.screenshot(path=os.path.join(shots, "live-3-server.png"), full_page=True)
        assert page.evaluate("window.stillTheSamePage") is True

        # 5. The parked consumer gets a message; then the server goes away and the page says so.
        _ok(server.request("POST", "/api/v1/push", {"items": [{"queue": "idle", "payload": "wake"}]}))
        waiter.join(timeout=30)
        assert parked and parked[0][0] == 200 and parked[0][1]["messages"][0]["data"] == "wake", parked
        server.stop()
        expect(page.locator("#live")).to_contain_text("Server unreachable")
        expect(page.locator("#live")).to_have_class(re.compile(r"\bstale\b"))
        expect(page.locator("#live")).to_contain_text("showing data from ")
        page.screenshot(path=os.path.join(shots, "live-4-unreachable.png"), full_page=True)
        assert errors == [], f"the page's script failed: {errors}"
        assert foreign == [], f"the page fetched something from elsewhere: {foreign}"
    finally:
        server.stop()
        if waiter.is_alive():
            waiter.join(timeout=30)


def test_the_operator_picks_a_tenant_and_sees_only_its_queues_and_locks(tmp_path, browser_page, shots):
    from playwright.sync_api import expect

    auth_path = str(tmp_path / "auth.json")
    auth = AuthFile.load(auth_path, missing_ok=True)
    secrets = {"operator": auth.add("ops", "admin", "*"), "acme": auth.add("acme-worker", "writer", "acme"),
               "beta": auth.add("beta-worker", "writer", "beta")}
    auth.save()
    server = ServerProcess(str(tmp_path / "data"), "--auth-file", auth_path).start()
    try:
        def call(who, method, path, body=None):
            return _ok(server.request(method, path, body, headers={"authorization": f"Bearer {secrets[who]}"}))

        call("operator", "POST", "/api/v1/push", {"items": [{"queue": "house-queue", "payload": 1}]})
        call("acme", "POST", "/api/v1/push", {"items": [{"queue": "acme-orders", "payload": n} for n in range(2)]})
        call("acme", "POST", "/api/v1/locks", {"operations": [{"op": "acquire", "name": "acme-lock", "owner": "a1",
                                                               "ttlSeconds": 600}]})
        call("beta", "POST", "/api/v1/push", {"items": [{"queue": "beta-jobs", "payload": n} for n in range(3)]})

        page = browser_page
        errors, foreign = _watch(page, server.url)
        page.goto(server.url + "/")
        page.fill("#token", secrets["operator"])
        page.click("#sign-in button[type=submit]")
        expect(page.locator("#who")).to_have_text("ops · admin · tenant *")
        page.click("#tabs >> text=Queues")
        rows = page.locator("#queues-rows tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-queue", "house-queue")  # its own names: the default tenant's
        select = page.locator("#tenant-select")
        expect(select).to_be_visible()
        expect(select.locator("option")).to_have_text(["default", "acme", "beta"])
        expect(page.locator("#viewing")).to_be_hidden()

        # acme: its queue alone, and it stays live (a push shows up without a reload).
        select.select_option("acme")
        expect(page.locator("#viewing")).to_have_text("Reading tenant acme as the operator: read-only")
        expect(rows).to_have_count(1)
        acme = page.locator('#queues-rows tr[data-queue="acme-orders"]')
        expect(acme.locator("td[data-field=depth]")).to_have_text("2")
        call("acme", "POST", "/api/v1/push", {"items": [{"queue": "acme-orders", "payload": 2}]})
        expect(acme.locator("td[data-field=depth]")).to_have_text("3")
        page.screenshot(path=os.path.join(shots, "tenant-1-acme-queues.png"), full_page=True)
        acme.get_by_role("link", name="acme-orders").click()
        expect(page.locator("#queue-facts dd[data-field=depth]")).to_have_text("3")
        # Its locks, with nothing to click: the operator reads another tenant's data, never writes it.
        page.click("#tabs >> text=Locks")
        lock = page.locator("#locks-rows tr", has_text="acme-lock")
        expect(lock.locator("td").nth(2)).to_have_text("a1")
        expect(page.locator("#locks-rows button")).to_have_count(0)
        page.screenshot(path=os.path.join(shots, "tenant-2-acme-locks.png"), full_page=True)

        # beta, then back to the operator's own names.
        page.click("#tabs >> text=Queues")
        select.select_option("beta")
        expect(rows).to_have_count(1)
        expect(page.locator('#queues-rows tr[data-queue="beta-jobs"] td[data-field=depth]')).to_have_text("3")
        page.click("#tabs >> text=Locks")
        expect(page.locator("#locks-empty")).to_be_visible()
        page.click("#tabs >> text=Queues")
        select.select_option("")
        expect(page.locator("#viewing")).to_be_hidden()
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-queue", "house-queue")

        # A tenant's own token has no selector: it sees its own names, as with curl.
        page.click("#sign-out")
        page.fill("#token", secrets["acme"])
        page.click("#sign-in button[type=submit]")
        expect(page.locator("#who")).to_have_text("acme-worker · writer · tenant acme")
        page.click("#tabs >> text=Queues")
        expect(page.locator('#queues-rows tr[data-queue="acme-orders"]')).to_be_visible()
        expect(page.locator("#tenant-picker")).to_be_hidden()
        expect(page.locator("#viewing")).to_be_hidden()
        page.click("#tabs >> text=Locks")  # its own locks: the actions are there
        lock = page.locator("#locks-rows tr", has_text="acme-lock")
        expect(lock.get_by_role("button", name="Release")).to_be_visible()
        assert errors == [], f"the page's script failed: {errors}"
        assert foreign == [], f"the page fetched something from elsewhere: {foreign}"
    finally:
        server.stop()


class _StubNode(BaseHTTPRequestHandler):
    """The dashboard's files and a canned node: what /api/v1/cluster says is the server's
    `cluster` attribute, changed by the test while the page runs."""

    def do_GET(self):  # noqa: N802 - the name http.server calls
        path = self.path.partition("?")[0]
        folder = files("queen") / "dashboard"
        if path == "/" or path.startswith("/dashboard/"):
            name = "index.html" if path == "/" else path.rsplit("/", 1)[1]
            kind = {"html": "text/html", "js": "text/javascript", "css": "text/css"}[name.rsplit(".", 1)[1]]
            return self._send(200, (folder / name).read_bytes(), kind)
        answers = {"/api/v1/tenant": {"token": "-", "role": "admin", "tokenTenant": "*", "tenant": "default"},
                   "/api/v1/tenants": {"items": [{"tenant": "default"}]},
                   "/api/v1/cluster": self.server.cluster,
                   "/api/v1/server": {"version": "0.0.0", "startedAt": 1_700_000_000_000, "uptimeSeconds": 60},
                   "/api/v1/locks": {"items": [], "cursor": None}}
        if path not in answers:
            return self._send(404, json.dumps({"code": "not_found", "detail": f"no route {path}"}).encode())
        return self._send(200, json.dumps(answers[path]).encode())

    def _send(self, status: int, body: bytes, kind: str = "application/json"):
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _cluster(**changes) -> dict:
    healthy = {"cluster": "prod", "node": "n1", "role": "leader", "epoch": 7, "serving": True,
               "leader": {"node": "n1", "advertise": "http://n1:6632", "epoch": 7}, "sync": ["n2"],
               "degraded": False, "syncUnavailable": False, "lastVersion": 42,
               "followers": [{"node": "n2", "connected": False, "ackedVersion": 40, "lagVersions": 2}]}
    return {**healthy, **changes}


def test_a_degraded_cluster_shows_a_warning_banner_that_goes_when_it_is_healthy(browser_page, shots):
    from playwright.sync_api import expect

    stub = ThreadingHTTPServer(("127.0.0.1", 0), _StubNode)
    stub.cluster = _cluster(degraded=True, syncUnavailable=True)
    thread = threading.Thread(target=stub.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{stub.server_address[1]}"
    try:
        page = browser_page
        errors, _ = _watch(page, url)
        page.goto(url + "/#/server")
        banner = page.locator("#cluster-banner")
        expect(banner).to_be_visible()
        expect(banner).to_contain_text("Degraded: the sync set is not full (n2)")
        expect(banner).to_contain_text("Sync set unavailable")
        expect(page.locator("#node")).to_have_text("leader · epoch 7")
        expect(page.locator("#node-facts dd[data-field=syncUnavailable]")).to_have_text("yes")
        page.screenshot(path=os.path.join(shots, "cluster-1-degraded.png"), full_page=True)

        stub.cluster = _cluster()  # the follower caught up: the banner goes at the next refresh
        expect(banner).to_be_hidden()
        expect(page.locator("#node-facts dd[data-field=degraded]")).to_have_text("no")

        stub.cluster = _cluster(role="follower", serving=False, epoch=8,
                                leader={"node": "n2", "advertise": "http://n2:6632", "epoch": 8})
        expect(banner).to_contain_text("This node is follower and does not serve data. The leader is n2 at "
                                       "http://n2:6632")
        expect(page.locator("#node")).to_have_text("follower · epoch 8")
        assert errors == [], f"the page's script failed: {errors}"
    finally:
        stub.shutdown()
        stub.server_close()
        thread.join(timeout=10)
