"""Settings: flags, environment, defaults, and clear errors for bad values."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exporter.config import ENV_VARS, OPTIONS, ConfigError, Output, load


def test_defaults():
    s = load([], {})
    assert s.triton_url == "http://localhost:8000"
    assert s.metrics_url == "http://localhost:8002/metrics"
    assert s.namespace == "Triton" and s.outputs == (Output("stdout"),) and s.interval == 60
    assert s.timeout == 5.0  # min(5, interval/2)


def test_flags_win_over_environment_and_env_over_defaults():
    env = {"TRITON_URL": "http://triton:8000", "AWS_EMF_NAMESPACE": "FromEnv", "EXPORTER_INTERVAL": "10"}
    s = load(["--namespace", "FromFlag"], env)
    assert s.namespace == "FromFlag" and s.triton_url == "http://triton:8000" and s.interval == 10
    assert s.timeout == 5.0


def test_agent_endpoint_variable_is_the_fallback_output():
    tcp = Output("tcp", "127.0.0.1", 25888)
    assert load([], {"AWS_EMF_AGENT_ENDPOINT": "tcp://127.0.0.1:25888"}).outputs == (tcp,)
    env = {"AWS_EMF_AGENT_ENDPOINT": "tcp://127.0.0.1:25888", "EXPORTER_OUTPUT": "udp://[::1]:25888"}
    assert load([], env).outputs == (Output("udp", "::1", 25888),)
    assert load(["--output", "file:/tmp/x.log"], env).outputs == (Output("file", path="/tmp/x.log"),)


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--interval", "0"], {}, "--interval='0'"),
        (["--interval", "abc"], {}, "--interval='abc'"),
        ([], {"EXPORTER_INTERVAL": "-1"}, "EXPORTER_INTERVAL='-1'"),
        (["--triton-url", "localhost:8000"], {}, "http:// or https://"),
        (["--output", "tcp://nohost"], {}, "host and port"),
        (["--output", "kafka://x:1"], {}, "use stdout"),
        (["--namespace", "AWS/Triton"], {}, "AWS/"),
        (["--nvml", "maybe"], {}, "auto, on, off"),
        (["--storage-resolution", "5"], {}, "1 (high resolution) or 60"),
        (["--interval", "2", "--timeout", "3"], {}, "shorter than --interval"),
        (["--interval", "nan"], {}, "positive"),
    ],
)
def test_invalid_settings_name_the_setting(argv, env, needle):
    with pytest.raises(ConfigError) as err:
        load(argv, env)
    assert needle in str(err.value)


def test_cli_exits_2_with_one_line_for_invalid_settings():
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--output", "kafka://x:1"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "exporter: error: invalid setting: --output='kafka://x:1': use stdout, tcp://HOST:PORT, udp://HOST:PORT or "
        "file:PATH (EMF), or otlp+https://monitoring.REGION.amazonaws.com/v1/metrics or "
        "otlp+http://HOST:PORT/v1/metrics (OTLP metrics)"
    ]


def test_help_documents_every_setting_and_its_variable():
    proc = subprocess.run([sys.executable, "-m", "exporter", "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for option in OPTIONS:
        assert option.flag in text
    for env in ENV_VARS:
        assert env in text
    assert "--once" in text


def test_catalog_command_lists_every_metric(tmp_path):
    import orjson

    from catalog import build

    proc = subprocess.run([sys.executable, "-m", "exporter", "catalog", "--json"], capture_output=True, timeout=30)
    assert proc.returncode == 0
    rows = orjson.loads(proc.stdout)
    assert [r["name"] for r in rows] == [m.name for m in build().metrics]
    assert all(r["unit"] and r["dimensions"] and r["inputs"] and r["help"] for r in rows)


def test_validate_command(tmp_path):
    good = tmp_path / "emf.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "validate", str(good)], capture_output=True, text=True, timeout=30
    )
    assert (
        proc.returncode == 2
        and proc.stderr.startswith("exporter validate: error: cannot read")
        and "Traceback" not in proc.stderr
    )
    good.write_text('{"_aws":{"Timestamp":1,"CloudWatchMetrics":[]}}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "validate", str(good)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 1 and "0 valid, 1 invalid" in proc.stdout
