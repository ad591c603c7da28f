"""The FireLens log pipeline (fluentbit/), interpreted from the real config files.

Log text comes from a real Triton started in the test (both ``--log-format``
values, a failed load, an unload, the Python stub's traceback, a model named
``m@x.v2+b``, a 20 KB error line that Docker would split) and from a fixture of
the bare pre-24.05 form. See tests/support/fluentbit_sim.py for what is modelled.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from demo.triton import TritonServer, copy_models
from tests.support.fluentbit_sim import (
    ConfigError,
    Event,
    FireLensTask,
    OnigmoError,
    Pipeline,
    Record,
    compile_onigmo,
    dockerfile_copies,
    dockerfile_env,
    load_parsers,
)

ROOT = Path(__file__).resolve().parent.parent
FB = ROOT / "fluentbit"
FIXTURES = Path(__file__).parent / "fixtures" / "logs"
CONTAINERS = ["triton-server", "exporter"]
PREFIX = "/ecs/triton"


def pipeline(conf: Path = FB / "triton.conf", **env: str) -> Pipeline:
    base = dockerfile_env(FB / "Dockerfile") | {"AWS_REGION": "us-east-1"}
    return Pipeline(conf, base | env, dockerfile_copies(FB / "Dockerfile"), now=datetime(2026, 11, 30, tzinfo=UTC))


def run_lines(lines: list[str], stream: str = "stderr", container: str = "triton-server", **env: str) -> list[Event]:
    return pipeline(**env).run(FireLensTask(container).records(lines, stream=stream))


def by_group(events: list[Event]) -> dict[str, list[Event]]:
    out: dict[str, list[Event]] = {}
    for e in events:
        out.setdefault(e.group, []).append(e)
    return out


# --- static checks of the shipped files --------------------------------------------------


def test_config_loads_every_match_is_reached_and_no_rewrite_cycle() -> None:
    p = pipeline()
    p.check_reachability(CONTAINERS)
    p.check_no_rewrite_cycle(CONTAINERS)
    assert [s.name for s in p.inputs] == ["tcp"]  # no forward input: ECS owns it
    assert p.filters[0].name == "multiline" and p.filters[0].get("mode") == "partial_message"
    named = {n for f in p.filters if f.name == "parser" for n in f.all("Parser")}
    assert named <= set(p.parsers) and len(named) == 9


def test_dockerfile_bakes_both_files_where_the_config_and_docs_point() -> None:
    copies = dockerfile_copies(FB / "Dockerfile")
    assert copies["/fluent-bit/etc/triton/triton.conf"] == FB / "triton.conf"
    assert copies["/fluent-bit/etc/triton/parsers.conf"] == FB / "parsers.conf"
    assert "/fluent-bit/etc/triton/triton.conf" in (ROOT / "docs" / "logs.md").read_text()
    text = (FB / "Dockerfile").read_text()
    assert "aws-for-fluent-bit" in text and dockerfile_env(FB / "Dockerfile")["TRITON_LOG_GROUP_PREFIX"] == PREFIX


def test_every_regex_compiles_under_onigmo_rules() -> None:
    parsers, mls = load_parsers(FB / "parsers.conf")
    assert len(parsers) == 9 and set(mls) == {"triton_multiline"}
    for p in parsers.values():
        assert p.regex.groupindex, p.name  # named captures survived translation
    for rule in pipeline().filters:
        for r in rule.all("Rule"):
            compile_onigmo(r.split()[1])


@pytest.mark.parametrize(
    "pattern",
    [r"(?P<x>a)", r"\h+", r"(?i)abc", r"[[:alpha:]]", r"[a-z&&[^aeiou]]", r"a{2}+", r"(?s).", r"\p{L}"],
)
def test_onigmo_translation_refuses_constructs_that_differ(pattern: str) -> None:
    with pytest.raises(OnigmoError):
        compile_onigmo(pattern)


def test_onigmo_semantics_dot_and_anchors_are_ruby_like() -> None:
    assert compile_onigmo(r"^b$").search("a\nb\nc")  # ^ $ are line anchors in Ruby
    assert not compile_onigmo(r"a.b").search("a\nb")  # . never crosses a newline
    with pytest.raises(OnigmoError, match=r"not on 1\.9\.10"):  # /.../m, Ruby dotall: 1.9.10 reads it literally
        compile_onigmo("/a.b/m")
    assert not compile_onigmo(r"a\z").search("a\n") and compile_onigmo(r"a\Z").search("a\n")


def _variant(tmp_path: Path, old: str, new: str) -> Path:
    text = (FB / "triton.conf").read_text()
    assert old in text
    conf = tmp_path / "triton.conf"
    conf.write_text(text.replace(old, new, 1))
    shutil.copy(FB / "parsers.conf", tmp_path / "parsers.conf")
    return conf


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("/model/$TAG[3]\n", "/model/$model-logs\n", "stray characters"),
        ("/model/$TAG[3]\n", "/model/$TAG[3]-logs\n", "followed by"),
        ("Parser        triton_model_loading", "Parser        triton_model_nope", "not defined"),
        ("Match         exporter-firelens-*", "Match         exporter-firelens-* \n    Bogus_Key 1", "unknown keys"),
        ("Name          tcp", "Name          forward", "forward"),
        (
            "Match         triton.line.*\n    Rule          $level",
            "Match         triton.*\n    Rule          $level",
            "caught by its own Match",
        ),
        ("Match               triton.m4.*", "Match               triton.m9.*", "never reached"),
        ("log_retention_days  ${TRITON_LOG_RETENTION_DAYS}", "log_retention_days  42", "not a CloudWatch value"),
    ],
)
def test_checker_rejects_broken_variants(tmp_path: Path, old: str, new: str, complaint: str) -> None:
    conf = _variant(tmp_path, old, new)
    with pytest.raises(ConfigError, match=complaint):
        p = Pipeline(conf, {"AWS_REGION": "x", "TRITON_LOG_GROUP_PREFIX": PREFIX, "TRITON_LOG_RETENTION_DAYS": "30"})
        p.check_reachability(CONTAINERS)
        p.check_no_rewrite_cycle(CONTAINERS)


def test_a_cycle_is_caught_when_records_run(tmp_path: Path) -> None:
    conf = _variant(
        tmp_path,
        "Rule          $log .* triton.line.$TAG false",
        "Rule          $log .* triton-server-firelens-x.$TAG false",
    )
    p = Pipeline(conf, {"AWS_REGION": "x", "TRITON_LOG_GROUP_PREFIX": PREFIX, "TRITON_LOG_RETENTION_DAYS": "30"})
    with pytest.raises(ConfigError, match="cycle"):
        p.run(FireLensTask("triton-server").records(['I1130 16:38:37.074716 1 a.cc:1] "x"']))


# --- golden routing table ----------------------------------------------------------------

INF = "I1130 16:38:37.074716 2570 model_lifecycle.cc:472] "  # default layout prefixes
ERR = "E1130 16:38:37.101382 2570 model_lifecycle.cc:642] "
ISO_I = "2026-11-30T16:42:57Z I 10412 model_lifecycle.cc:624] "

GOLDEN = [
    # line, groups, level, model, version
    (INF + '"loading: add:1"', ["model/add"], "INFO", "add", "1"),
    (INF + "\"successfully loaded 'add'\"", ["model/add"], "INFO", "add", None),
    (ISO_I + "\"successfully unloaded 'add' version 1\"", ["model/add"], "INFO", "add", "1"),
    (
        ERR + "\"failed to load 'broken' version 1: Internal: boom\\n\\nAt:\\n x\"",
        ["errors", "model/broken"],
        "ERROR",
        "broken",
        "1",
    ),
    (INF + "\"failed to load 'broken'\"", ["model/broken"], "INFO", "broken", None),
    (
        '2026-11-30T16:42:45Z E 10412 tritonserver.cc:2607] "Internal: failed to load all models"',
        ["errors", "server"],
        "ERROR",
        None,
        None,
    ),
    (
        'W1130 18:29:15.846125 4131 metrics.cc:798] "DCGM unable to start: DCGM initialization error"',
        ["errors", "server"],
        "WARNING",
        None,
        None,
    ),
    (INF + '"loading: ns::ranker:12"', ["model/ns.ranker"], "INFO", "ns::ranker", "12"),
    (INF + '"loading: m@x.v2+b:1"', ["model/m.x.v2.b"], "INFO", "m@x.v2+b", "1"),
    (INF + '"loading: modèle-ü:1"', ["model/mod.le-"], "INFO", "modèle-ü", "1"),
    (INF + '"successfully loaded \'say \\"hi\\"\'"', ["model/say.hi"], "INFO", 'say "hi"', None),
    (INF + "\"successfully loaded 'it's'\"", ["model/it.s"], "INFO", "it's", None),
    # names that cannot be used: more than 4 parts, no safe character, over 200 characters
    (INF + '"loading: a/b/c/d/e:1"', ["server"], "INFO", "a/b/c/d/e", "1"),
    (ERR + "\"failed to load 'üü' version 1: Internal: x\"", ["errors", "server"], "ERROR", "üü", "1"),
    (INF + f'"loading: {"m" * 201}:1"', ["server"], "INFO", "m" * 201, "1"),
    # no Triton prefix at all: kept whole, never dropped
    ("Error: Failed to initialize NVML", ["server"], None, None, None),
]


@pytest.mark.parametrize(("line", "groups", "level", "model", "version"), GOLDEN)
def test_golden_routing(
    line: str, groups: list[str], level: str | None, model: str | None, version: str | None
) -> None:
    events = run_lines([line])
    assert sorted(e.group for e in events) == [f"{PREFIX}/{g}" for g in groups]
    for e in events:
        assert e.record.get("level") == level
        assert e.record.get("model") == model
        assert e.record.get("version") == version
        assert e.stream == FireLensTask("triton-server").tag  # one stream per task
        assert ("message" in e.record) == (level is not None)
        if level is None:
            assert e.record["log"] == line


def test_unescaped_message_record_time_pid_source_and_stream() -> None:
    line = (
        "E1130 16:38:37.101382 2570 model_lifecycle.cc:642] "
        '"failed to load \'broken\' version 1: Internal: boom \\"x\\"\\n\\nAt:\\n  /m.py(1): <module>\\n"'
    )
    (model_ev,) = [e for e in run_lines([line], stream="stdout") if e.group.endswith("/broken")]
    rec = model_ev.record
    assert rec["message"] == "failed to load 'broken' version 1: Internal: boom \"x\"\n\nAt:\n  /m.py(1): <module>\n"
    assert rec["pid"] == "2570" and rec["source"] == "model_lifecycle.cc:642" and rec["stream"] == "stdout"
    assert "log" not in rec and "time" not in rec
    assert model_ev.time == pytest.approx(datetime(2026, 11, 30, 16, 38, 37, 101382, tzinfo=UTC).timestamp())
    assert json.loads(model_ev.message)["model"] == "broken"  # whole record goes out as JSON


def test_prefix_comes_from_the_environment() -> None:
    events = run_lines(['I1130 16:38:37.074716 1 a.cc:1] "loading: add:1"'], TRITON_LOG_GROUP_PREFIX="/prod/inf")
    assert [e.group for e in events] == ["/prod/inf/model/add"]


def test_bare_pre_2405_fixture() -> None:
    lines = (FIXTURES / "triton_bare_pre2405.log").read_text().splitlines()
    events = run_lines(lines)
    groups = by_group(events)
    models = {e.record["model"]: e.group for e in events if "model" in e.record}
    assert models == {
        "resnet50": f"{PREFIX}/model/resnet50",
        "ns::ranker": f"{PREFIX}/model/ns.ranker",
        "it's": f"{PREFIX}/model/it.s",
        "legacy": f"{PREFIX}/model/legacy",
    }
    failed = [e for e in groups[f"{PREFIX}/model/ns.ranker"] if e.record["level"] == "ERROR"]
    assert failed[0].record["version"] == "3"
    assert failed[0].record["message"].endswith("allowed outputs are: x")
    stub = [e for e in groups[f"{PREFIX}/server"] if "Python stub" in e.record.get("message", "")]
    assert len(stub) == 1
    assert stub[0].record["message"].endswith('raise ValueError("bad config")\nValueError: bad config')
    assert {e.record["level"] for e in groups[f"{PREFIX}/errors"]} == {"ERROR", "WARNING"}
    assert len(groups[f"{PREFIX}/errors"]) == 4
    assert_nothing_lost(lines, events)


PREFIX_RE = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+ +\d+ |\d{4}-\d\d-\d\dT[\d:]+Z [IWEF] \d+ )\S+\]")


def assert_nothing_lost(lines: list[str], events: list[Event]) -> None:
    """Every non-blank input line's text reaches some event (after unescaping)."""
    haystack = "\n".join(str(v) for e in events for v in (e.message, *e.record.values()))
    for line in lines:
        text = line.strip()
        if not text:
            continue
        body = PREFIX_RE.sub("", text, count=1).strip().strip('"')
        if not body:
            continue  # a table header: its rows follow
        first = body.split("\\n")[0].replace('\\"', '"')
        assert first[:60] in haystack, line


