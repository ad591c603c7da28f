"""The catalog as data: the built-in packs, user files, overrides, drops, selection, and every refusal."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from catalog import BUILTIN_PACKS, Catalog, CatalogError, Kind, Scope, build, modelsync_catalog, parse_selection
from catalog.load import DIMENSION_KEYS, FAMILY_KEYS, METRIC_KEYS, read
from render.docsgen import DIMENSION_KEYS_DOC, FAMILY_KEYS_DOC, METRIC_KEYS_DOC, example_catalog
from tests.support.helpers import CATALOG
from tests.support.paths import REPO

ROOT = REPO

CUSTOM = """
[families]
"app:queue_depth" = { type = "gauge", labels = ["model", "version", "queue"] }
"app:jobs_total" = { type = "counter", labels = ["model", "version"] }

[[metric]]
name = "AppQueueDepthHigh"
scope = "model"
unit = "Count"
kind = "gauge"
inputs = [{ family = "app:queue_depth", split = "queue", select = "high" }]
help = "Jobs waiting in the high-priority queue."
"""


def write(tmp_path: Path, text: str, name: str = "user.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_builtin_packs_hold_the_core_and_llm_metrics() -> None:
    names = [m.name for m in CATALOG.metrics]
    assert len(names) == len(set(names))
    assert {
        "RequestSuccess",
        "GpuUtilization",
        "ExporterHeartbeat",
        "TimeToFirstToken",
        "KvCacheUtilization",
        "GenerationTokensPerSecond",
        "InterTokenLatency",
        "RequestsWaiting",
    } <= set(names)
    core = build(packs=("core",))
    assert "KvCacheUtilization" not in [m.name for m in core.metrics]
    # The LLM pack replaces the core time to first token: vLLM's histogram first, Triton's second.
    assert [i.family for i in core.get("TimeToFirstToken").inputs] == ["nv_inference_first_response_histogram_ms"]
    ttft = CATALOG.get("TimeToFirstToken")
    assert [i.family for i in ttft.inputs] == [
        "vllm:time_to_first_token_seconds",
        "nv_inference_first_response_histogram_ms",
    ]
    assert ttft.inputs[0].scale == 1000.0 and ttft.kind is Kind.DISTRIBUTION and ttft.origin.startswith("llm.toml")
    assert CATALOG.files == tuple(f"{p}.toml (built in)" for p in BUILTIN_PACKS)


def test_state_and_self_metrics_are_exactly_what_the_pipeline_provides() -> None:
    from exporter.selfmetrics import Bookkeeping, SourceStatus, exporter_values, index_values
    from exporter.sources import SourceKind, VersionState

    given = exporter_values(Bookkeeping(1.0, 2, 3, 4, 5, 6, 7), [SourceStatus("s", SourceKind.TRITON, True, 1.0)])
    given |= index_values(
        [VersionState("a", "1", "READY"), VersionState("b", "1", "UNAVAILABLE", "x")],
        {"k": VersionState("a", "1", "READY")},
    )
    # The names are written twice by nature: where they are defined (core.toml) and where they are computed.
    assert set(given) == {m.name for m in CATALOG.defined if m.kind in (Kind.STATE, Kind.SELF)}


@pytest.mark.parametrize("kind", ["self", "state"])
def test_a_user_file_may_override_the_exporters_own_metrics_but_not_invent_one(tmp_path: Path, kind: str) -> None:
    """Nothing would compute an invented one: it would be defined, documented, drawn and never emitted."""
    invented = tmp_path / "invented.toml"
    invented.write_text(f'[[metric]]\nname = "MyOwn"\nscope = "task"\nunit = "Count"\nkind = "{kind}"\nhelp = "h"\n')
    with pytest.raises(CatalogError, match=f"kind {kind} is only for the exporter's own metrics"):
        build([invented])
    existing = "TritonUp" if kind == "self" else "ModelsReady"
    overriding = tmp_path / "override.toml"
    overriding.write_text(
        f'[[metric]]\nname = "{existing}"\nscope = "task"\nunit = "Count"\nkind = "{kind}"\nhelp = "mine"\n'
        "override = true\n"
    )
    assert build([overriding]).get(existing).help == "mine"


def test_wanted_and_counter_samples_follow_the_catalog() -> None:
    wanted = CATALOG.wanted_samples()
    assert "vllm:time_to_first_token_seconds_bucket" in wanted and "vllm:time_to_first_token_seconds_sum" in wanted
    assert "nv_llm_output_token_len_sum" in wanted and "nv_trt_llm_kv_cache_block_metrics" in wanted
    assert not any(s.startswith("nvml_") for s in wanted)  # NVML's series come from its own source
    assert "nvml_gpu_utilization_percent" in CATALOG.wanted_samples("nvml")
    counters = CATALOG.counter_samples()
    assert "vllm:time_to_first_token_seconds_bucket" in counters and "nv_inference_request_success" in counters
    assert "nv_trt_llm_kv_cache_block_metrics" not in counters and "nv_inference_pending_request_count" not in counters
    # vllm:request_params_n is declared but no metric reads it: the reader skips it.
    assert not any(s.startswith("vllm:request_params_n") for s in wanted)


def test_a_user_file_adds_a_metric_for_a_custom_family(tmp_path: Path) -> None:
    catalog = build([write(tmp_path, CUSTOM)])
    m = catalog.get("AppQueueDepthHigh")
    assert m is not None and m.scope is Scope.MODEL and m.inputs[0].where == ("queue", "high")
    assert m.origin == str(tmp_path / "user.toml") and m.source == "triton"
    assert "app:queue_depth" in catalog.wanted_samples()
    assert len(catalog.metrics) == len(CATALOG.metrics) + 1


def test_the_shipped_example_file_loads_and_is_the_documented_one() -> None:
    path = ROOT / "catalog" / "example.toml"
    catalog = build([path])
    assert {"PromptCacheHits", "PromptCacheHitsPerSecond", "ToolCallTime"} <= {m.name for m in catalog.metrics}
    assert catalog.get("ToolCallTime").kind is Kind.DISTRIBUTION
    assert example_catalog() == path.read_text()
    assert example_catalog() in (ROOT / "docs" / "metrics.md").read_text()


def test_override_replaces_and_drop_removes(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        drop = ["RequestFailureCanceled", "GpuLost"]

        [[metric]]
        name = "ModelLoadDuration"
        override = true
        scope = "model"
        unit = "Seconds"
        kind = "gauge"
        combine = "sum"
        inputs = ["nv_model_load_duration_secs"]
        help = "Every GPU instance's load time, summed."
    """,
    )
    catalog = build([path])
    names = [m.name for m in catalog.metrics]
    assert "RequestFailureCanceled" not in names and "GpuLost" not in names
    assert catalog.get("ModelLoadDuration").combine.value == "sum"
    before = [m.name for m in CATALOG.metrics if m.name not in ("RequestFailureCanceled", "GpuLost")]
    assert names == before  # replaced in place: the order (and so the EMF directives) stays


