"""Commands that speak plainly (issue 31): what a user sees in the first hour says what it means, once.

The --once reasons grouped, the start-up wait announced, byte sizes read by one rule, outputs and trace
endpoints refused at start when they cannot work, a relay open beyond loopback warned about, a dropped total
blamed on the drop, and ``| head`` without a traceback. The help texts are tests/unit/exporter/test_help.py's.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

from catalog import CatalogError, build
from exporter import config as exporter_config
from exporter.__main__ import _loopback, _trace_source
from exporter.coverage import Coverage
from exporter.pipeline import CycleResult
from exporter.runner import Runner
from exporter.series import LabelSet, model_key
from exporter.sources import ModelConfig
from exporter.summary import render_summary
from modelsync import settings as modelsync_settings
from telemetry.logs import JsonFormatter
from telemetry.settings import ConfigError, non_negative, positive, positive_int
from tests.support.helpers import CATALOG, Capture
from tests.support.paths import REPO

ROOT = REPO


# --- --once: each "not produced" reason once, with the model versions it concerns -------------------------


def test_once_says_each_reason_once_and_lists_the_models() -> None:
    """Nine models alike on Triton 24.10 printed the same two reasons nine times; now each once, with the
    versions it concerns, and nothing lost: every (version, metric, reason) of the coverage is in the text."""
    models = [f"model_{i}" for i in range(9)]
    keys = {model_key(m, "1"): m for m in models}
    labels = {k: LabelSet.of(model=m, version="1") for k, m in keys.items()}
    samples = {"nv_inference_request_success": dict.fromkeys(keys, 1.0)}
    configs = dict.fromkeys(keys, ModelConfig(decoupled=False, backend="python"))
    coverage = Coverage(CATALOG).update(configs, "2.51.0", samples, labels)
    reasons = {g.reason for c in coverage.values() for g in c.gaps}
    assert len(reasons) >= 2 and all(len(c.gaps) for c in coverage.values())
    text = render_summary(CycleResult([], [], [], 1.0, coverage=coverage))
    section = text.split("not produced, and why:\n")[1]
    for reason in reasons:
        assert section.count(reason) == 1, reason
    said: set[tuple[str, str, str]] = set()
    reason = ""
    for line in section.splitlines():
        if line.startswith("    "):
            metrics, _, versions = line.strip().rpartition(": ")
            said |= {(v, m, reason) for v in versions.split(", ") for m in metrics.split(", ")}
        elif line.startswith("  "):
            reason = line.strip()
    assert said == {(f"{c.model}/{c.version}", g.metric, g.reason) for c in coverage.values() for g in c.gaps}


# --- the start-up wait says what it waits for, and when Triton answered --------------------------------------


class FakeTime(threading.Event):
    """The runner's stop event and clock: waiting advances the clock at once (no real sleep)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def wait(self, timeout: float | None = None) -> bool:
        self.now += timeout or 0.0
        return self.is_set()

    def clock(self) -> float:
        return self.now


def waiting_runner(answers: list[bool], startup_wait: float) -> tuple[Runner, list[logging.LogRecord]]:
    time = FakeTime()
    runner = Runner(
        None,  # type: ignore[arg-type]  # the wait reads no pipeline
        None,  # type: ignore[arg-type]
        60.0,
        stop=time,
        clock=time.clock,
        triton_listens=lambda: answers.pop(0) if answers else False,
        startup_wait=startup_wait,
        triton_address="http://triton:8002/metrics",
    )
    with Capture.on("exporter.runner") as capture:
        runner._wait_for_triton()
    return runner, capture.records


def test_the_startup_wait_says_once_what_it_waits_for_then_when_triton_answered() -> None:
    _, records = waiting_runner([False, False, False, True], 300.0)
    lines = [orjson.loads(JsonFormatter().format(r)) for r in records]
    assert [line["level"] for line in lines] == ["info", "info"]  # one line waiting (not one per try), one answered
    waiting, answered = lines
    assert waiting["url"] == "http://triton:8002/metrics" and waiting["startup_wait_s"] == 300.0
    assert "waiting up to 300s for Triton to listen on http://triton:8002/metrics" in waiting["msg"]
    assert answered["msg"].startswith("Triton answered after 3s") and answered["waited_s"] == 3.0
    assert answered["url"] == "http://triton:8002/metrics"


def test_a_triton_listening_at_once_is_one_line_and_one_that_never_does_a_warning() -> None:
    _, records = waiting_runner([True], 300.0)
    assert [r.getMessage() for r in records] == ["Triton listens; first scrape"]
    _, records = waiting_runner([], 5.0)
    assert [r.levelname for r in records] == ["INFO", "WARNING"]
    assert "does not listen after 5s" in records[1].getMessage()
    assert records[1].fields["url"] == "http://triton:8002/metrics"  # type: ignore[attr-defined]


# --- byte sizes: one rule for both daemons, and the settings' own words ------------------------------------


def test_byte_sizes_take_the_same_suffixes_in_both_daemons() -> None:
    assert exporter_config.load(["--max-body-bytes", "64M"], {}).max_body_bytes == 64 * 1024**2
    assert exporter_config.load([], {"EXPORTER_MAX_BODY_BYTES": "1GiB"}).max_body_bytes == 1024**3
    assert exporter_config.load(["--max-body-bytes", "1048576"], {}).max_body_bytes == 1048576
    sync = modelsync_settings.load(["--bucket", "models", "--min-free-bytes", "64M"], {})
    assert sync.min_free_bytes == 64 * 1024**2
    errors = []
    for load, argv in (
        (exporter_config.load, ["--max-body-bytes", "64Q"]),
        (modelsync_settings.load, ["--bucket", "models", "--max-archive-bytes", "64Q"]),
    ):
        with pytest.raises(ConfigError) as info:
            load(argv, {})
        errors.append(str(info.value).split(": ", 1)[1])
    assert errors[0] == errors[1] == "must be a byte count, optionally with K, M, G or T (binary: 1G = 1024^3)"