# --- exporter ---------------------------------------------------------------------------


def _emf(size: int = 0) -> str:
    doc = {
        "_aws": {
            "Timestamp": 1764520000000,
            "CloudWatchMetrics": [
                {"Namespace": "Triton", "Dimensions": [["model"]], "Metrics": [{"Name": "Requests", "Unit": "Count"}]}
            ],
        },
        "model": "add",
        "Requests": 3,
        "pad": "p" * size,
    }
    return json.dumps(doc, separators=(",", ":"))


def test_exporter_emf_stdout_is_sent_raw_and_other_output_to_its_own_group() -> None:
    emf, big = _emf(), _emf(40_000)
    log = json.dumps({"ts": 1.0, "level": "warning", "logger": "exporter", "msg": "triton unreachable"})
    p = pipeline()
    task = FireLensTask("exporter")
    events = p.run(task.records([emf, big], stream="stdout") + task.records([log, "plain text"], stream="stderr"))
    metrics = [e for e in events if e.group == f"{PREFIX}/metrics"]
    assert [e.message for e in metrics] == [emf, big]  # raw events: _aws at the root, 40 KB line re-joined
    assert all(json.loads(e.message)["_aws"]["Timestamp"] for e in metrics)
    other = [e for e in events if e.group == f"{PREFIX}/exporter"]
    assert [json.loads(e.message)["log"] for e in other] == [log, "plain text"]
    assert len(events) == 4