# --- refusals: one line naming the file, the entry and the problem -----------------------------

BASE = """
[[metric]]
name = "X"
scope = "model"
unit = "Count"
kind = "delta"
inputs = ["nv_inference_count"]
help = "x"
"""


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"kind": '"sum_of_squares"'}, "unknown kind 'sum_of_squares'"),
        ({"unit": '"Watts"'}, "unit 'Watts' is not a CloudWatch unit"),
        ({"name": '"RequestSuccess"'}, "duplicate EMF name (already defined in core.toml (built in))"),
        ({"kind": '"ratio"'}, "a ratio needs denominators"),
        ({"name": '"' + "N" * 256 + '"'}, "name is 256 characters; CloudWatch allows 255"),
        ({"name": '"model"'}, "name must start with an upper-case letter"),
        (
            {"inputs": '[{ family = "nv_inference_count", split = "reason", select = "BACKEND" }]'},
            "family 'nv_inference_count' has no label 'reason' to split on",
        ),
        ({"inputs": '["nv_no_such_family"]'}, "unknown family 'nv_no_such_family'"),
        ({"inputs": '["nv_inference_pending_request_count"]'}, "kind delta cannot read gauge family"),
        ({"inputs": '["vllm:time_to_first_token_seconds"]'}, 'use sample = "sum" or "count"'),
        ({"scope": '"gpu"'}, "scope gpu needs a family labelled gpu_uuid"),
        ({"scope": '"task"'}, "scope task cannot read 'nv_inference_count'"),
        ({"scope": '"pod"'}, "unknown scope 'pod'"),
        ({"rollups": '[["gpu"]]'}, "must be a subset of the scope's dimensions"),
        ({"colour": '"red"'}, "unknown key(s) ['colour']"),
        ({"kind": '"percentile"', "inputs": '["vllm:time_to_first_token_seconds"]'}, "a percentile needs quantile"),
        ({"kind": '"self"'}, "kind self takes no inputs"),
        ({"breakdown_of": '"NoSuchTotal"'}, "breakdown_of 'NoSuchTotal': no such metric"),
        (
            {"combine": '"max"', "name": '"ExecutionsMax"', "inputs": '["nv_inference_exec_count"]'},
            "combines 'nv_inference_exec_count' by max but 'ExecutionCount' combines it by sum",
        ),
        ({"help": '""'}, "help must be a non-empty string"),
    ],
)
def test_invalid_user_files_are_refused_naming_file_entry_and_problem(
    tmp_path: Path, change: dict[str, str], problem: str
) -> None:
    fields = {
        "name": '"X"',
        "scope": '"model"',
        "unit": '"Count"',
        "kind": '"delta"',
        "inputs": '["nv_inference_count"]',
        "help": '"x"',
        **change,
    }
    path = write(tmp_path, "[[metric]]\n" + "\n".join(f"{k} = {v}" for k, v in fields.items()) + "\n")
    with pytest.raises(CatalogError) as err:
        build([path])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: metric "), message
    assert problem in message, message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[metric]\nname = 1", "not valid TOML"),
        ("colour = 1", "unknown top-level key(s) ['colour']"),
        ('drop = ["NoSuchMetric"]', "drop: no metric named 'NoSuchMetric'"),
        ('[families]\n"bad name" = { type = "gauge" }', "family 'bad name': not a Prometheus metric name"),
        ('[families]\nx = { type = "enum" }', "type must be one of"),
        ('[families]\nx = { type = "histogram", labels = ["le"] }', "a histogram carries 'le' by itself"),
        (
            '[families]\nnv_inference_count = { type = "gauge", labels = ["model", "version"] }',
            "declared differently in an earlier file",
        ),
        (BASE.replace('name = "X"', 'name = "X"\noverride = true'), "override = true, but no earlier file"),
        (BASE + BASE, "duplicate EMF name in this file"),
    ],
)
def test_invalid_file_shapes_are_refused(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(CatalogError) as err:
        build([path])
    assert str(err.value).startswith(f"{path}: ") and problem in str(err.value) and "\n" not in str(err.value)


def test_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match=r"cannot read catalog file"):
        build([tmp_path / "missing.toml"])


