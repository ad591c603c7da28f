"""Safe rollouts without a Triton: the ledger's compare-and-swap on moto's S3, the evidence and the verdict
rules, two daemons deciding at once, skewed clocks, the settings and the operator's CLI.

The counters a daemon reads come from a small HTTP endpoint serving Prometheus text shaped like Triton's
(the families and labels seen on Triton 2.51, docs/modelsync.md); the fleet tests
(tests/integration/modelsync/test_modelsync_rollouts.py) read real Tritons.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from modelsync.events import EventFilter, ObjectEvent
from modelsync.evidence import REJECT, WAIT, Sample, Thresholds, Window, judge, parse, window
from modelsync.install import Served
from modelsync.ledger import (
    CANARY,
    CONTROL,
    Artifact,
    Conflict,
    Ledger,
    LedgerError,
    Participant,
    Rollout,
    State,
    model_of_state,
    state_key,
)
from modelsync.metrics import Recorder
from modelsync.rollout import Plan, Rollouts, progress_every, stale_after
from modelsync.rolloutcli import main as cli_main
from modelsync.s3 import Archive
from modelsync.settings import ConfigError, Settings, load
from telemetry.sinks.stdout import StreamSink
from tests.support.helpers import Capture
from tests.support.msync import Moto, moto, new_bucket, unique  # noqa: F401 - moto is a fixture

TRITON_TEXT = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="add",version="1"}} {ok}
nv_inference_request_success{{model="other",version="1"}} 999
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{{model="add",reason="OTHER",version="1"}} 0
nv_inference_request_failure{{model="add",reason="BACKEND",version="1"}} {failed}
nv_inference_request_failure{{model="add",reason="REJECTED",version="1"}} 0
# TYPE nv_inference_request_duration_us counter
nv_inference_request_duration_us{{model="add",version="1"}} {duration}
nv_inference_request_summary_us{{model="add",version="1",quantile="0.5"}} 900
nv_inference_request_summary_us{{model="add",version="1",quantile="0.95"}} {p95}
nv_inference_count{{model="add",version="1"}} 7
"""


def text(ok: int, failed: int = 0, duration: int = 0, p95: int = 1000) -> str:
    return TRITON_TEXT.format(ok=ok, failed=failed, duration=duration, p95=p95)


# --- evidence ---------------------------------------------------------------------------------------------


def test_the_four_families_of_the_asked_models_are_read_and_failures_summed_over_reason() -> None:
    snap = parse(text(10, 3, 25_000, 4200), {"add"})
    assert snap == {("add", "1"): Sample(10.0, 3.0, 25_000.0, 4200.0)}
    assert parse(text(10), {"nope"}) == {}
    assert parse('nv_inference_request_success{model="add",version="1"} NaN\ngarbage {{{\n', {"add"}) == {}


def test_a_window_is_the_difference_and_a_counter_that_went_down_counts_from_zero() -> None:
    start = parse(text(10, 1, 10_000), {"add"})
    assert window(start, parse(text(30, 2, 30_000), {"add"})) == Window(20.0, 1.0, 20_000.0, 1.0)
    restarted = window(start, parse(text(4, 0, 4_000), {"add"}))  # Triton restarted: 4 since
    assert (restarted.successes, restarted.failures, restarted.avg_ms) == (4.0, 0.0, 1.0)
    assert window({}, parse(text(5), {"add"})).requests == 5  # a series absent at the start


