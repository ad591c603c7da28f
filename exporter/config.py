"""Settings: read once at the entry point from flags and environment, validated, frozen.

Every setting has a flag and an environment variable (for the ECS task
definition); a flag wins over the variable, the variable over the default.
``python -m exporter --help`` prints the table below.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from catalog.cli import attach_selection
from telemetry.sinks import Output, parse_output


class ConfigError(ValueError):
    """A setting is invalid; the message names the flag, the variable and the value."""


@dataclass(frozen=True)
class Settings:
    triton_url: str = "http://localhost:8000"
    metrics_url: str = "http://localhost:8002/metrics"
    namespace: str = "Triton"
    output: Output = Output("stdout")  # noqa: RUF009 - a frozen dataclass
    interval: float = 60.0
    timeout: float = 5.0
    connect_timeout: float = 1.0
    max_body_bytes: int = 64 * 1024 * 1024
    max_models: int = 500
    buffer_events: int = 20_000
    nvml: str = "auto"
    storage_resolution: int = 60
    ecs_metadata_url: str = ""
    log_level: str = ""  # empty: info for the loop, error for --once (its table already says what is down)
    catalog_files: tuple[str, ...] = ()  # user catalog files, read after the built-in packs
    metrics: str = ""  # --metrics selection over EMF names; empty: every metric of the catalog
    llm_metrics: str = "on"  # the built-in LLM pack
    breakdown_zeros: str = "omit"  # omit: a breakdown's zero is left out while its total is zero
    startup_wait: float = 300.0  # seconds the first scrape waits for Triton to listen (0: at once)
    once: bool = False


def http_url(text: str) -> str:
    """An http(s) URL with a host and a valid port; a bare trailing ``/`` dropped (a base URL), a path kept
    as given. Shared with modelsync's settings."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    return text.rstrip("/") if parts.path in ("", "/") else text


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def check(text: str) -> float:
        value = kind(text)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError("must be a positive number")
        return value

    return check


def non_negative(text: str) -> float:
    """A number >= 0 (seconds); shared with modelsync's settings."""
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError("must be a number >= 0")
    return value