def test_bad_catalog_stops_the_sidecar_at_start_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, BASE.replace('unit = "Count"', 'unit = "Watts"'))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            "--once",
            "--catalog",
            str(path),
            "--triton-url",
            "http://127.0.0.1:9",
            "--triton-metrics-url",
            "http://127.0.0.1:9/metrics",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"exporter: error: invalid catalog: {path}: metric 'X': unit 'Watts'")
    # the variable works the same way
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"EXPORTER_CATALOG": str(path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2 and "unit 'Watts'" in proc.stderr


# --- selection -----------------------------------------------------------------------------------


def test_selection_patterns_apply_left_to_right() -> None:
    names = ["RequestSuccess", "RequestFailure", "RequestFailureBackend", "ComputeLatencyAvg", "GpuUtilization"]
    assert parse_selection("-RequestFailure*,-Compute*", names) == ["RequestSuccess", "GpuUtilization"]
    assert parse_selection("Gpu*,RequestSuccess", names) == ["RequestSuccess", "GpuUtilization"]
    assert parse_selection("Request*,-RequestFailure?*", names) == ["RequestSuccess", "RequestFailure"]
    assert parse_selection("-RequestFailure*,RequestFailure", names) == [
        "RequestSuccess",
        "RequestFailure",
        "ComputeLatencyAvg",
        "GpuUtilization",
    ]
    with pytest.raises(CatalogError, match="pattern 'Gpus\\*' matches no metric"):
        parse_selection("-Gpus*", names)
    with pytest.raises(CatalogError, match="empty pattern"):
        parse_selection("Gpu*,,RequestSuccess", names)


def test_selection_keeps_breakdown_totals_computed_but_not_emitted() -> None:
    catalog = CATALOG.select("-RequestFailure")
    assert catalog.get("RequestFailure") is None and catalog.definition("RequestFailure") is not None
    assert catalog.emits("RequestFailureBackend")
    assert "RequestFailure" in [m.name for m in catalog.computed]  # the reasons' zeros still need their total
    assert len(catalog.defined) == len(CATALOG.defined)


def test_catalog_command_honours_catalog_and_selection(tmp_path: Path) -> None:
    path = write(tmp_path, CUSTOM)
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "catalog", "--catalog", str(path), "--metrics", "App*,RequestSuccess"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{path}: adds 1, replaces 0 and drops 0 of the {len(CATALOG.defined)} built-in metrics"
    # what the file adds, under a header row; the selection's count below
    assert lines[1].startswith("listed: the selected metrics these files add or replace")
    assert lines[2].split() == ["metric", "unit", "kind", "dimensions", "computed", "from"]
    assert [ln.split()[0] for ln in lines[3:-1]] == ["AppQueueDepthHigh"]
    assert lines[-1] == f"1 listed; 2 of {len(CATALOG.defined) + 1} metrics selected"
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "catalog", "--metrics", "Nope*"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "matches no metric" in proc.stderr and proc.stderr.count("\n") == 1


def catalog_command(*argv: str) -> list[str]:
    from exporter.__main__ import catalog_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert catalog_main(list(argv)) == 0
    return out.getvalue().splitlines()


def test_catalog_with_a_file_lists_what_it_adds_replaces_and_drops(tmp_path: Path) -> None:
    """Documented as "checks it, lists what it adds": it listed every metric of the catalog, with no header."""
    example = ROOT / "catalog" / "example.toml"
    lines = catalog_command("--catalog", str(example))
    added = [m.name for m in build([example]).metrics if m.origin == str(example)]
    assert len(added) == 3
    assert lines[0] == f"{example}: adds 3, replaces 0 and drops 0 of the {len(CATALOG.defined)} built-in metrics"
    header = lines.index(next(ln for ln in lines if ln.startswith("metric ")))
    assert lines[header].split()[:4] == ["metric", "unit", "kind", "dimensions"]
    assert [ln.split()[0] for ln in lines[header + 1 : -1]] == added
    assert lines[-1] == f"3 listed; {len(CATALOG.defined) + 3} of {len(CATALOG.defined) + 3} metrics selected"
    # a file that replaces and drops says so; --all lists every selected metric
    replace = CUSTOM.replace('name = "AppQueueDepthHigh"', 'name = "PendingRequests"\noverride = true')
    changes = write(tmp_path, 'drop = ["RequestFailureOther"]\n' + replace)
    lines = catalog_command("--catalog", str(changes))
    assert lines[0] == f"{changes}: adds 0, replaces 1 and drops 1 of the {len(CATALOG.defined)} built-in metrics"
    assert lines[1:3] == ["replaces: PendingRequests", "drops: RequestFailureOther"]
    assert [ln.split()[0] for ln in lines[4:-1]] == ["metric", "PendingRequests"]
    everything = catalog_command("--catalog", str(changes), "--all")
    assert len(everything) == 3 + 1 + len(CATALOG.defined) - 1 + 1  # header lines, header row, metrics, count
    # without a file: every selected metric, under the header row
    plain = catalog_command()
    assert plain[0].split()[:2] == ["metric", "unit"] and len(plain) == len(CATALOG.defined) + 2


def test_docs_describe_every_schema_key() -> None:
    assert {k for k, _ in FAMILY_KEYS_DOC} == FAMILY_KEYS
    assert {k for k, _ in DIMENSION_KEYS_DOC} == DIMENSION_KEYS
    assert {k for k, _ in METRIC_KEYS_DOC} == METRIC_KEYS


def test_an_empty_catalog_is_a_catalog() -> None:
    empty = Catalog((), {})
    assert len(empty.metrics) == 0 and empty.wanted_samples() == frozenset() and empty.get("X") is None


def test_an_excluding_selection_works_as_a_separate_argument() -> None:
    """``--metrics -A*`` (not only ``--metrics=-A*``): argparse alone would take ``-A*`` for an option."""
    from exporter.config import load

    settings = load(["--metrics", "-RequestFailure*,-Compute*", "--once"], {})
    assert settings.metrics == "-RequestFailure*,-Compute*" and settings.once
    assert load(["--metrics=-Gpu*"], {}).metrics == "-Gpu*"
    assert load([], {"EXPORTER_METRICS": "-Gpu*"}).metrics == "-Gpu*"


def test_cost_prices_the_selection(capsys: pytest.CaptureFixture[str]) -> None:
    from render import cost

    def metrics(*argv: str) -> int:
        assert cost.main(["--models", "10", "--gpus", "0", *argv]) == 0
        out = capsys.readouterr().out
        return int(
            next(line for line in out.splitlines() if line.startswith("custom metrics:")).split()[2].replace(",", "")
        )

    everything = metrics()
    fewer = metrics("--metrics", "-Compute*")
    assert everything - fewer == 10 * 4  # four Compute*LatencyAvg metrics per model version, no rollups
    assert metrics("--breakdown-zeros", "emit") - everything == 10 * 4  # the four failure reasons
    assert cost.main(["--models", "10", "--metrics", "-Nope*"]) == 2


@pytest.mark.parametrize("command", [["catalog"], ["cost", "--models", "2"], ["render", "--check"], []])
def test_a_bad_llm_metrics_value_is_refused_by_every_command(command: list[str]) -> None:
    """EXPORTER_LLM_METRICS=yes stopped the daemon (exit 2) while `catalog`, `cost` and `render` read it as
    "off" and said "66 of 66 metrics selected": the LLM pack gone without a word."""
    env = {**os.environ, "EXPORTER_LLM_METRICS": "yes"}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", *command, *(["--once"] if not command else [])],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2, (proc.stdout[-500:], proc.stderr[-500:])
    assert "EXPORTER_LLM_METRICS: invalid choice: 'yes' (choose from on, off)" in proc.stderr


# --- the model-sync pack: its own scope, kind and declared result values --------------------------

SYNC = """
[dimensions.result]
help = "outcome"
values = { ok = "fine", broken = "not fine" }

[[metric]]
name = "Attempts"
scope = "modelsync"
event = "attempt"
unit = "Count"
kind = "supplied"
rollups = ROLLUPS
help = "attempts"
"""


def read_sync(text: str) -> Catalog:
    loaded = read([("sync.toml", text)])
    return Catalog(list(loaded.metrics.values()), loaded.families, dimensions=loaded.dimensions)


def test_the_modelsync_pack_loads_apart_from_the_exporters_catalog() -> None:
    pack = modelsync_catalog()
    assert pack.metrics and all(m.scope is Scope.MODELSYNC and m.kind is Kind.SUPPLIED for m in pack.metrics)
    events = ("attempt", "model", "host", "rollout", "start")
    assert all(m.source == "modelsync" and m.event in events for m in pack.metrics)
    assert pack.dimensions["result"].names()[0] == "ok"
    assert not {m.name for m in pack.metrics} & {m.name for m in build().defined}  # the exporter emits none
    with pytest.raises(CatalogError, match="read on its own"):
        build(packs=("core", "modelsync"))


def test_modelsync_rollups_use_the_event_keys_only() -> None:
    cat = read_sync(SYNC.replace("ROLLUPS", '[["result"], ["model", "result"]]'))
    assert cat.defined[0].dimension_sets == ((), ("result",), ("model", "result"))
    with pytest.raises(CatalogError, match=r"rollup \['version'\] must be a subset of the scope's dimensions"):
        read_sync(SYNC.replace("ROLLUPS", '[["version"]]'))
    with pytest.raises(CatalogError, match="declare the values of 'result'"):
        read_sync("[[metric]]" + SYNC.replace("ROLLUPS", '[["result"]]').split("[[metric]]")[1])  # no [dimensions]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (('kind = "supplied"', 'kind = "self"'), "scope modelsync and kind supplied go together"),
        (('event = "attempt"', 'event = "upload"'), "scope modelsync needs event"),
        (('event = "attempt"', ""), "scope modelsync needs event"),
        (('kind = "supplied"', 'kind = "supplied"\ninputs = ["x"]'), "kind supplied takes no inputs"),
        (('values = { ok = "fine", broken = "not fine" }', "values = {}"), "values must declare at least one"),
        (('values = { ok = "fine", broken = "not fine" }', 'values = { ok = "" }'), "its meaning must be"),
    ],
)
def test_modelsync_pack_refusals(change: tuple[str, str], problem: str) -> None:
    with pytest.raises(CatalogError, match=problem):
        read_sync(SYNC.replace("ROLLUPS", "[]").replace(*change))