def test_verdicts() -> None:
    t = Thresholds(bake_seconds=60, min_requests=100, max_failure_increase=0.01, max_latency_ratio=1.5)
    good, base = Window(200, 0, 200 * 2000.0), Window(300, 0, 300 * 1900.0)
    assert judge(good, [("controls", base)], t, 60).verdict == "promote"
    failing = judge(Window(20, 180, 0), [("controls", base)], t, 60)
    assert failing.verdict == REJECT and "failure ratio 0.9000" in failing.reason
    slow = judge(Window(200, 0, 200 * 40_000.0), [("controls", base)], t, 60)
    assert slow.verdict == REJECT and slow.evidence["latency_ratio"] > 20 and "average latency" in slow.reason
    p95 = judge(Window(200, 0, 200 * 2000.0, 90.0), [("controls", Window(300, 0, 300 * 1900.0, 10.0))], t, 60)
    assert p95.verdict == REJECT and "p95" in p95.reason
    short_bake = replace(t, bake_seconds=30)  # Triton's summary covers 60 s: a shorter bake leaves p95 out
    assert judge(
        Window(200, 0, 200 * 2000.0, 90.0), [("c", Window(300, 0, 570_000.0, 10.0))], short_bake, 30
    ).verdict == ("promote")
    silent = judge(Window(99, 0, 99_000.0), [("controls", base)], t, 60)
    assert silent.verdict == WAIT and "fewer than --bake-min-requests 100" in silent.reason
    # The first baseline with enough requests: controls too thin, the canary hosts before the switch then.
    fallback = judge(good, [("controls", Window(5, 0, 5000.0)), ("before", base)], t, 60)
    assert fallback.evidence["baseline"]["source"] == "before" and fallback.verdict == "promote"
    alone = judge(Window(200, 1, 200 * 2000.0), [], t, 60)  # no baseline: failures against none, latency unjudged
    assert alone.verdict == "promote" and alone.evidence["baseline"] == {"source": "none"}
    assert judge(Window(200, 5, 0.0), [], t, 60).verdict == REJECT  # 5 of 205 > 0.01


def test_cadence_follows_the_bake() -> None:
    assert progress_every(600) == 30.0 and progress_every(20) == 4.0 and progress_every(2) == 1.0
    assert stale_after(600) == 100.0 and stale_after(5) == 13.0


# --- the ledger -------------------------------------------------------------------------------------------


def ledger(moto: Moto, bucket: str, clock: Any = time.time) -> Ledger:  # noqa: F811
    return Ledger(moto.client("s3"), bucket, "triton/", clock)


ART = Artifact("a" * 64, "triton/add.zip", '"e1"', "v1")
NEW = Artifact("b" * 64, "triton/add.zip", '"e2"', "v2")


def test_state_is_written_only_by_compare_and_swap(moto) -> None:  # noqa: F811
    lg = ledger(moto, new_bucket(moto))
    assert lg.read("add") == (None, "")
    etag = lg.write(State("add", ART), "")
    with pytest.raises(Conflict):  # If-None-Match: * on an object that exists
        lg.write(State("add", NEW), "")
    state, read_etag = lg.read("add")
    assert state is not None and state.stable == ART and read_etag == etag
    moved = lg.write(State("add", NEW), etag)
    with pytest.raises(Conflict):  # If-Match on the ETag read before someone else's write
        lg.write(State("add", ART), etag)
    assert lg.read("add")[0] == State("add", NEW) and moved != etag
    assert lg.models() == ["add"]
    assert state_key("triton/", "add") == "triton/.modelsync/rollouts/add.json"
    assert model_of_state("triton/.modelsync/rollouts/add.json", "triton/") == "add"
    assert model_of_state("triton/add.zip", "triton/") is None


def test_a_state_that_is_not_ours_is_refused_with_how_to_fix_it(moto) -> None:  # noqa: F811
    bucket = new_bucket(moto)
    moto.client("s3").put_object(Bucket=bucket, Key="triton/.modelsync/rollouts/add.json", Body=b"{not json")
    with pytest.raises(LedgerError, match=r"not a valid rollout state.*rollout promote\|reject add"):
        ledger(moto, bucket).read("add")


def test_the_state_round_trips_with_a_rollout_in_flight() -> None:
    p = Participant("h1", CANARY, 100.0, 101.0, 102.0, {("add", "1"): Sample(1, 2, 3)}, Window(5, 1, 500.0, 2.0),
                    Window(9, 0, 9.0), ready=101.5)  # fmt: skip
    r = Rollout(NEW, ART, 100.0, "h1", 1, 4, {"h1": p})
    state = State("add", ART, r)
    assert State.from_json("add", json.loads(json.dumps(state.to_json()))) == state


def test_a_rollout_key_is_an_event_for_its_model() -> None:
    filt = EventFilter("bkt", "triton/")
    assert filt.accept(ObjectEvent("bkt", "triton/.modelsync/rollouts/add.json", False, "01")) == "add"
    assert filt.accept(ObjectEvent("bkt", "triton/.modelsync/other/add.json", False, "02")) is None