def choice(*choices: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        if text.lower() not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return text.lower()

    return check


def _resolution(text: str) -> int:
    if text not in ("1", "60"):
        raise ValueError("must be 1 (high resolution) or 60")
    return int(text)


def _paths(text: str) -> tuple[str, ...]:
    paths = tuple(p for p in text.split(os.pathsep) if p.strip())
    if not paths:
        raise ValueError("needs a catalog file path")
    return paths


def _selection(text: str) -> str:
    if not text.strip():
        raise ValueError("needs comma-separated patterns, e.g. -RequestFailure*,-Compute*")
    return text.strip()


def valid_namespace(text: str) -> str:
    if not 1 <= len(text) <= 255 or not text.isascii() or text.startswith("AWS/"):
        raise ValueError("must be 1-255 ASCII characters and not start with AWS/")
    return text


# (field, flag, environment variables in priority order, parser, help)
OPTIONS: list[tuple[str, str, tuple[str, ...], Callable[[str], object], str]] = [
    ("triton_url", "--triton-url", ("TRITON_URL",), http_url, "Triton HTTP API (repository index)"),
    ("metrics_url", "--metrics-url", ("TRITON_METRICS_URL",), http_url, "Triton Prometheus endpoint"),
    ("namespace", "--namespace", ("AWS_EMF_NAMESPACE",), valid_namespace, "CloudWatch namespace"),
    (
        "output",
        "--output",
        ("EXPORTER_OUTPUT", "AWS_EMF_AGENT_ENDPOINT"),
        parse_output,
        "where EMF goes: stdout, tcp://HOST:PORT (CloudWatch agent or Fluent Bit tcp input), "
        "udp://HOST:PORT, file:PATH",
    ),
    ("interval", "--interval", ("EXPORTER_INTERVAL",), _positive(float), "seconds between scrapes (fixed rate)"),
    (
        "timeout",
        "--timeout",
        ("EXPORTER_TIMEOUT",),
        _positive(float),
        "overall deadline per source per cycle, seconds (default: min(5, interval/2))",
    ),
    (
        "connect_timeout",
        "--connect-timeout",
        ("EXPORTER_CONNECT_TIMEOUT",),
        _positive(float),
        "TCP connect timeout, seconds",
    ),
    (
        "max_body_bytes",
        "--max-body-bytes",
        ("EXPORTER_MAX_BODY_BYTES",),
        _positive(int),
        "largest /metrics or index body accepted; larger ones are refused while streaming",
    ),
    (
        "max_models",
        "--max-models",
        ("EXPORTER_MAX_MODELS",),
        _positive(int),
        "cardinality cap: model versions emitted per cycle (bounds the CloudWatch bill)",
    ),
    (
        "buffer_events",
        "--buffer-events",
        ("EXPORTER_BUFFER_EVENTS",),
        _positive(int),
        "tcp/udp sink: events held while the agent is away; oldest dropped (and counted) beyond",
    ),
    (
        "nvml",
        "--nvml",
        ("EXPORTER_NVML",),
        choice("auto", "on", "off"),
        "GPU telemetry from NVML: auto (use if present; if not, report it down and retry every 300 s), "
        "on (required: exit 2 at start when NVML cannot initialise), off",
    ),
    (
        "startup_wait",
        "--startup-wait",
        ("EXPORTER_STARTUP_WAIT",),
        non_negative,
        "seconds the first scrape waits for Triton's metrics port to accept connections (Triton opens its ports "
        "only once its models are loaded; started with it, the sidecar would otherwise report it down); after "
        "that, Triton down is reported as usual; 0: scrape at once",
    ),
    (
        "storage_resolution",
        "--storage-resolution",
        ("EXPORTER_STORAGE_RESOLUTION",),
        _resolution,
        "60 (standard) or 1 (high-resolution metrics, billed higher)",
    ),
    (
        "ecs_metadata_url",
        "--ecs-metadata-url",
        ("ECS_CONTAINER_METADATA_URI_V4",),
        http_url,
        "ECS task metadata endpoint (set by ECS); task identity goes into properties",
    ),
    (
        "log_level",
        "--log-level",
        ("EXPORTER_LOG_LEVEL",),
        choice("debug", "info", "warning", "error"),
        "level of the exporter's own JSON log lines on stderr (default: info; error with --once)",
    ),
    (
        "catalog_files",
        "--catalog",
        ("EXPORTER_CATALOG",),
        _paths,
        "a catalog file (TOML, docs/metrics.md) adding, replacing or dropping metrics; repeatable; the variable "
        f"takes paths separated by {os.pathsep!r}",
    ),
    (
        "metrics",
        "--metrics",
        ("EXPORTER_METRICS",),
        _selection,
        "which metrics to emit: comma-separated globs over EMF names, '-' excludes, left to right "
        "(e.g. -RequestFailure*,-Compute*)",
    ),
    (
        "llm_metrics",
        "--llm-metrics",
        ("EXPORTER_LLM_METRICS",),
        choice("on", "off"),
        "the built-in LLM pack (vLLM, TensorRT-LLM families); costs nothing where they are absent",
    ),
    (
        "breakdown_zeros",
        "--breakdown-zeros",
        ("EXPORTER_BREAKDOWN_ZEROS",),
        choice("omit", "emit"),
        "omit: leave out a breakdown's zeros (failure reasons, an idle LLM's tokens) while its total is zero; "
        "CloudWatch bills a metric for every hour it receives data",
    ),
]
REPEATABLE = frozenset({"catalog_files"})
ENV_VARS = tuple(env for _, _, envs, _, _ in OPTIONS for env in envs)


def build_parser(prog: str = "python -m exporter") -> argparse.ArgumentParser:
    from . import __version__  # the package metadata, read when first needed (see exporter/__init__.py)

    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Scrape Triton (/metrics, repository index) and NVML; emit CloudWatch EMF. "
        "Commands: catalog, health, render, cost, validate (each has --help).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every setting can also come from its environment variable; a flag wins.",
    )
    for field, flag, envs, _, text in OPTIONS:
        default = getattr(defaults, field)
        hidden = ("ecs_metadata_url", "timeout", "log_level", "catalog_files", "metrics")
        shown = "" if field in hidden else f" (default: {default})"
        parser.add_argument(
            flag,
            dest=field,
            metavar=field.split("_")[-1].upper(),
            action="append" if field in REPEATABLE else "store",
            help=f"{text}{shown} [env: {', '.join(envs)}]",
        )
    parser.add_argument(
        "--once",
        action="store_true",
        help="debugging view: scrape twice --interval apart, print that window's EMF "
        "to stdout and a summary table to stderr, then exit",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def given(
    args: argparse.Namespace, options: Sequence[tuple[str, str, tuple[str, ...], Any, str]], environ: Mapping[str, str]
) -> Iterator[tuple[str, Any, str]]:
    """(field, raw value, where it came from) of every option set by its flag or, else, by its first set variable.

    The one rule of both daemons' settings (the exporter's and modelsync's): a flag wins over the variable.
    """
    for field, flag, envs, _, _ in options:
        raw, origin = getattr(args, field), flag
        if raw is None:
            raw, origin = next(((environ[env], env) for env in envs if environ.get(env, "") != ""), (None, ""))
        if raw is not None:
            yield field, raw, origin


def load(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from flags and environment; raises ConfigError naming the bad setting."""
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(attach_selection(argv))
    values: dict[str, Any] = {"once": args.once}  # each converted by its option's parser
    timeout_given = False
    converters = {field: convert for field, _, _, convert, _ in OPTIONS}
    for field, raw, origin in given(args, OPTIONS, environ):
        if isinstance(raw, list):  # a repeatable flag: each value is one path, taken as written
            if not all(r.strip() for r in raw):
                raise ConfigError(f"{origin}: needs a catalog file path")
            values[field] = tuple(raw)
            continue
        try:
            values[field] = converters[field](raw)
        except ValueError as exc:
            raise ConfigError(f"{origin}={raw!r}: {exc}") from None
        timeout_given |= field == "timeout"
    settings = Settings(**values)
    if not timeout_given:
        settings = Settings(**{**settings.__dict__, "timeout": min(5.0, settings.interval / 2)})
    if settings.timeout >= settings.interval:
        raise ConfigError(
            f"--timeout ({settings.timeout:g}s) must be shorter than --interval "
            f"({settings.interval:g}s), or cycles would overlap"
        )
    return settings
