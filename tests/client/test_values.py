"""What the SDK sends as a value: bytes go as bytes and come back as bytes; a date or time is refused,
naming where it is, before anything is sent (it would arrive as a string without its type)."""

import datetime

import pytest

import queen_client
from queen_client import values


def test_bytes_are_sent_in_the_servers_lossless_form_and_read_back_as_bytes():
    body = values.encode({"value": b"\x89PNG\r\n\x1a\n", "items": [bytearray(b"ab"), memoryview(b"c")]})
    assert body == b'{"value":{"$bytes":"iVBORw0KGgo="},"items":[{"$bytes":"YWI="},{"$bytes":"Yw=="}]}'
    assert values.decode(body) == {"value": b"\x89PNG\r\n\x1a\n", "items": [b"ab", b"c"]}
    assert values.decode(b'{"value":{"$bytes":"YQ==","other":1}}') == {"value": {"$bytes": "YQ==", "other": 1}}


@pytest.mark.parametrize("when, suggested", [
    (datetime.datetime(2026, 1, 2, 3, 4, 5), "int(value.timestamp() * 1000)"),
    (datetime.datetime.now(datetime.UTC), "int(value.timestamp() * 1000)"),
    (datetime.date(2026, 1, 2), "as a string, e.g. value.isoformat() ('2026-12-01')"),
    (datetime.time(9, 30), "as a string, e.g. value.isoformat() ('09:30:00'), or as seconds since midnight"),
])
def test_a_date_or_time_is_refused_naming_where_it_is_and_what_to_send_for_its_type(when, suggested):
    with pytest.raises(TypeError) as caught:
        values.encode({"items": [{"queue": "q", "payload": {"order": 1, "due": [0, when]}}]})
    message = str(caught.value)
    assert message.startswith(f"body.items[0].payload.due[1]: a {type(when).__name__} has no JSON form"), message
    assert suggested in message, message
    if not isinstance(when, datetime.datetime):  # a date or a time has no .timestamp() to suggest
        assert "timestamp()" not in message, message


def test_a_str_holding_undecodable_bytes_is_refused_saying_so():
    text = b"caf\xe9".decode("utf-8", "surrogateescape")  # as sys.stdin reads latin-1 input in a UTF-8 locale
    with pytest.raises(TypeError) as caught:
        values.encode({"value": text})
    message = str(caught.value)
    assert message.startswith("body.value: the str is not text JSON can carry: it holds a lone surrogate"), message
    assert "index 3" in message and "send the bytes themselves" in message


def test_other_values_without_a_json_form_are_refused_naming_where_they_are():
    with pytest.raises(TypeError, match=r"^body\.value: keys must be strings, not int"):
        values.encode({"value": {1: "one"}})
    with pytest.raises(TypeError, match=r"^body\.value\[0\]: integers must be from -2\^63 to 2\^64-1"):
        values.encode({"value": [1 << 64]})
    with pytest.raises(TypeError, match=r"^body\.value: a value of type object has no JSON form"):
        values.encode({"value": object()})


def test_bytes_round_trip_through_the_server_in_kv_and_queues(server, unique):
    with queen_client.SyncClient(server.url) as client:
        logo = b"\x89PNG\r\n\x1a\n\x00\xff"
        assert client.kv.put(unique, "logo", logo, forever=True).applied
        assert client.kv.get(unique, "logo").value == logo
        queue = client.queue(unique)
        queue.push({"name": "logo.png", "data": logo})
        queue.push(logo)
        delivery = queue.pop(batch=2, auto_ack=True)
        assert [message.data for message in delivery.messages] == [{"name": "logo.png", "data": logo}, logo]


def test_a_date_in_a_call_is_refused_before_anything_is_sent(server, unique):
    with queen_client.SyncClient(server.url) as client:
        before = client.statistics()["requests"]
        with pytest.raises(TypeError, match=r"body\.items\[0\]\.payload\.at: a datetime has no JSON form"):
            client.queue(unique).push({"at": datetime.datetime(2026, 1, 2)})
        with pytest.raises(TypeError, match=r"body\.operations\[0\]\.value: a date has no JSON form"):
            client.kv.put(unique, "day", datetime.date(2026, 1, 2), forever=True)
        assert client.statistics()["requests"] == before
        assert not client.kv.get(unique, "day").found
