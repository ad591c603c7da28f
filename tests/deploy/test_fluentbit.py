"""The FireLens log pipeline (fluentbit/), interpreted from the real config files.

Log text comes from a real Triton started once per ``--log-format`` value (a
failed load, an unload, the Python stub's traceback, a model named ``m@x.v2+b``,
a 20 KB error line that Docker would split, model instances named every way
Triton names them, each failing a request; verbose in the default layout) and
from fixtures of the bare pre-24.05 form and of instance lines only a GPU or an
older release prints. See tests/support/fluentbit_sim.py for what is modelled.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from datetime import UTC, datetime
from pathlib import Path

import pytest

from demo.preview import logsinsights
from demo.preview.logsinsights import LogEvent
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
from tests.support.paths import FIXTURES, REPO

ROOT = REPO
FB = ROOT / "fluentbit"
FIXTURES = FIXTURES / "logs"
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
    assert named <= set(p.parsers) and len(named) == 12


def test_dockerfile_bakes_both_files_where_the_config_and_docs_point() -> None:
    copies = dockerfile_copies(FB / "Dockerfile")
    assert copies["/fluent-bit/etc/triton/triton.conf"] == FB / "triton.conf"
    assert copies["/fluent-bit/etc/triton/parsers.conf"] == FB / "parsers.conf"
    assert "/fluent-bit/etc/triton/triton.conf" in (ROOT / "docs" / "logs.md").read_text()
    text = (FB / "Dockerfile").read_text()
    assert "aws-for-fluent-bit" in text and dockerfile_env(FB / "Dockerfile")["TRITON_LOG_GROUP_PREFIX"] == PREFIX


def test_every_regex_compiles_under_onigmo_rules() -> None:
    parsers, mls = load_parsers(FB / "parsers.conf")
    assert len(parsers) == 12 and set(mls) == {"triton_multiline"}
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


# --- model instances ------------------------------------------------------------------------
# Lines that name an instance ("<group>_<index>"): a default name ("<model>_<g>_<i>") routes to its model's
# group with `model_instance`; any other stays in the server group with `model_instance` only. A model
# whose own name ends in "_<n>_<n>" keeps its whole name wherever a message names the model itself.

INSTANCE_GOLDEN = [
    # line, groups, model, model_instance
    (INF + '"TRITONBACKEND_ModelInstanceInitialize: fails_0_0 (CPU device 0)"', ["model/fails"], "fails", "fails_0_0"),
    (
        "E1202 14:12:22.184811 20820 pb_stub.cc:714] \"Failed to process the request(s) for model 'fails_0_0', "
        "message: RuntimeError: sample model always fails on X <= 0 (got -1)"
        '\\n\\nAt:\\n  /m/fails/1/model.py(20): execute\\n"',
        ["errors", "model/fails"],
        "fails",
        "fails_0_0",
    ),
    (
        ERR + "\"Failed to process the request(s) for model 'twice_0_1', message: x\"",
        ["errors", "model/twice"],
        "twice",
        "twice_0_1",
    ),
    # the group index counts every group, named or not: the second group of `named` is named_1
    (
        ERR + "\"Failed to process the request(s) for model 'named_1_0', message: x\"",
        ["errors", "model/named"],
        "named",
        "named_1_0",
    ),
    # a custom group name, and a config without instance_group ("<model>_<i>"): not tied to a model by the text
    (
        ERR + "\"Failed to process the request(s) for model 'cpu_pool_0', message: x\"",
        ["errors", "server"],
        None,
        "cpu_pool_0",
    ),
    (INF + '"TRITONBACKEND_ModelInstanceInitialize: nogroup_0 (CPU device 0)"', ["server"], None, "nogroup_0"),
    # a model named x_0_0: the model's own messages keep the whole name; its instance is x_0_0_0_0
    (INF + '"loading: x_0_0:1"', ["model/x_0_0"], "x_0_0", None),
    (INF + "\"successfully loaded 'x_0_0'\"", ["model/x_0_0"], "x_0_0", None),
    (ERR + "\"failed to load 'x_0_0' version 1: Internal: boom\"", ["errors", "model/x_0_0"], "x_0_0", None),
    (INF + '"TRITONBACKEND_ModelInitialize: x_0_0 (version 1)"', ["model/x_0_0"], "x_0_0", None),
    (
        INF + "\"Model 'x_0_0' version 1 is not ready: Model 'x_0_0_0_0' is not ready (user-defined check failed).\"",
        ["model/x_0_0"],
        "x_0_0",
        None,
    ),
    (
        ERR + "\"Failed to process the request(s) for model 'x_0_0_0_0', message: x\"",
        ["errors", "model/x_0_0"],
        "x_0_0",
        "x_0_0_0_0",
    ),
    (INF + '"model x_0_0, instance x_0_0_0_0, executing 1 requests"', ["model/x_0_0"], "x_0_0", "x_0_0_0_0"),
    (
        INF + "\"model 'x_0_0' instance x_0_0_0_0 is running warmup sample 'w' for iteration 1\"",
        ["model/x_0_0"],
        "x_0_0",
        "x_0_0_0_0",
    ),
    # verbose: the custom group's model is printed next to it
    (INF + '"model named, instance cpu_pool_0, executing 1 requests"', ["model/named"], "named", "cpu_pool_0"),
    # odd model names keep their group rules
    (
        INF + '"TRITONBACKEND_ModelInstanceInitialize: m@x.v2+b_0_0 (CPU device 0)"',
        ["model/m.x.v2.b"],
        "m@x.v2+b",
        "m@x.v2+b_0_0",
    ),
    (
        ERR + "\"Failed to process the request(s) for model 'it's_0_0', message: x\"",
        ["errors", "model/it.s"],
        "it's",
        "it's_0_0",
    ),
]


@pytest.mark.parametrize(("line", "groups", "model", "instance"), INSTANCE_GOLDEN)
def test_instance_lines_route_to_their_model(
    line: str, groups: list[str], model: str | None, instance: str | None
) -> None:
    events = run_lines([line])
    assert sorted(e.group for e in events) == [f"{PREFIX}/{g}" for g in groups]
    for e in events:
        assert e.record.get("model") == model
        assert e.record.get("model_instance") == instance


def test_instance_fixture_gpu_and_older_forms() -> None:
    """Forms a CPU-only Triton 2.51 does not print: GPU instances (onnxruntime's initialize line, the
    --model-load-gpu-limit refusal, a CUDA stream error), the stub's own error and a model's log of it, the
    bare pre-24.06 decoupled error (logged at INFO, traceback on raw lines), and a custom GPU group."""
    lines = (FIXTURES / "triton_instances.log").read_text().splitlines()
    events = run_lines(lines)
    got = {(e.group.removeprefix(PREFIX + "/"), e.record.get("model"), e.record.get("model_instance")) for e in events}
    assert got == {
        ("errors", "ranker_2_1", "ranker_2_1_0_0"),
        ("errors", "resnet", None),
        ("errors", "resnet", "resnet_0_0"),
        ("errors", "resnet", "resnet_0_1"),
        ("model/ranker_2_1", "ranker_2_1", None),
        ("model/ranker_2_1", "ranker_2_1", "ranker_2_1_0_0"),
        ("model/resnet", "resnet", None),
        ("model/resnet", "resnet", "resnet_0_0"),
        ("model/resnet", "resnet", "resnet_0_1"),
        ("model/stream", "stream", "stream_0_0"),
        ("server", None, "a100_pool_0"),
    }
    by_message = {e.record["message"].split(" ")[0]: e for e in events if e.group == f"{PREFIX}/model/resnet"}
    assert by_message["~BackendModelInstance:"].record["level"] == "ERROR"
    (stream,) = [e for e in events if e.group == f"{PREFIX}/model/stream"]
    assert stream.record["level"] == "INFO"
    assert stream.record["message"].endswith("stream broke\n\nAt:\n  /models/stream/1/model.py(30): execute")
    stub = [e for e in events if e.record.get("source") == "model.py:42"]
    assert [e.group for e in stub] == [f"{PREFIX}/model/ranker_2_1"]
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


INSTANCE_MODELS = {
    # model: the instance names Triton gives it (see _instance_models)
    "fails": {"fails_0_0"},
    "twice": {"twice_0_0", "twice_0_1"},
    "named": {"cpu_pool_0", "named_1_0"},
    "nogroup": {"nogroup_0"},
    "ends_1_2": {"ends_1_2_0_0"},
}


def _instance_models(repo: Path) -> None:
    """Copies of the sample model ``fails`` whose instances are named every way Triton names them: the
    default group name (``<model>_<g>``, so ``fails_0_0``), two instances of one group, a custom group
    name next to an unnamed second group (``cpu_pool_0``, ``named_1_0``), no instance_group at all (Triton
    adds one named after the model: ``nogroup_0``), and a model whose own name ends in ``_<n>_<n>`` (with a
    warm-up sample, whose verbose line names the model and the instance)."""
    warmup = (
        '\nmodel_warmup [{ name: "w" batch_size: 1'
        ' inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 1 ] input_data_file: "one" } } }]\n'
    )
    groups = {
        "twice": "instance_group [{ kind: KIND_CPU count: 2 }]",
        "named": 'instance_group [{ name: "cpu_pool" kind: KIND_CPU }, { kind: KIND_CPU }]',
        "nogroup": "",
        "ends_1_2": "instance_group [{ kind: KIND_CPU }]" + warmup,
    }
    default = "instance_group [{ kind: KIND_CPU }]"
    for name, group in groups.items():
        shutil.copytree(repo / "fails", repo / name)
        cfg = repo / name / "config.pbtxt"
        text = cfg.read_text()
        assert default in text
        cfg.write_text(text.replace('name: "fails"', f'name: "{name}"').replace(default, group))
    (repo / "ends_1_2" / "warmup").mkdir()
    (repo / "ends_1_2" / "warmup" / "one").write_bytes(struct.pack("<f", 1.0))  # fails answers X > 0


def _fail_every_instance(server: TritonServer) -> None:
    """Make every instance of the failing models log its execute error (the error names the instance)."""
    for model, instances in INSTANCE_MODELS.items():
        seen: set[str] = set()
        for _ in range(40):  # the scheduler picks the instance: ask until each one has answered
            status, body = server.infer(model, [{"name": "X", "datatype": "FP32", "shape": [1], "data": [-1.0]}])
            assert status == 500, body
            seen |= {i for i in instances if f"for model '{i}'" in str(body)}
            if seen == instances:
                break
        assert seen == instances, (model, seen)


@pytest.fixture(scope="module", params=["default", "ISO8601"])
def triton_lines(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """One real Triton per layout: a failing, an unloadable and an odd-named model, the instance models,
    a failed request on every instance, an unload. The default layout runs with --log-verbose=1."""
    log_format = request.param
    work = tmp_path_factory.mktemp(log_format)
    repo = copy_models(["add", "broken", "fails"], work / "models")
    odd = repo / "m@x.v2+b"
    shutil.copytree(repo / "add", odd)
    (odd / "config.pbtxt").write_text((odd / "config.pbtxt").read_text().replace('name: "add"', 'name: "m@x.v2+b"'))
    huge = repo / "huge"
    shutil.copytree(repo / "broken", huge)
    (huge / "config.pbtxt").write_text((huge / "config.pbtxt").read_text().replace('name: "broken"', 'name: "huge"'))
    (huge / "1" / "model.py").write_text('raise RuntimeError("h" * 20000)\n')
    _instance_models(repo)
    verbose = ["--log-verbose=1"] if log_format == "default" else []
    server = TritonServer(repo, workdir=work, log_format=log_format, extra_args=verbose)
    server.start(timeout=180)  # eleven Python stubs start on a loaded machine
    try:
        _fail_every_instance(server)
        assert server.unload("add") == 200
    finally:
        server.stop()
    text = server.log_text()
    (work / "captured.log").write_text(text)
    return text.splitlines()


@pytest.mark.triton
def test_real_triton_logs_route_as_structured_records(triton_lines: list[str]) -> None:
    lines = triton_lines
    log_format = "ISO8601" if any(re.match(r"\d{4}-\d\d-\d\dT", line) for line in lines) else "default"
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


@pytest.mark.triton
def test_real_triton_instance_lines_route_to_their_model(triton_lines: list[str]) -> None:
    """Every line a real Triton prints about an instance lands with its model (default instance names) or in
    the server group with `model_instance` (a custom group, a config without instance_group); no model group
    is made from an instance name, and ends_1_2 is never cut to `ends`."""
    events = run_lines(triton_lines)
    models = {"add", "broken", "huge", "m@x.v2+b", *INSTANCE_MODELS}
    assert {e.record["model"] for e in events if "model" in e.record} <= models
    assert {e.group for e in events if "/model/" in e.group} == {
        f"{PREFIX}/model/{g}" for g in ("add", "broken", "huge", "m.x.v2.b", *INSTANCE_MODELS)
    }
    custom = {"cpu_pool_0", "nogroup_0"}
    instances = {i: m for m, names in INSTANCE_MODELS.items() for i in names}
    seen: dict[str, set[tuple[str, str]]] = {}
    for e in events:
        if "model_instance" not in e.record:
            continue
        inst, rec = e.record["model_instance"], e.record
        seen.setdefault(inst, set()).add((e.group.removeprefix(PREFIX + "/"), rec["message"].split(" ")[0]))
        verbose_pair = rec["message"].startswith("model ")  # the verbose lines that print the model as well
        if inst in custom and not verbose_pair:
            assert "model" not in rec and e.group in (f"{PREFIX}/server", f"{PREFIX}/errors"), rec
        elif inst in instances:
            assert rec["model"] == instances[inst], rec
            assert e.group in (f"{PREFIX}/model/{instances[inst]}", f"{PREFIX}/errors"), rec
    for inst, model in instances.items():
        home = "server" if inst in custom else f"model/{model}"
        assert {(home, "TRITONBACKEND_ModelInstanceInitialize:"), (home, "Failed"), ("errors", "Failed")} <= seen[inst]
    errors = [e for e in events if e.group == f"{PREFIX}/errors" and e.record["message"].startswith("Failed to")]
    assert {(e.record.get("model"), e.record["model_instance"]) for e in errors} == {
        (None if i in custom else m, i) for i, m in instances.items()
    }
    ends = [e for e in events if e.group == f"{PREFIX}/model/ends_1_2"]
    assert {e.record["model"] for e in ends} == {"ends_1_2"}
    assert {"loading: ends_1_2:1", "successfully loaded 'ends_1_2'"} <= {e.record["message"] for e in ends}
    if any("executing 1 requests" in line for line in triton_lines):  # the default layout runs verbose
        pairs = {
            (e.record["model"], e.record["model_instance"])
            for e in events
            if "model_instance" in e.record and e.record["message"].startswith("model ")
        }
        assert {("named", "cpu_pool_0"), ("nogroup", "nogroup_0"), ("ends_1_2", "ends_1_2_0_0")} <= pairs


@pytest.mark.triton
def test_the_dashboards_error_tables_read_the_pipelines_fields(triton_lines: list[str]) -> None:
    """The log widgets of dashboards/triton.json, run (demo/preview's Logs Insights) over the errors group the
    pipeline makes of a real Triton's lines: the execute errors show the model and the instance, and the
    failed-loads table counts only real loads of real models."""
    events = [LogEvent(e.time, e.message, e.stream) for e in run_lines(triton_lines) if e.group == f"{PREFIX}/errors"]
    body = json.loads((ROOT / "dashboards" / "triton.json").read_text())
    query = {w["properties"]["title"]: w["properties"]["query"] for w in body["widgets"] if w["type"] == "log"}
    recent = logsinsights.run(query["Recent errors and warnings (errors group)"], events)
    assert recent.columns[:4] == ["@timestamp", "level", "model", "model_instance"]
    shown = {(r.get("model"), r.get("model_instance")) for r in recent.rows if r["message"].startswith("Failed to")}
    assert ("fails", "fails_0_0") in shown and (None, "cpu_pool_0") in shown
    assert not {m for m, _ in shown} & {i for names in INSTANCE_MODELS.values() for i in names}
    loads = logsinsights.run(query["Failed model loads (errors group)"], events)
    assert {r["model"] for r in loads.rows} == {"broken", "huge"}
    # docs/logs.md's query: failed requests per model and instance
    docs = (ROOT / "docs" / "logs.md").read_text()
    per_instance = docs.split("failed requests per model and instance")[1].split("```")[1].strip()
    counted = logsinsights.run(per_instance, events)
    assert {(r.get("model"), r["model_instance"]) for r in counted.rows} == {
        (None if i in ("cpu_pool_0", "nogroup_0") else m, i) for m, names in INSTANCE_MODELS.items() for i in names
    }