def test_times_are_on_s3s_clock_whatever_the_hosts(moto) -> None:  # noqa: F811
    bucket = new_bucket(moto)
    for skew in (-3600.0, 3600.0):
        lg = ledger(moto, bucket, clock=lambda skew=skew: time.time() + skew)
        lg.read("add")  # any answer carries S3's Date
        assert abs(lg.now() - time.time()) < 2.0, skew


# --- the coordinator, against moto and a metrics endpoint ----------------------------------------------------


class Metrics:
    """An HTTP endpoint answering GET /metrics with the text the test sets (what a Triton would count)."""

    def __init__(self) -> None:
        self.body = text(0)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                data = owner.body.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/metrics"


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    m = Metrics()
    yield m
    m.server.shutdown()


def coordinator(
    moto: Moto,  # noqa: F811
    bucket: str,
    host: str,
    url: str,
    clock: Any = time.time,
    **kw: Any,
) -> tuple[Rollouts, Capture, io.BytesIO]:
    settings = Settings(
        bucket=bucket,
        prefix="triton/",
        host=host,
        canary_fraction=kw.pop("fraction", 0.5),
        bake_seconds=kw.pop("bake", 2.0),
        bake_min_requests=kw.pop("min_requests", 10),
        triton_metrics_url=url,
        topic_arn="arn:aws:sns:us-east-1:123456789012:t",
    )
    log = logging.getLogger(unique("test.rollout."))
    log.setLevel(logging.DEBUG)
    log.propagate = False
    records = Capture()
    log.addHandler(records)
    emf = io.BytesIO()
    rollouts = Rollouts(
        settings,
        Ledger(moto.client("s3"), bucket, "triton/", clock),
        Recorder("Triton", StreamSink(emf), host),
        log,
        identify=lambda a: {'"e2"': ("b" * 64, "v2"), '"e1"': ("a" * 64, "v1")}[a.etag],
        entry_models=lambda name: [name],
        live_hosts=kw.pop("live", lambda: 4),
        **kw,
    )
    return rollouts, records, emf


UPLOADED = datetime(2026, 12, 1, tzinfo=UTC)


def listed(etag: str) -> Archive:
    return Archive("add", "triton/add.zip", etag, 100, UPLOADED)


def served(sha: str, etag: str, version: str) -> Served:
    return Served("add", sha, etag, version, "triton/add.zip")


V1 = served("a" * 64, '"e1"', "v1")
V2 = served("b" * 64, '"e2"', "v2")


def test_the_first_host_to_see_an_upload_starts_the_rollout_as_its_canary_and_the_others_wait(moto, metrics) -> None:  # noqa: F811
    bucket = new_bucket(moto)
    a, _, emf = coordinator(moto, bucket, "a", metrics.url)
    b, _, _ = coordinator(moto, bucket, "b", metrics.url)
    c, _, _ = coordinator(moto, bucket, "c", metrics.url)
    d, _, _ = coordinator(moto, bucket, "d", metrics.url)
    e, _, _ = coordinator(moto, bucket, "e", metrics.url)
    assert a.plan("add", listed('"e1"'), V1) == Plan(listed('"e1"'))  # the fleet's artifact: recorded as stable
    state = Ledger(moto.client("s3"), bucket, "triton/").read("add")[0]
    assert state is not None and state.stable == ART and state.rollout is None
    first = a.plan("add", listed('"e2"'), V1, fresh=True)
    assert first.install == listed('"e2"') and first.role == CANARY
    second = b.plan("add", listed('"e2"'), V1, fresh=True)  # ceil(0.5 x 4) = 2 canaries
    assert second.role == CANARY
    control = c.plan("add", listed('"e2"'), V1, fresh=True)
    assert control.install is None and control.role == CONTROL and "control" in control.reason
    assert d.plan("add", listed('"e2"'), V1, fresh=True).role == CONTROL  # as many controls as canaries
    other = e.plan("add", listed('"e2"'), V1, fresh=True)
    assert other.install is None and other.role == "" and "in flight on a, b" in other.reason
    joining = e.plan("add", listed('"e2"'), None, fresh=True)  # nothing installed: the stable artifact, pinned
    assert joining.install is not None and joining.install.version_id == "v1" and joining.install.etag == '"e1"'
    assert any(json.loads(line).get("RolloutsStarted") == 1.0 for line in emf.getvalue().splitlines())


