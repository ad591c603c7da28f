"""Messages and rollout states of any shape: every wrong type, depth, size or number is one Malformed, never an
exception of another kind (telemetry/shapes.py, events.parse, ledger.State.from_json, Ledger.read)."""

from __future__ import annotations

import copy
import io
import json
import logging
from typing import Any

import pytest

from modelsync.events import MAX_BODY, EventFilter, MalformedMessage, ObjectEvent, Pending, QueuePoller, parse
from modelsync.ledger import MAX_STATE, Artifact, Ledger, LedgerError, Participant, Rollout, State
from telemetry.shapes import MAX_DEPTH, Doc, Malformed, integer, loads, number
from tests.support.helpers import Capture

# --- helpers ------------------------------------------------------------------------------------------------


def record(**s3: Any) -> dict[str, Any]:
    """A well-formed S3 ObjectCreated record; ``s3`` replaces parts of its ``s3`` member."""
    body: dict[str, Any] = {
        "bucket": {"name": "b"},
        "object": {"key": "m.zip", "sequencer": "0A", "versionId": "v1"},
    }
    body.update(s3)
    return {"eventSource": "aws:s3", "eventName": "ObjectCreated:Put", "eventTime": "t", "s3": body}


def notification(*records: Any) -> dict[str, Any]:
    return {"Records": list(records)}


def with_object(**obj: Any) -> dict[str, Any]:
    base = {"key": "m.zip", "sequencer": "0A"}
    base.update(obj)
    return notification(record(object=base))


def sns(message: str) -> str:
    return json.dumps({"Type": "Notification", "MessageId": "1", "Message": message})


def malformed(body: str | bytes) -> Malformed:
    with pytest.raises(MalformedMessage) as info:
        parse(body)
    assert isinstance(info.value, Malformed) and len(str(info.value)) < 250
    return info.value


# --- the JSON itself ------------------------------------------------------------------------------------------


def test_numbers_must_be_finite_and_strings_unicode() -> None:
    for doc in ('{"a": 1e999}', '{"a": -1e999}', '{"a": NaN}', '{"a": Infinity}', "[-Infinity]"):
        with pytest.raises(Malformed, match=r"out of range|not a number JSON allows"):
            loads(doc, 1000)
    with pytest.raises(Malformed, match="not valid Unicode"):
        loads('{"k": "\\udc80"}', 1000)  # an escape UTF-8 cannot encode
    with pytest.raises(Malformed, match="not valid Unicode"):
        loads('{"\\ud800": 1}', 1000)  # in a key too
    with pytest.raises(Malformed, match="not UTF-8"):
        loads(b'{"k": "\xff\xfe"}', 1000)
    with pytest.raises(Malformed, match="not JSON"):
        loads("1" * 5000, 10_000)  # more digits than Python turns into an int
    assert loads('{"a": [1, 2.5, "\\u00e9"]}', 1000) == {"a": [1, 2.5, "é"]}


def test_depth_and_size_are_bounded() -> None:
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    loads(ok, 1000)
    with pytest.raises(Malformed, match=f"nested deeper than {MAX_DEPTH}"):
        loads("[" + ok + "]", 1000)
    with pytest.raises(Malformed, match="nested deeper"):  # json.loads itself runs out of stack here
        loads("[" * 130_000 + "]" * 130_000, 300_000)
    with pytest.raises(Malformed, match="nested deeper"):  # objects nest too
        loads('{"a":' * 100 + "1" + "}" * 100, 10_000)
    with pytest.raises(Malformed, match="larger than 10 bytes"):
        loads('"' + "x" * 10 + '"', 10)
    with pytest.raises(Malformed, match="larger than 10 bytes"):
        loads('"ééééé"', 10)  # 12 bytes of UTF-8 in 7 characters


def test_typed_access_names_the_field() -> None:
    doc = Doc({"a": {"b": "x", "n": 3.0, "t": True}}, "top")
    inner = doc.doc("a")
    with pytest.raises(Malformed, match=r"^top\.a\.b: a string, not a number$"):
        inner.number("b", 0, 1)
    with pytest.raises(Malformed, match=r"^top\.a\.missing: missing$"):
        inner.text("missing")
    with pytest.raises(Malformed, match=r"top\.a\.t: a boolean, not a whole number"):
        inner.integer("t", 0, 10)
    assert inner.integer("n", 0, 10) == 3 and inner.text("missing", default="d") == "d"
    with pytest.raises(Malformed, match="out of range"):
        integer(10**400, "x", 0, 10)
    with pytest.raises(Malformed, match="out of range"):
        number(10**400, "x", 0, 1e20)  # an int float() cannot hold: refused, not OverflowError
    with pytest.raises(Malformed, match="a list, not an object"):
        Doc([], "p")