def test_exporter_tcp_sink_lines_reach_the_metrics_group_raw() -> None:
    p = pipeline()
    tcp = next(s for s in p.inputs if s.name == "tcp")
    assert (tcp.get("Listen"), tcp.get("Port"), tcp.get("Format")) == ("127.0.0.1", "25888", "none")
    events = p.run([Record(tcp.get("Tag") or "", 1.7e9, {"log": _emf()})])
    assert [(e.group, e.message, e.stream) for e in events] == [
        (f"{PREFIX}/metrics", _emf(), "emf-tcp-ip-10-0-1-23.ec2.internal")  # one stream per task's router
    ]


# --- real Triton ------------------------------------------------------------------------


def _capture(tmp_path: Path, log_format: str) -> list[str]:
    """Start a real Triton with a failing, an unloadable and an odd-named model; return its lines."""
    work = tmp_path / log_format
    repo = copy_models(["add", "broken"], work / "models")
    odd = repo / "m@x.v2+b"
    shutil.copytree(repo / "add", odd)
    (odd / "config.pbtxt").write_text((odd / "config.pbtxt").read_text().replace('name: "add"', 'name: "m@x.v2+b"'))
    huge = repo / "huge"
    shutil.copytree(repo / "broken", huge)
    (huge / "config.pbtxt").write_text((huge / "config.pbtxt").read_text().replace('name: "broken"', 'name: "huge"'))
    (huge / "1" / "model.py").write_text('raise RuntimeError("h" * 20000)\n')
    server = TritonServer(repo, workdir=work, log_format=log_format)
    server.start()
    try:
        assert server.unload("add") == 200
    finally:
        server.stop()
    text = server.log_text()
    (work / "captured.log").write_text(text)
    return text.splitlines()