def evidence_for(metrics: Metrics, ok: int, failed: int = 0, ms: float = 1.0) -> None:
    metrics.body = text(ok, failed, int(ok * ms * 1000))


def baked(moto: Moto, metrics: Metrics, hosts: list[str], **kw: Any) -> tuple[str, list[Rollouts], list[Capture]]:  # noqa: F811
    """A rollout of e2 whose canaries (all of ``hosts``) are READY, warm and past their bake."""
    bucket = new_bucket(moto)
    made = [coordinator(moto, bucket, h, metrics.url, live=lambda: len(hosts), fraction=1.0, **kw) for h in hosts]
    coords, logs = [m[0] for m in made], [m[1] for m in made]
    coords[0].plan("add", listed('"e1"'), V1)
    for r in coords:
        assert r.plan("add", listed('"e2"'), V1, fresh=True).role == CANARY
        r.settled("add", r.plan("add", listed('"e2"'), V2, fresh=True), V2, installed=True)
    evidence_for(metrics, 50)
    for r in coords:
        r.settle = 0.0
        r.tick()  # warm: each window starts
    return bucket, coords, logs


def test_every_decision_line_names_the_host_that_made_it(moto, metrics) -> None:  # noqa: F811
    """The dashboard's rollout timeline reads the decision lines of every host's group: each says whose it is."""
    _, (a, b), (log_a, log_b) = baked(moto, metrics, ["a", "b"], bake=0.5)
    evidence_for(metrics, 500)
    time.sleep(1.0)
    a.tick()
    b.tick()
    verdicts = set()
    for host, log in (("a", log_a), ("b", log_b)):
        decided = [getattr(r, "fields", {}) for r in log.records if "verdict" in getattr(r, "fields", {})]
        assert decided and {d.get("host") for d in decided} == {host}, decided
        verdicts |= {d["verdict"] for d in decided}
    assert {"started", "canary claimed", "baking", "promoted"} <= verdicts, verdicts