def test_a_user_file_cannot_add_modelsync_metrics_to_the_exporter(tmp_path: Path) -> None:
    path = write(tmp_path, SYNC.replace("ROLLUPS", "[]"))
    with pytest.raises(CatalogError, match="scope modelsync is only for the model-sync pack"):
        build([path])
    with pytest.raises(CatalogError, match="event is only for scope modelsync"):
        build([write(tmp_path, BASE + 'event = "attempt"\n', "b.toml")])


def test_since_says_which_releases_publish_a_family_and_the_docs_list_it(tmp_path: Path) -> None:
    fams = CATALOG.families
    assert (
        fams["nv_trt_llm_request_metrics"].since == "TensorRT-LLM backend v0.18 (Triton 25.04) for request_type waiting"
    )
    assert fams["nv_llm_output_token_len"].since == "TensorRT-LLM backend v0.16"
    assert fams["vllm:e2e_request_latency_seconds"].since == "vLLM backend r24.09"
    assert fams["nv_inference_first_response_histogram_ms"].since.startswith("Triton 24.11")
    assert fams["nv_inference_request_success"].since == ""  # every release
    bad = '[families]\n"app:x_total" = { type = "counter", labels = ["model", "version"], since = 24 }\n'
    with pytest.raises(CatalogError, match="family 'app:x_total': since must be a string"):
        read([("bad.toml", bad)])
    docs = (REPO / "docs" / "metrics.md").read_text()
    table = docs.split("## Versions\n", 1)[1].split("\n## ", 1)[0]
    assert "| `nv_llm_input_token_len` | TensorRT-LLM backend v0.16 | `PromptTokens`," in table
    assert "`RequestsWaiting` (request_type=waiting)" in table and "`KvCacheUtilization` (kv_cache_block_type" in table