# --- SQS messages ------------------------------------------------------------------------------------------


def test_good_messages_still_parse() -> None:
    (ev,) = parse(json.dumps(notification(record())))
    assert ev == ObjectEvent("b", "m.zip", False, "0A", "t", "v1")
    assert parse(sns(json.dumps(notification(record())))) == [ev]
    assert parse(json.dumps(notification(record()) | {"extra": [1, {"x": None}]})) == [ev]  # unknown members
    other = {"eventSource": "aws:sqs", "s3": "anything"}  # another service's record: not ours to judge
    assert parse(json.dumps(notification(other, record()))) == [ev]
    tagged = record() | {"eventName": "ObjectTagging:Put"}  # an S3 event that changes no object
    assert parse(json.dumps(notification(tagged))) == []
    assert parse(json.dumps(notification())) == []
    assert parse(json.dumps(with_object(versionId=None, sequencer=None))) == [ObjectEvent("b", "m.zip", False, "", "t")]


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        (notification(record(object="key")), r"Records\[0\]\.s3\.object: a string, not an object"),
        ({"Records": {"0": record()}}, "Records: an object, not a list"),
        ({"Records": "[]"}, "Records: a string, not a list"),
        (notification("record"), r"Records\[0\]: a string, not an object"),
        (notification(record(), 7), r"Records\[1\]: a number, not an object"),
        (notification(record() | {"s3": None}), r"Records\[0\]\.s3: missing"),
        (notification(record() | {"s3": []}), r"Records\[0\]\.s3: a list, not an object"),
        (notification(record(object={"sequencer": "0A"})), r"\.object\.key: missing"),
        (notification(record(bucket={})), r"\.bucket\.name: missing"),
        (notification(record(bucket="b")), r"\.bucket: a string, not an object"),
        (with_object(key=12), r"\.object\.key: a number, not a string"),
        (with_object(key=["m.zip"]), r"\.object\.key: a list, not a string"),
        (with_object(key="k" * 5000), r"\.object\.key: longer than 4096"),
        (with_object(sequencer=10), r"\.object\.sequencer: a number, not a string"),
        (with_object(sequencer="0x1Z"), r"\.object\.sequencer: not hexadecimal"),
        (with_object(versionId={"id": 1}), r"\.object\.versionId: an object, not a string"),
        (notification(record() | {"eventName": 1}), r"Records\[0\]\.eventName: a number, not a string"),
        (notification(record() | {"eventTime": 1.5}), r"Records\[0\]\.eventTime: a number"),
        ({"Type": "Notification", "Message": {"Records": []}}, "Message: an object, not a string"),
        ({"source": "aws.s3", "detail": "x"}, "detail: a string, not an object"),
        (
            {"source": "aws.s3", "detail-type": "Object Created", "detail": {"bucket": {"name": "b"}, "object": "k"}},
            r"detail\.object: a string, not an object",
        ),
        ({"hello": 1}, "neither an S3 notification"),
    ],
)
def test_each_wrong_shape_is_malformed_with_its_path(doc: Any, where: str) -> None:
    with pytest.raises(MalformedMessage, match=where):
        parse(json.dumps(doc))


def test_a_wrong_shape_inside_sns_names_the_message() -> None:
    err = malformed(sns(json.dumps(notification(record(object="key")))))
    assert err.path == "Message.Records[0].s3.object"
    assert malformed(sns(sns(json.dumps(notification(record()))))).path == "Message"  # SNS in SNS: not S3's
    assert "not JSON" in str(malformed(sns("{not json")))