def test_two_canaries_deciding_at_once_make_one_verdict(moto, metrics) -> None:  # noqa: F811
    bucket, (a, b), (log_a, log_b) = baked(moto, metrics, ["a", "b"], bake=1.0)
    evidence_for(metrics, 500)
    time.sleep(1.5)
    barrier = threading.Barrier(2)

    def decide(r: Rollouts) -> None:
        barrier.wait()
        r.tick()

    threads = [threading.Thread(target=decide, args=(r,)) for r in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    state = Ledger(moto.client("s3"), bucket, "triton/").read("add")[0]
    assert state is not None and [v.verdict for v in state.verdicts] == ["promoted"] and state.stable == NEW
    decided = [
        r for log in (log_a, log_b) for r in log.records if getattr(r, "fields", {}).get("verdict") == "promoted"
    ]
    assert len(decided) == 1, [r.getMessage() for log in (log_a, log_b) for r in log.records]


def test_a_skewed_clock_neither_bakes_short_nor_calls_the_others_lost(moto, metrics) -> None:  # noqa: F811
    bucket, _, _ = baked(moto, metrics, ["a"], bake=30.0)
    ahead, _, _ = coordinator(moto, bucket, "ahead", metrics.url, clock=lambda: time.time() + 3600, bake=30.0)
    ahead.plan("add", listed('"e2"'), V1, fresh=True)  # it joins as control, reading the state
    evidence_for(metrics, 500)
    ahead.tick()
    state = Ledger(moto.client("s3"), bucket, "triton/").read("add")[0]
    assert state is not None and state.rollout is not None  # no verdict: 30 s have not passed on S3's clock
    assert not any(p.lost for p in state.rollout.participants.values())  # an hour ahead, yet nobody is lost


def test_a_canary_that_cannot_load_the_artifact_rejects_it(moto, metrics) -> None:  # noqa: F811
    from modelsync.errors import LoadFailed, RolledBack

    bucket = new_bucket(moto)
    a, log_a, _ = coordinator(moto, bucket, "a", metrics.url)
    a.plan("add", listed('"e1"'), V1)
    plan = a.plan("add", listed('"e2"'), V1, fresh=True)
    a.failed("add", plan, listed('"e2"'), LoadFailed("x"))  # transient=False: its own fault ...
    state = Ledger(moto.client("s3"), bucket, "triton/").read("add")[0]
    assert state is not None and [v.verdict for v in state.verdicts] == ["rejected"]
    assert "failed to install on canary a" in state.verdicts[0].reason
    back = a.plan("add", listed('"e2"'), V1, fresh=True)
    assert back.install is None and "was rejected" in back.reason  # ... and it stays out
    home = a.plan("add", listed('"e2"'), V2, fresh=True)  # had it served e2, it goes back to e1: a rollback line
    a.settled("add", home, V1, installed=True)
    rolled = [
        getattr(r, "fields", {}) for r in log_a.records if getattr(r, "fields", {}).get("verdict") == "rolled back"
    ]
    assert [(f.get("host"), f.get("artifact")) for f in rolled] == [("a", "b" * 64)]
    b, _, _ = coordinator(moto, new_bucket(moto), "b", metrics.url)
    assert b.plan("add", listed('"e1"'), V1).install is not None
    plan = b.plan("add", listed('"e2"'), V1, fresh=True)
    b.failed("add", plan, listed('"e2"'), RolledBack("Triton unreachable", transient=True))  # not the artifact's
    assert [v.verdict for v in b.ledger.read("add")[0].verdicts] == []  # type: ignore[union-attr]


def test_an_unreadable_state_keeps_what_is_served_and_says_why(moto, metrics) -> None:  # noqa: F811
    bucket = new_bucket(moto)
    moto.client("s3").put_object(Bucket=bucket, Key="triton/.modelsync/rollouts/add.json", Body=b"[]")
    a, _, _ = coordinator(moto, bucket, "a", metrics.url)
    plan = a.plan("add", listed('"e2"'), V1)
    assert plan.install is None and plan.transient and "not a valid rollout state" in plan.reason


def test_without_versions_a_rollout_cannot_take_anything_back_so_it_does_not_start(moto, metrics) -> None:  # noqa: F811
    a, records, _ = coordinator(moto, new_bucket(moto), "a", metrics.url)
    unversioned = served("a" * 64, '"e1"', "")
    a.plan("add", listed('"e1"'), unversioned)
    assert a.plan("add", listed('"e2"'), unversioned, fresh=True) == Plan(listed('"e2"'))
    assert a.plan("add", listed('"e2"'), unversioned, fresh=True) == Plan(listed('"e2"'))
    errors = [r.getMessage() for r in records.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "not versioned" in errors[0]


# --- settings and the operator's CLI -------------------------------------------------------------------------


def test_settings_names_defaults_and_refusals() -> None:
    base = ["--bucket", "bkt", "--topic-arn", "arn:aws:sns:us-east-1:123456789012:t"]
    s = load(base, {})
    assert (s.canary_fraction, s.bake_seconds, s.bake_min_requests, s.max_failure_increase, s.max_latency_ratio) == (
        0.0, 600.0, 100, 0.01, 1.5)  # fmt: skip
    env = {"MODELSYNC_CANARY_FRACTION": "0.25", "MODELSYNC_BAKE_SECONDS": "20", "MODELSYNC_BAKE_MIN_REQUESTS": "30",
           "MODELSYNC_MAX_FAILURE_INCREASE": "0.05", "MODELSYNC_MAX_LATENCY_RATIO": "2"}  # fmt: skip
    s = load(base, env)
    assert (s.canary_fraction, s.bake_seconds, s.bake_min_requests, s.max_failure_increase, s.max_latency_ratio) == (
        0.25, 20.0, 30, 0.05, 2.0)  # fmt: skip
    assert load([*base, "--canary-fraction", "1", "--max-latency-ratio", "3"], env).canary_fraction == 1.0
    for argv, needle in (
        (["--canary-fraction", "1.5"], "between 0 (off) and 1"),
        (["--max-latency-ratio", "0.5"], "at least 1"),
        (["--max-failure-increase", "1"], "below 1"),
        (["--bake-min-requests", "0"], "--bake-min-requests='0'"),
    ):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            load([*base, *argv], {})
    with pytest.raises(ConfigError, match="needs --topic-arn"):
        load(["--bucket", "bkt", "--canary-fraction", "0.25"], {})


def run_cli(moto: Moto, *argv: str) -> tuple[int, str, str]:  # noqa: F811
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli_main(list(argv), environ={}, out=out, s3_client=moto.client("s3"))
    return code, out.getvalue(), err.getvalue()


def test_the_cli_names_what_is_wrong_and_steers_what_is_right(moto, metrics) -> None:  # noqa: F811
    bucket = new_bucket(moto)
    s3 = moto.client("s3")
    code, _, err = run_cli(moto, "status", "nope", "--bucket", bucket, "--prefix", "triton/")
    assert code == 2 and "no model 'nope'" in err
    for data, digest in ((b"v1", "a" * 64), (b"v2", "b" * 64)):
        put = s3.put_object(Bucket=bucket, Key="triton/add.zip", Body=data, Metadata={"sha256": digest})
    a, _, _ = coordinator(moto, bucket, "a", metrics.url)
    a.identify = lambda arch: ("b" * 64, put["VersionId"]) if arch.etag == put["ETag"] else ("a" * 64, "v1")
    a.plan("add", listed('"e1"'), V1)  # stable: v1
    a.plan("add", listed(put["ETag"]), V1, fresh=True)  # a rollout of v2, a is its canary
    code, out, _ = run_cli(moto, "status", "--bucket", bucket, "--prefix", "triton/")
    assert code == 0 and "rollout   bbbbbbbbbbbb" in out and "canary   a: installing" in out, out
    code, _, err = run_cli(moto, "reject", "add", "a" * 12, "--bucket", bucket, "--prefix", "triton/")
    assert code == 2 and "is the stable artifact" in err
    code, _, err = run_cli(moto, "promote", "add", "ffffffffff", "--bucket", bucket, "--prefix", "triton/")
    assert code == 2 and "artifact ffffffffff of add is unknown" in err
    code, out, _ = run_cli(moto, "reject", "add", "--bucket", bucket, "--prefix", "triton/")
    assert code == 0 and json.loads(out)["verdict"] == "rejected"
    code, out, _ = run_cli(moto, "status", "add", "--json", "--bucket", bucket, "--prefix", "triton/")
    doc = json.loads(out)["add"]
    assert doc["state"]["rollout"] is None and doc["state"]["verdicts"][-1]["verdict"] == "rejected"
    assert doc["in_s3"]["sha256"] == "b" * 64
    code, out, _ = run_cli(moto, "promote", "add", "--bucket", bucket, "--prefix", "triton/")  # S3's rejected one
    assert code == 0 and json.loads(out)["artifact"] == "b" * 64
    state = a.ledger.read("add")[0]
    assert state is not None and state.stable is not None and state.stable.sha256 == "b" * 64
    assert a.plan("add", listed(put["ETag"]), V1, fresh=True).install is not None  # every host installs it now


def test_a_canary_that_cannot_install_in_time_lets_its_slot_go(moto, metrics) -> None:  # noqa: F811
    bucket = new_bucket(moto)
    a, records, _ = coordinator(moto, bucket, "a", metrics.url)
    b, _, _ = coordinator(moto, bucket, "b", metrics.url, live=lambda: 1)
    a.plan("add", listed('"e1"'), V1)
    assert a.plan("add", listed('"e2"'), V1, fresh=True).role == CANARY  # ... and its install keeps failing
    a.install_deadline = 0.0
    time.sleep(1.1)  # S3's clock has whole seconds
    a.tick()
    state = a.ledger.read("add")[0]
    assert state is not None and state.rollout is not None and state.rollout.participants["a"].lost
    assert any("could not install it within" in m for m in records.messages(logging.WARNING))
    assert b.plan("add", listed('"e2"'), V1, fresh=True).role == CANARY  # the slot is free for another host


def test_a_canary_whose_triton_stops_answering_goes_silent_and_loses_its_slot(moto, metrics) -> None:  # noqa: F811
    bucket, (a,), _ = baked(moto, metrics, ["a"], bake=30.0)
    b, _, _ = coordinator(moto, bucket, "b", metrics.url, bake=30.0)
    b.plan("add", listed('"e2"'), V1, fresh=True)  # b follows the rollout (a control)
    seen = a.ledger.read("add")[0].rollout.participants["a"].seen  # type: ignore[union-attr]
    metrics.server.shutdown()  # a's Triton is gone: a cannot read its counters ...
    metrics.server.server_close()
    a.tick()
    state = a.ledger.read("add")[0]
    assert state is not None and state.rollout is not None and state.rollout.participants["a"].seen == seen
    b.stale = 1.0  # ... so it refreshes nothing, and another daemon finds it silent
    time.sleep(2.1)
    b.tick()
    state = b.ledger.read("add")[0]
    assert state is not None and state.rollout is not None and state.rollout.participants["a"].lost
    assert state.verdicts == []  # nothing promoted on its word


def test_an_operators_promote_outlasts_daemons_writing_in_between(moto, metrics, monkeypatch) -> None:  # noqa: F811
    """Each canary writes the state as it bakes: on a busy fleet the operator's compare-and-swap loses races. It
    keeps trying (jittered) for OPERATOR_CAS_SECONDS, not a fixed five times, and says so when it gives up."""
    from modelsync import rolloutcli
    from modelsync.ledger import Conflict, Ledger

    bucket = new_bucket(moto)
    s3 = moto.client("s3")
    for data, digest in ((b"v1", "a" * 64), (b"v2", "b" * 64)):
        put = s3.put_object(Bucket=bucket, Key="triton/add.zip", Body=data, Metadata={"sha256": digest})
    a, _, _ = coordinator(moto, bucket, "a", metrics.url)
    a.identify = lambda arch: ("b" * 64, put["VersionId"]) if arch.etag == put["ETag"] else ("a" * 64, "v1")
    a.plan("add", listed('"e1"'), V1)
    a.plan("add", listed(put["ETag"]), V1, fresh=True)  # a rollout of v2 in flight
    real_write, lost = Ledger.write, []
    monkeypatch.setattr(Ledger, "write", lambda self, state, etag: (_ for _ in ()).throw(Conflict("always")))
    monkeypatch.setattr(rolloutcli, "OPERATOR_CAS_SECONDS", 0.3)
    code, _, err = run_cli(moto, "promote", "add", "--bucket", bucket, "--prefix", "triton/")
    assert code != 0 and "kept changing for 0.3 s; try again" in err  # a state that never settles: it gives up
    monkeypatch.setattr(rolloutcli, "OPERATOR_CAS_SECONDS", 30.0)

    calls: list[str] = []
    real_read, real_in_s3 = Ledger.read, rolloutcli.RolloutCli._in_s3
    monkeypatch.setattr(Ledger, "read", lambda self, m: calls.append("read") or real_read(self, m))
    monkeypatch.setattr(rolloutcli.RolloutCli, "_in_s3", lambda self, m: calls.append("s3") or real_in_s3(self, m))

    def busy(self: Ledger, state, etag):  # type: ignore[no-untyped-def]
        calls.append("write")
        if len(lost) < 8:  # eight daemons' writes land between the operator's read and write
            lost.append(etag)
            raise Conflict("a daemon wrote first")
        return real_write(self, state, etag)

    monkeypatch.setattr(Ledger, "write", busy)
    code, out, err = run_cli(moto, "promote", "add", "--bucket", bucket, "--prefix", "triton/")
    assert code == 0 and json.loads(out)["verdict"] == "promoted", err
    assert len(lost) == 8
    # nothing but the decision between the state's read and its write (S3's object is read first): the window
    # in which a baking canary's write makes the operator's fail is as short as it can be
    tries = "".join("R" if c == "read" else "W" if c == "write" else "s" for c in calls[calls.index("write") - 2 :])
    assert tries == "sRW" * 9, calls
