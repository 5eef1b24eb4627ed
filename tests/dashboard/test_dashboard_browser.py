"""The dashboard in a real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright),
against a real `queen serve --auth-file`: a reader sees a lock another client holds and may not
release it; an admin releases it and the holder's next renew finds it lost; an admin requeues a
dead letter from the page and it can be popped again; the Server page shows version and uptime.

Screenshots go to $QUEEN_SCREENSHOTS, or the test's tmp_path; the browser is conftest.py's. Every
wait is one of Playwright's auto-waiting expectations: no fixed sleeps.
"""

from __future__ import annotations

import os
import re

from queen.auth import AuthFile
from queen.testing import ServerProcess


def _ok(answer):
    status, body = answer
    assert status == 200, answer
    return body


def test_dashboard_locks_dlq_and_server_in_chromium(tmp_path, browser_page, shots):
    from playwright.sync_api import expect

    auth_path = str(tmp_path / "auth.json")
    auth = AuthFile.load(auth_path, missing_ok=True)
    secrets = {"reader": auth.add("dash-reader", "reader", "default"),
               "admin": auth.add("dash-admin", "admin", "default"),
               "holder": auth.add("worker", "writer", "default"),
               "operator": auth.add("ops", "admin", "*")}
    auth.save()
    server = ServerProcess(str(tmp_path / "data"), "--auth-file", auth_path).start()
    try:
        def call(who, method, path, body=None):
            return server.request(method, path, body, headers={"authorization": f"Bearer {secrets[who]}"})

        # 1. Another client, "worker-7", holds a lock and renews it; each renew hands it a new token.
        [held] = _ok(call("holder", "POST", "/api/v1/locks", {"operations": [
            {"op": "acquire", "name": "jobs/nightly", "owner": "worker-7", "ttlSeconds": 600}]}))["results"]
        assert held["acquired"] is True, held
        holder = {"slot": held["slot"], "token": held["token"]}

        def renew_as_holder() -> dict:
            [result] = _ok(call("holder", "POST", "/api/v1/locks", {"operations": [
                {"op": "renew", "name": "jobs/nightly", "slot": holder["slot"], "token": holder["token"],
                 "owner": "worker-7", "ttlSeconds": 600}]}))["results"]
            if result["renewed"]:
                holder["token"] = result["token"]
            return result

        assert renew_as_holder()["renewed"] is True

        page = browser_page
        errors, foreign = [], []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("request", lambda request: None if request.url.startswith(server.url) else foreign.append(request.url))

        # 2. The reader signs in and sees the lock, its holder and expiry.
        page.goto(server.url + "/")
        expect(page.locator("#sign-in")).to_be_visible()
        page.fill("#token", secrets["reader"])
        page.click("#sign-in button[type=submit]")
        expect(page.locator("#who")).to_have_text("dash-reader · reader · tenant default")
        page.click("#tabs >> text=Locks")
        row = page.locator("#locks-rows tr", has_text="jobs/nightly")
        expect(row).to_be_visible()
        expect(row.locator("td").nth(2)).to_have_text("worker-7")
        expect(row.locator("td").nth(5)).to_contain_text("in ")  # expires in about 600 s
        expect(row.locator("td").nth(5)).to_contain_text(" UTC")
        expect(row.locator("td").nth(6)).to_have_text(str(holder["token"]))
        page.screenshot(path=os.path.join(shots, "1-locks-reader.png"), full_page=True)
        # A reader may look but not release: the API's refusal is shown as it said it.
        row.get_by_role("button", name="Release").click()
        expect(page.locator("#notice")).to_have_text(
            "Forbidden (403): a reader token may not do this; it needs write rights")
        expect(row).to_be_visible()
        assert renew_as_holder()["renewed"] is True

        # 3. The admin releases it; it leaves the list and the holder's next renew finds it lost.
        page.click("#sign-out")
        expect(page.locator("#sign-in")).to_be_visible()
        page.fill("#token", secrets["admin"])
        page.click("#sign-in button[type=submit]")
        expect(page.locator("#who")).to_have_text("dash-admin · admin · tenant default")
        page.click("#tabs >> text=Locks")
        row = page.locator("#locks-rows tr", has_text="jobs/nightly")
        expect(row.locator("td").nth(6)).to_have_text(str(holder["token"]))  # the renewed token
        row.get_by_role("button", name="Release").click()
        expect(page.locator("#notice")).to_have_text(
            f"Released jobs/nightly (slot {holder['slot']}, token {holder['token']}).")
        expect(row).to_have_count(0)
        expect(page.locator("#locks-empty")).to_be_visible()
        page.screenshot(path=os.path.join(shots, "2-locks-released.png"), full_page=True)
        lost = renew_as_holder()
        assert lost["renewed"] is False and lost["reason"] == "lost", lost
        assert _ok(call("admin", "GET", "/api/v1/locks?prefix=jobs/"))["items"] == []

        # 4. A dead letter, requeued from the page, can be popped again.
        _ok(call("admin", "POST", "/api/v1/push", {"items": [{"queue": "orders", "payload": {"order": 42}}]}))
        [message] = _ok(call("admin", "GET", "/api/v1/pop/queue/orders?batch=1"))["messages"]
        moved = _ok(call("admin", "POST", "/api/v1/ack", {"partitionId": message["partitionId"], "leaseId":
                                                          message["leaseId"], "offset": message["offset"],
                                                          "status": "dlq"}))
        assert moved["dlq"] is True, moved
        assert _ok(call("admin", "GET", "/api/v1/dlq?queue=orders"))["total"] == 1
        page.click("#tabs >> text=Queues")
        queue_row = page.locator("#queues-rows tr", has_text="orders")
        expect(queue_row.locator("td").nth(5)).to_have_text("1")  # its DLQ count
        page.screenshot(path=os.path.join(shots, "3-queues.png"), full_page=True)
        queue_row.get_by_role("link", name="orders").click()
        expect(page.locator("#queue-title")).to_have_text("Queue orders")
        dead = page.locator("#dlq-rows tr")
        expect(dead).to_have_count(1)
        expect(dead.locator("td").nth(6)).to_have_text('{"order":42}')
        page.screenshot(path=os.path.join(shots, "4-queue-dlq.png"), full_page=True)
        dead.get_by_role("button", name="Requeue").click()
        expect(page.locator("#notice")).to_have_text(
            f"Requeued orders partition {message['partition']} offset {message['offset']}.")
        expect(page.locator("#dlq-empty")).to_be_visible()
        page.screenshot(path=os.path.join(shots, "5-queue-requeued.png"), full_page=True)
        assert _ok(call("admin", "GET", "/api/v1/dlq?queue=orders"))["total"] == 0
        [again] = _ok(call("admin", "GET", "/api/v1/pop/queue/orders?batch=1"))["messages"]
        assert (again["offset"], again["data"]) == (message["offset"], {"order": 42}), again

        # The KV browser pages through a namespace by prefix; a value's markup is shown as text.
        for i in range(25):
            value = "<b>Ada</b>" if i == 0 else {"n": i}
            _ok(call("admin", "PUT", f"/api/v1/kv/app/user%2F{i:02d}", {"value": value, "forever": True}))
        _ok(call("admin", "PUT", "/api/v1/kv/app/config", {"value": 1, "ttlSeconds": 3600}))
        page.click("#tabs >> text=KV")
        page.fill("form[data-form=kv] input[name=ns]", "app")
        page.fill("form[data-form=kv] input[name=prefix]", "user/")
        page.select_option("form[data-form=kv] select[name=limit]", "20")
        page.click("form[data-form=kv] button[type=submit]")
        kv_rows = page.locator("#kv-rows tr")
        expect(kv_rows).to_have_count(20)
        expect(kv_rows.first.locator("td").nth(0)).to_have_text("user/00")
        expect(kv_rows.first.locator("td").nth(1)).to_have_text('"<b>Ada</b>"')
        expect(page.locator("#kv-rows b")).to_have_count(0)
        page.screenshot(path=os.path.join(shots, "6-kv.png"), full_page=True)
        page.click("#kv-next")
        expect(kv_rows).to_have_count(5)
        expect(kv_rows.last.locator("td").nth(0)).to_have_text("user/24")

        # The Timers page: which queues hold timers and when the next is due, then one queue's list.
        _ok(call("admin", "POST", "/api/v1/timers", {"operations": [
            {"op": "schedule", "queue": "orders", "key": "reminder/1", "delayMs": 3_600_000, "payload": {"r": 1}}]}))
        page.click("#tabs >> text=Timers")
        timer_queue = page.locator("#timer-queues-rows tr", has_text="orders")
        expect(timer_queue.locator("td").nth(1)).to_have_text("1")
        expect(timer_queue.locator("td").nth(2)).to_contain_text("in 59 min")
        page.fill("form[data-form=timers] input[name=queue]", "orders")
        page.fill("form[data-form=timers] input[name=prefix]", "reminder/")
        page.click("form[data-form=timers] button[type=submit]")
        expect(page.locator("#timers-rows tr")).to_have_count(1)
        expect(page.locator("#timers-rows tr td").nth(0)).to_have_text("reminder/1")
        page.screenshot(path=os.path.join(shots, "7-timers.png"), full_page=True)

        # 5. The Server page: version and uptime for a tenant's admin, the rest for the operator.
        page.click("#tabs >> text=Server")
        facts = page.locator("#server-facts")
        expect(facts.locator("dt", has_text="Version")).to_be_visible()
        expect(facts.locator("dd").nth(0)).to_have_text(_ok(call("admin", "GET", "/api/v1/server"))["version"])
        expect(facts.locator("dd").nth(1)).to_have_text(_UPTIME)
        expect(page.locator("#server-operator-only")).to_be_visible()
        page.click("#sign-out")
        page.fill("#token", secrets["operator"])
        page.click("#sign-in button[type=submit]")
        expect(page.locator("#who")).to_have_text("ops · admin · tenant *")
        page.click("#tabs >> text=Server")
        expect(facts.locator("dt", has_text="Fsync latency")).to_be_visible()
        expect(facts.locator("dd").nth(3)).to_have_text(os.path.abspath(str(tmp_path / "data")))
        expect(page.locator("#server-operator-only")).to_be_hidden()
        page.screenshot(path=os.path.join(shots, "8-server-operator.png"), full_page=True)

        assert errors == [], f"the page's script failed: {errors}"
        assert foreign == [], f"the page fetched something from elsewhere: {foreign}"
    finally:
        server.stop()


# "12 s", "3 min 4 s", "1 h 2 min": the page's uptime, however long the machine took.
_UPTIME = re.compile(r"^\d+ s$|^\d+ min \d+ s$|^\d+ h \d+ min$|^\d+ d \d+ h \d+ min$")