@pytest.mark.parametrize(
    ("convert", "text", "words"),
    [
        (positive_int, "64M", "must be a positive integer"),
        (positive_int, "1.5", "must be a positive integer"),
        (positive, "soon", "must be a positive number"),
        (non_negative, "soon", "must be a number >= 0"),
    ],
)
def test_number_settings_refuse_in_their_own_words(convert, text: str, words: str) -> None:
    """Not Python's ``invalid literal for int() with base 10``."""
    with pytest.raises(ValueError) as info:
        convert(text)
    assert str(info.value) == words


# --- outputs that cannot work are refused at start ----------------------------------------------------------


def test_a_file_output_that_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    for load, base in ((exporter_config.load, []), (modelsync_settings.load, ["--bucket", "models"])):
        with pytest.raises(ConfigError, match="directory /nonexistent/dir does not exist"):
            load([*base, "--output", "file:/nonexistent/dir/x"], {})
        with pytest.raises(ConfigError, match="is a directory, not a file"):
            load([*base, "--output", f"file:{tmp_path}"], {})
    ok = exporter_config.load(["--output", f"file:{tmp_path / 'emf.log'}"], {})
    assert [str(o) for o in ok.outputs] == [f"file:{tmp_path / 'emf.log'}"]


@pytest.mark.parametrize(
    "argv", [["exporter", "--once"], ["modelsync", "--bucket", "models", "--once"]], ids=["exporter", "modelsync"]
)
def test_the_daemons_exit_2_for_a_file_output_in_a_missing_directory(argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", *argv, "--output", "file:/nonexistent/dir/x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"{argv[0]}: error: invalid setting: --output='file:/nonexistent/dir/x': directory /nonexistent/dir does "
        "not exist"
    ]


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("otlp+http://127.0.0.1:4318/v1/metrics", "a metrics endpoint: --traces-to sends spans"),
        ("otlp+https://monitoring.us-east-1.amazonaws.com/v1/traces", "signed for 'monitoring'"),
    ],
)
def test_traces_to_refuses_a_metrics_endpoint_as_output_refuses_a_traces_one(value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        exporter_config.load(["--traces-to", value], {})
    with pytest.raises(ConfigError, match="a traces endpoint: --output sends OTLP metrics"):
        exporter_config.load(["--output", "otlp+http://127.0.0.1:4318/v1/traces"], {})
    good = exporter_config.load(["--traces-to", "otlp+http://127.0.0.1:4318/v1/traces"], {})
    assert str(good.traces_to) == "otlp+http://127.0.0.1:4318/v1/traces"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("host", "warned"), [("0.0.0.0", True), ("127.0.0.1", False), ("localhost", False)])
def test_a_relay_listening_beyond_loopback_is_warned_about_once_at_start(host: str, warned: bool) -> None:
    port = free_port()
    settings = exporter_config.load(
        ["--traces-to", "otlp+http://127.0.0.1:1/v1/traces", "--traces-listen", f"{host}:{port}"], {}
    )
    assert settings.traces_to is not None
    with Capture.on("exporter.traces", logging.WARNING) as capture:
        _trace_source(settings, settings.traces_to, None, lambda: None).close()
    lines = [orjson.loads(JsonFormatter().format(r)) for r in capture.records]
    if not warned:
        assert lines == []
        return
    (line,) = lines
    assert line["level"] == "warning" and line["listen"] == f"{host}:{port}"
    assert "no authentication" in line["msg"] and "otlp+http://127.0.0.1:1/v1/traces" in line["msg"]


def test_loopback_is_this_host_only() -> None:
    assert all(_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "triton.internal"))


# --- a dropped total: the file that dropped it is to blame --------------------------------------------------


def test_dropping_a_total_blames_the_users_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "my.toml"
    path.write_text('# what we do not want\n\ndrop = [\n  "RequestFailureOther",\n  "RequestSuccess",\n]\n')
    with pytest.raises(CatalogError) as info:
        build([path])
    message = str(info.value)
    assert message.startswith(f"{path}: line 5: drop 'RequestSuccess': it is the total (breakdown_of) of "), message
    assert "CacheHits, CacheMisses (core.toml (built in))" in message and message.endswith("or keep it")
    one_line = tmp_path / "one.toml"
    one_line.write_text('drop = ["RequestSuccess"]\n')
    with pytest.raises(CatalogError, match=rf"^{one_line}: line 1: drop 'RequestSuccess'"):
        build([one_line], packs=("core",))
    # Dropping the breakdowns with it is fine.
    names = [m.name for m in CATALOG.defined if m.breakdown_of == "RequestSuccess"]
    fine = tmp_path / "fine.toml"
    fine.write_text(f"drop = {orjson.dumps(['RequestSuccess', *names]).decode()}\n")
    assert build([fine]).definition("RequestSuccess") is None


# --- `| head`: the reader leaving is normal use ----------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["exporter", "catalog"], ["render", "cost", "--models", "5"], ["exporter", "cost", "--models", "5"]]
)
def test_a_reader_that_leaves_early_is_no_traceback(argv: list[str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes: its first write finds no reader
    err = proc.stderr.read()
    assert proc.wait(60) == 0 and err == "", err