@pytest.mark.parametrize(
    "body",
    [
        json.dumps(with_object(size=1)).replace('"size": 1', '"size": 1e999'),
        json.dumps(with_object(size=1)).replace('"size": 1', '"size": NaN'),
        json.dumps(with_object(size=1)).replace('"size": 1', '"size": -Infinity'),
        sns(json.dumps(with_object(size=1)).replace('"size": 1', '"size": 1e999')),
        '{"Records": ' + "[" * 100 + "]" * 100 + "}",
        "[" * 130_000 + "]" * 130_000,  # 260 KB of nesting: json.loads raises RecursionError
        sns("[" * 100_000 + "]" * 100_000),
        json.dumps(with_object(key="m.zip")).replace("m.zip", "\\udc80.zip"),
        b'{"Records": [], "x": "\xc3\x28"}',
        json.dumps(notification(record()) | {"pad": "x" * MAX_BODY}),
        "x" * (MAX_BODY + 1),
        "é" * (MAX_BODY // 2 + 1),  # fewer characters than the limit, more bytes
        "",
        "null",
        "[]",
        '"Records"',
        "{" * 5,
    ],
)
def test_bodies_of_any_shape_are_malformed_not_exceptions(body: str | bytes) -> None:
    malformed(body)


# --- the poller ------------------------------------------------------------------------------------------


class FakeSQS:
    def __init__(self, bodies: list[str]) -> None:
        self.messages = [
            {"MessageId": f"m{i}", "ReceiptHandle": f"r{i}", "Body": body} for i, body in enumerate(bodies)
        ]
        self.deleted: list[str] = []

    def receive_message(self, **kw: Any) -> dict[str, Any]:
        batch, self.messages = self.messages[:10], self.messages[10:]
        return {"Messages": batch}

    def delete_message_batch(self, **kw: Any) -> dict[str, Any]:
        self.deleted += [e["ReceiptHandle"] for e in kw["Entries"]]
        return {"Successful": kw["Entries"]}


def test_the_poller_deletes_counts_and_logs_malformed_messages_once_and_keeps_the_good_ones() -> None:
    secret = "do-not-log-" + "x" * 500
    bad = [
        json.dumps(notification(record(object="key"))),
        json.dumps({"Records": secret}),
        "[" * 130_000,
        json.dumps(with_object(size=1)).replace('"size": 1', '"size": 1e999'),
    ]
    good = json.dumps(notification(record(object={"key": "p/m.zip", "sequencer": "0B"})))
    sqs = FakeSQS([*bad, good])
    log = logging.getLogger("test.shapes.poller")
    log.propagate = False
    records = Capture()
    log.addHandler(records)
    pending = Pending()
    poller = QueuePoller(sqs, "url", EventFilter("b", "p/"), pending, log)
    assert poller.poll_once() == 5
    assert sqs.deleted == ["r0", "r1", "r2", "r3", "r4"]
    assert (poller.received, poller.malformed) == (5, 4)
    warnings = records.messages(logging.WARNING)
    assert len(warnings) == 4 and all(m.startswith("ignored an SQS message: ") for m in warnings), warnings
    assert all(len(m) < 300 and secret not in m for m in warnings)
    assert "Records[0].s3.object: a string, not an object" in warnings[0]
    assert list(pending.take(0)) == ["m"]


def test_a_failure_no_check_foresaw_still_deletes_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    import modelsync.events as events

    def boom(body: str) -> list[ObjectEvent]:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(events, "parse", boom)
    sqs = FakeSQS(["{}"])
    poller = QueuePoller(sqs, "url", EventFilter("b", ""), Pending(), logging.getLogger("test.shapes.bug"))
    assert poller.poll_once() == 1 and sqs.deleted == ["r0"] and poller.malformed == 1


# --- rollout states ------------------------------------------------------------------------------------------

ART = Artifact("a" * 64, "p/add.zip", '"e1"', "v1")
NEW = Artifact("b" * 64, "p/add.zip", '"e2"', "v2")


def good_state() -> dict[str, Any]:
    p = Participant("h1", "canary", 100.0, 101.0, 102.0, {}, None, None, ready=101.5)
    return State("add", ART, Rollout(NEW, ART, 100.0, "h1", 1, 4, {"h1": p})).to_json()


def changed(path: str, value: Any) -> dict[str, Any]:
    """The good state with the member at ``path`` (dotted) set to ``value``."""
    doc = copy.deepcopy(good_state())
    *parents, last = path.split(".")
    node: Any = doc
    for name in parents:
        node = node[name]
    node[last] = value
    return doc


class FakeS3:
    """GetObject's answer; without a ContentLength (a proxy may drop it) the body alone must be bounded."""

    def __init__(self, body: bytes, length: bool = True) -> None:
        self.body = body
        self.length = length

    def get_object(self, **kw: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"Body": io.BytesIO(self.body), "ETag": '"e"'}
        if self.length:
            out["ContentLength"] = len(self.body)
        return out


def read(body: bytes | str, length: bool = True) -> tuple[State | None, str]:
    data = body.encode() if isinstance(body, str) else body
    return Ledger(FakeS3(data, length), "bkt", "p/").read("add")


def test_a_good_state_reads_back() -> None:
    state, etag = read(json.dumps(good_state()))
    assert state is not None and state.rollout is not None and state.rollout.wanted == 1 and etag == '"e"'
    assert State.from_json("add", changed("rollout.wanted", 3.0)).rollout.wanted == 3  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        (changed("rollout.wanted", "3"), "rollout.wanted: a string, not a whole number"),
        (changed("rollout.wanted", 10**30), "rollout.wanted: out of range"),
        (changed("rollout.wanted", 1.5), "rollout.wanted: a number, not a whole number"),
        (changed("rollout.wanted", [1]), "rollout.wanted: a list"),
        (changed("rollout.live_hosts", -1), "rollout.live_hosts: out of range"),
        (changed("rollout.started", "yesterday"), "rollout.started: a string, not a number"),
        (changed("rollout.started", 1e300), "rollout.started: out of range"),
        (changed("rollout.artifact", "b" * 64), "rollout.artifact: a string, not an object"),
        (changed("rollout.artifact.sha256", 5), "rollout.artifact.sha256: a number, not a string"),
        (changed("rollout.previous", None), "rollout.previous: null, not an object"),
        (changed("rollout.participants", ["h1"]), "rollout.participants: a list, not an object"),
        (changed("rollout.participants.h1.role", "boss"), r"rollout.participants#0.role: neither"),
        (changed("rollout.participants.h1.seen", True), r"participants#0.seen: a boolean, not a number"),
        (changed("rollout.participants.h1.lost", "no"), r"participants#0.lost: a string, not true or false"),
        (changed("rollout.participants.h1.window", {"successes": 1e308}), r"#0.window.successes: out of range"),
        (changed("rollout.participants.h1.start", {"add\x1f1": [1, 2]}), r"#0.start#0: not 3 counters"),
        (changed("rollout.participants.h1.start", {"add\x1f1": [1, 2, "3"]}), r"#0.start#0\[2\]: a string"),
        (changed("stable", []), "stable: a list, not an object"),
        (changed("verdicts", {"v": 1}), "verdicts: an object, not a list"),
        (changed("verdicts", [{"verdict": "promoted", "at": -5}]), r"verdicts\[0\].at: out of range"),
        (changed("verdicts", ["promoted"]), r"verdicts\[0\]: a string, not an object"),
        (changed("format", 2), "not a rollout state of this model"),
    ],
)
def test_each_wrong_shape_of_a_state_is_malformed_with_its_path(doc: Any, where: str) -> None:
    with pytest.raises(Malformed, match=where):
        State.from_json("add", doc)
    with pytest.raises(LedgerError, match="not a valid rollout state"):
        read(json.dumps(doc))


def spelt(old: str, new: str, doc: dict[str, Any] | None = None) -> str:
    """The good state's JSON with ``old`` spelt ``new``: what no json.dumps of ours writes."""
    text = json.dumps(doc or good_state())
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize(
    "body",
    [
        spelt('"wanted": 1,', '"wanted": 1e999,'),
        spelt('"wanted": 1,', '"wanted": NaN,'),
        spelt('"wanted": 1,', '"wanted": -Infinity,'),
        spelt('"claimed": 100.0', '"claimed": 1e999'),
        spelt('"stable": {', '"stable": ' + "[" * 200_000 + "]" * 200_000 + ', "x": {'),
        spelt('"stable": {', '"stable": ' + "[" * 40 + "]" * 40 + ', "x": {'),
        json.dumps(changed("rollout.started_by", "h\udc80")),
        b'{"format": 1, "model": "add", "verdicts": ["\xff"]}',
        b'{"format": 1, "model": "add", "pad": "' + b"x" * MAX_STATE + b'"}',
    ],
)
def test_states_of_any_shape_are_unreadable_not_exceptions(body: str | bytes) -> None:
    for length in (True, False):
        with pytest.raises(LedgerError, match=r"not a valid rollout state|not a rollout state"):
            read(body, length)
