"""Names, every kind alike, over HTTP: the characters no name may hold are refused with the code
that name's other mistakes get (queen/core/names.py), and names are their exact bytes, never
Unicode-normalised: "é" composed (NFC) and decomposed (NFD) are two names."""

import unicodedata
from urllib.parse import quote

import pytest

from queen.testing import HttpClient, open_server

REFUSED = {"NUL": "\x00", "CR": "\r", "LF": "\n", "NEL": "\u0085", "RLO": "\u202e", "DEL": "\x7f",
           "LRI": "\u2066"}
NFC = unicodedata.normalize("NFC", "caf\u00e9")
NFD = unicodedata.normalize("NFD", NFC)


def kv(**fields):
    return "POST", "/api/v1/kv", {"operations": [{"op": "put", "ns": "app", "key": "k", "value": 1, "forever": True,
                                                  **fields}]}


def push(**fields):
    return "POST", "/api/v1/push", {"items": [{"queue": "q", "payload": 1, **fields}]}


def acquire(**fields):
    return "POST", "/api/v1/locks", {"operations": [{"op": "acquire", "name": "l", "ttlSeconds": 5, **fields}]}


def schedule(**fields):
    return "POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": "q", "key": "t", "delayMs": 1000,
                                                      "payload": 1, **fields}]}


# name field -> (request holding the name, code)
FIELDS = {
    "kv ns": (lambda name: kv(ns=name), "invalid_ns"),
    "kv key": (lambda name: kv(key=name), "invalid_key"),
    "kv key in the path": (lambda name: ("PUT", "/api/v1/kv/app/" + quote(name, safe=""),
                                         {"value": 1, "forever": True}), "invalid_key"),
    "kv ns in the path": (lambda name: ("GET", "/api/v1/kv/" + quote(name, safe="") + "/k", None), "invalid_ns"),
    "kv getMany key": (lambda name: ("POST", "/api/v1/kv", {"operations": [
        {"op": "getMany", "ns": "app", "keys": ["a", name]}]}), "invalid_key"),
    "queue": (lambda name: push(queue=name), "invalid_queue"),
    "queue in the path": (lambda name: ("GET", "/api/v1/pop/queue/" + quote(name, safe=""), None), "invalid_queue"),
    "partition": (lambda name: push(partition=name), "invalid_partition"),
    "consumer group": (lambda name: ("GET", "/api/v1/pop/queue/q?consumerGroup=" + quote(name, safe=""), None),
                       "invalid_consumer_group"),
    "transactionId": (lambda name: push(transactionId=name), "invalid_transaction_id"),
    "lock name": (lambda name: acquire(name=name), "invalid_name"),
    "lock owner": (lambda name: acquire(owner=name), "invalid_owner"),
    "timer key": (lambda name: schedule(key=name), "invalid_key"),
    "timer key in the path": (lambda name: ("GET", "/api/v1/timers/q/" + quote(name, safe=""), None), "invalid_key"),
    "timer queue": (lambda name: schedule(queue=name), "invalid_queue"),
}


@pytest.mark.parametrize("field", list(FIELDS))
async def test_every_name_refuses_control_and_bidi_override_characters_alike(field, tmp_path, autojump_clock):
    build, code = FIELDS[field]
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)
        details = []
        for what, character in REFUSED.items():
            for name in (character, f"a{character}", f"a{character}b"):
                status, body = await client.request(*build(name))
                assert status == 400 and body["code"] == code, (field, what, status, body)
                details.append((body["details"].get("character"), f"U+{ord(character):04X}"))
        assert all(got == expected for got, expected in details), details  # which character it was
        for fine in ("plain", NFC, NFD, "a b", "\u00a0", "\u200e", "\U0001f451"):  # NBSP, LRM and 👑 are names
            status, body = await client.request(*build(fine))
            assert status == 200 or body["code"] != code, (field, fine, body)
        # Nothing refused was stored: the namespace holds only what the fine names wrote.
        status, page = await client.request("POST", "/api/v1/kv", {"operations": [{"op": "getPrefix", "ns": "app"}]})
        assert all(ch not in item["key"] for item in page["results"][0]["items"] for ch in REFUSED.values())


async def test_nfc_and_nfd_spellings_are_two_names_everywhere(tmp_path, autojump_clock):
    assert NFC != NFD and NFC.encode() != NFD.encode()
    async with open_server(tmp_path / "d") as server:
        client = HttpClient(server.port)

        async def ok(method, path, body=None):
            status, answer = await client.request(method, path, body)
            assert status == 200, answer
            return answer

        # KV: two namespaces and two keys.
        for value, spelling in enumerate((NFC, NFD)):
            await ok("PUT", f"/api/v1/kv/{quote(spelling)}/{quote(spelling)}", {"value": value, "forever": True})
        for value, spelling in enumerate((NFC, NFD)):
            got = await ok("GET", f"/api/v1/kv/{quote(spelling)}/{quote(spelling)}")
            assert got["value"] == value, (spelling, got)
        await ok("PUT", f"/api/v1/kv/app/{quote(NFC)}", {"value": "composed", "forever": True})
        assert (await ok("GET", f"/api/v1/kv/app/{quote(NFD)}"))["found"] is False

        # Queues, partitions and producer ids: two of each.
        pushed = await ok("POST", "/api/v1/push", {"items": [
            {"queue": spelling, "partition": part, "payload": 1, "transactionId": tid}
            for spelling in (NFC, NFD) for part in (NFC, NFD) for tid in (NFC, NFD)]})
        assert [item["status"] for item in pushed] == ["queued"] * 8, pushed
        queues = await ok("GET", "/api/v1/resources/queues")
        assert sorted(item["queue"] for item in queues["items"]) == sorted([NFC, NFD])
        for spelling in (NFC, NFD):
            partitions = await ok("GET", f"/api/v1/resources/queues/{quote(spelling)}/partitions")
            assert len(partitions["items"]) == 2, partitions

        # Consumer groups: each reads the same first message for itself.
        for group in (NFC, NFD):
            popped = await ok("GET", f"/api/v1/pop/queue/{quote(NFC)}/partition/{quote(NFC)}?consumerGroup={quote(group)}")
            assert popped["success"] is True and popped["messages"][0]["offset"] == 0, popped

        # Locks: two names, and an owner spelt the other way is somebody else.
        for spelling in (NFC, NFD):
            [got] = (await ok("POST", "/api/v1/locks", {"operations": [
                {"op": "acquire", "name": spelling, "ttlSeconds": 60, "owner": NFC}]}))["results"]
            assert got["acquired"] is True and "already" not in got, got
        [again] = (await ok("POST", "/api/v1/locks", {"operations": [
            {"op": "acquire", "name": NFC, "ttlSeconds": 60, "owner": NFD}]}))["results"]
        assert again["acquired"] is False and again["reason"] == "held", again

        # Timers: two keys.
        scheduled = await ok("POST", "/api/v1/timers", {"operations": [
            {"op": "schedule", "queue": "t", "key": spelling, "delayMs": 60_000, "payload": 1} for spelling in (NFC, NFD)]})
        assert [result["replaced"] for result in scheduled["results"]] == [False, False], scheduled
        timers = await ok("GET", "/api/v1/timers?queue=t")
        assert sorted(item["key"] for item in timers["items"]) == sorted([NFC, NFD])