def test_cumulative_reads_a_gauge_that_only_grows_as_a_counter() -> None:
    steps = CATALOG.get("EngineIterationsPerSecond")
    assert steps is not None and steps.kind is Kind.RATE
    assert "nv_trt_llm_general_metrics" in CATALOG.counter_samples()
    head = '[[metric]]\nname = "Foo"\nscope = "model"\nunit = "Count"\nhelp = "h"\n'
    for kind, family, problem in (
        ("rate", "vllm:prompt_tokens_total", "cumulative is for a gauge family that only grows"),
        ("gauge", "nv_trt_llm_general_metrics", "cumulative is for kinds delta, rate and ratio"),
    ):
        text = head + f'kind = "{kind}"\ninputs = [{{ family = "{family}", cumulative = true }}]\n'
        with pytest.raises(CatalogError, match=problem):
            read([*builtin_pairs(), ("user.toml", text)], builtin=2)
    text = head + 'kind = "rate"\ninputs = ["nv_trt_llm_general_metrics"]\n'
    with pytest.raises(CatalogError, match="kind rate cannot read gauge family"):
        read([*builtin_pairs(), ("user.toml", text)], builtin=2)


def builtin_pairs() -> list[tuple[str, str]]:
    from catalog import builtin_files

    return builtin_files()


def test_docs_llm_says_how_to_turn_each_backends_metrics_on() -> None:
    text = (REPO / "docs" / "llm.md").read_text()
    for needed in (
        'key: "REPORT_CUSTOM_METRICS" value { string_value: "true" }',
        "histogram_latencies=true",
        'metric_identifier { family: "nv_inference_first_response_histogram_ms" }',
        "histogram_options { buckets: [",
        "counter_latencies=false",
        "LLM-API (PyTorch) backend publishes none",
    ):
        assert needed in text, needed
    ttft = CATALOG.get("TimeToFirstToken")
    assert ttft is not None and "docs/llm.md" in ttft.help