@pytest.mark.triton
@pytest.mark.parametrize("log_format", ["default", "ISO8601"])
def test_real_triton_logs_route_as_structured_records(tmp_path: Path, log_format: str) -> None:
    lines = _capture(tmp_path, log_format)
    assert any(len(line.encode()) > 16 * 1024 for line in lines)  # Docker would split this one
    events = run_lines(lines)
    groups = by_group(events)

    failed = [e for e in groups[f"{PREFIX}/model/broken"] if e.record["level"] == "ERROR"]
    assert len(failed) == 1
    rec = failed[0].record
    assert rec["model"] == "broken" and rec["version"] == "1" and rec["source"].startswith("model_lifecycle.cc:")
    assert rec["message"].startswith("failed to load 'broken' version 1: Internal: RuntimeError: boom")
    assert "\n\nAt:\n" in rec["message"] and "model.py(2): <module>" in rec["message"]  # full, unescaped error
    assert any(e.record is not rec and e.record.get("message") == rec["message"] for e in groups[f"{PREFIX}/errors"])
    if log_format == "ISO8601":
        assert failed[0].time == int(failed[0].time)  # whole seconds in this layout

    huge = [e for e in groups[f"{PREFIX}/model/huge"] if e.record["level"] == "ERROR"]
    assert len(huge) == 1 and "h" * 20000 in huge[0].record["message"]  # 16 KB partials re-joined

    loads = {
        (e.record["model"], e.record.get("version"))
        for e in events
        if e.record.get("message", "").startswith("loading: ")
    }
    assert {("add", "1"), ("broken", "1"), ("m@x.v2+b", "1"), ("huge", "1")} <= loads
    unloaded = "successfully unloaded 'add' version 1"
    assert any(e.record.get("message") == unloaded for e in groups[f"{PREFIX}/model/add"])
    assert any(e.record.get("model") == "m@x.v2+b" for e in groups[f"{PREFIX}/model/m.x.v2.b"])

    stub = [e for e in groups[f"{PREFIX}/server"] if "Failed to initialize Python stub" in e.record.get("message", "")]
    assert stub and all("\nAt:\n" in e.record["message"] and "_find_and_load" in e.record["message"] for e in stub)
    assert all(e.record["source"].startswith("pb_stub.cc:") and e.record["level"] == "INFO" for e in stub)
    tables = [e for e in events if e.record.get("message", "").startswith("+---")]
    assert any("| broken " in e.record["message"] and "| m@x.v2+b |" in e.record["message"] for e in tables)
    assert not [
        line
        for line in lines
        if line.startswith(("|", "+")) and not any(line in e.record.get("message", "") for e in tables)
    ]  # every table row stays in its table
    assert any(e.record.get("log") == "Error: Failed to initialize NVML" for e in groups[f"{PREFIX}/server"])
    prefixed = re.compile(r"[IWEF]\d{4} \d\d:|\d{4}-\d\d-\d\dT")
    assert not [e for e in events if prefixed.match(e.record.get("log", ""))]  # every Triton entry was parsed
    assert_nothing_lost(lines, events)
