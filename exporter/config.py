"""Settings: read once at the entry point from flags and environment, validated, frozen.

Every setting has a flag and an environment variable (for the ECS task
definition); a flag wins over the variable, the variable over the default.
The table below is read by :mod:`telemetry.settings`, the one mechanism of
every command; ``python -m exporter --help`` prints it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from catalog import cli as catalog_cli
from catalog.otlp import SEMCONVS
from telemetry.otlp.endpoint import Endpoint, parse_endpoint
from telemetry.settings import (
    ArgumentParser,
    ConfigError,
    Option,
    add_commands,
    add_options,
    choice,
    cloudwatch_namespace,
    command_first,
    environment_variables,
    http_url,
    non_negative,
    parse,
    positive,
    positive_int,
    positive_size,
    shown_size,
)
from telemetry.sinks import Output, parse_output
from triton_http import AdminKey, key_from_env

__all__ = ["ENV_VARS", "OPTIONS", "SUBCOMMANDS", "ConfigError", "Output", "Settings", "build_parser", "load"]


@dataclass(frozen=True)
class Settings:
    triton_url: str = "http://localhost:8000"
    metrics_url: str = "http://localhost:8002/metrics"
    namespace: str = "Triton"
    # EMF sinks (Output) and OTLP metrics endpoints (Endpoint), in the order given; default: EMF on stdout
    outputs: tuple[Output | Endpoint, ...] = (Output("stdout"),)
    interval: float = 60.0
    timeout: float = 5.0
    connect_timeout: float = 1.0
    max_body_bytes: int = 64 * 1024 * 1024
    max_models: int = 500
    buffer_events: int = 20_000
    nvml: str = "auto"
    gpu_fault_action: str = "report"  # what an unhealthy GPU leads to: report, or ask the controller to drain
    controller_queue_url: str = ""  # with drain: the controller's SQS queue (docs/controller.md)
    storage_resolution: int = 60
    ecs_metadata_url: str = ""
    log_level: str = ""  # empty: info for the loop, error for --once (its table already says what is down)
    catalog_files: tuple[str, ...] = ()  # user catalog files, read after the built-in packs
    metrics: str = ""  # --metrics selection over EMF names; empty: every metric of the catalog
    llm_metrics: str = "on"  # the built-in LLM pack
    breakdown_zeros: str = "omit"  # omit: a breakdown's zero is left out while its total is zero
    startup_wait: float = 300.0  # seconds the first scrape waits for Triton to listen (0: at once)
    traces_to: Endpoint | None = None  # otlp+https://... (SigV4) or otlp+http://...: the trace relay runs when set
    traces_listen: tuple[str, int] = ("127.0.0.1", 4318)
    trace_rate: int = 0  # 0: leave Triton's trace rate as its flags set it
    traces_log_groups: tuple[str, ...] = ()  # aws.log.group.names on every span's resource
    traces_container: str = "triton-server"
    otlp_semconv: str = "off"  # genai: the OTLP outputs also send OpenTelemetry's GenAI server metrics
    task_protection: str = "off"  # on: ECS task scale-in protection while work outlasts the drain (docs/scaling.md)
    ecs_agent_uri: str = ""  # ECS_AGENT_URI, set by ECS (agent 1.65+): where task protection is asked for
    task_protection_drain: float = 60.0  # seconds a stopping task gives its requests (deregistration + exit timeout)
    task_protection_idle: float = 120.0  # seconds without such work before the protection is cleared
    task_protection_max: float = 60.0  # minutes of protection on end at most
    # Opens Triton's restricted APIs (index, model configuration, trace settings): TRITON_ADMIN_KEY only, never a
    # flag (a secret; triton_http/admin.py)
    triton_admin_key: AdminKey | None = None
    once: bool = False

    @property
    def emf_outputs(self) -> tuple[Output, ...]:
        return tuple(o for o in self.outputs if isinstance(o, Output))

    @property
    def otlp_outputs(self) -> tuple[Endpoint, ...]:
        return tuple(o for o in self.outputs if isinstance(o, Endpoint))


OTLP_METRICS_EXAMPLES = "otlp+https://monitoring.REGION.amazonaws.com/v1/metrics or otlp+http://HOST:PORT/v1/metrics"


def _output(text: str) -> Output | Endpoint:
    """An ``--output`` value: an EMF sink, or an OTLP metrics endpoint (``otlp+https://`` signed, ``otlp+http://``)."""
    if not text.strip().lower().startswith("otlp"):
        try:
            return parse_output(text)
        except ValueError as exc:
            if str(exc).startswith("use "):
                raise ValueError(f"{exc} (EMF), or {OTLP_METRICS_EXAMPLES} (OTLP metrics)") from None
            raise
    endpoint = parse_endpoint(text)
    if urlsplit(endpoint.url).path.rstrip("/").endswith("/v1/traces"):
        raise ValueError(f"a traces endpoint: --output sends OTLP metrics, e.g. {OTLP_METRICS_EXAMPLES}")
    if endpoint.signed and endpoint.service != "monitoring":
        raise ValueError(
            f"signed for {endpoint.service!r}: OTLP metrics go to CloudWatch (SigV4 service monitoring), "
            f"e.g. {OTLP_METRICS_EXAMPLES}"
        )
    return endpoint


OTLP_TRACES_EXAMPLES = "otlp+https://xray.REGION.amazonaws.com/v1/traces or otlp+http://HOST:PORT/v1/traces"


def _traces_to(text: str) -> Endpoint:
    """A ``--traces-to`` value: an OTLP traces endpoint (a metrics one is refused, as ``--output`` refuses traces)."""
    endpoint = parse_endpoint(text)
    if urlsplit(endpoint.url).path.rstrip("/").endswith("/v1/metrics"):
        raise ValueError(f"a metrics endpoint: --traces-to sends spans, e.g. {OTLP_TRACES_EXAMPLES}")
    if endpoint.signed and endpoint.service != "xray":
        raise ValueError(
            f"signed for {endpoint.service!r}: spans go to X-Ray (SigV4 service xray), e.g. {OTLP_TRACES_EXAMPLES}"
        )
    return endpoint


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:4318")
    return (host.strip("[]") or "127.0.0.1", int(port))


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names or not all(n.isprintable() and len(n) <= 512 for n in names):
        raise ValueError("must be comma-separated log group names")
    return names


def _resolution(text: str) -> int:
    if text not in ("1", "60"):
        raise ValueError("must be 1 (high resolution) or 60")
    return int(text)


OPTIONS: tuple[Option, ...] = (
    Option("triton_url", "--triton-url", ("TRITON_URL",), http_url, "Triton HTTP API (repository index)"),
    Option(
        "metrics_url",
        "--triton-metrics-url",
        ("TRITON_METRICS_URL",),
        http_url,
        "Triton's Prometheus endpoint (the same flag in model sync)",
    ),
    Option("namespace", "--namespace", ("AWS_EMF_NAMESPACE",), cloudwatch_namespace, "CloudWatch namespace"),
    Option(
        "outputs",
        "--output",
        ("EXPORTER_OUTPUT", "AWS_EMF_AGENT_ENDPOINT"),
        _output,
        "where metrics go; repeatable, each output gets every cycle (the variable separates them with blanks). "
        "EMF: stdout, tcp://HOST:PORT (CloudWatch agent or Fluent Bit tcp input), udp://HOST:PORT, file:PATH; "
        "OTLP metrics (Triton's own families, docs/otlp.md): otlp+https://monitoring.REGION.amazonaws.com/v1/metrics "
        "(SigV4) or otlp+http://HOST:PORT/v1/metrics (a collector or the CloudWatch agent)",
        repeatable=True,
        separator=" ",
        metavar="OUTPUT",
        shown="stdout",
    ),
    Option(
        "interval",
        "--interval",
        ("EXPORTER_INTERVAL",),
        positive,
        "seconds between scrapes (fixed rate)",
        metavar="SECONDS",
    ),
    Option(
        "timeout",
        "--timeout",
        ("EXPORTER_TIMEOUT",),
        positive,
        "overall deadline per source per cycle, seconds",
        metavar="SECONDS",
        shown="min(5, interval/2)",
    ),
    Option(
        "connect_timeout",
        "--connect-timeout",
        ("EXPORTER_CONNECT_TIMEOUT",),
        positive,
        "TCP connect timeout, seconds",
        metavar="SECONDS",
    ),
    Option(
        "max_body_bytes",
        "--max-body-bytes",
        ("EXPORTER_MAX_BODY_BYTES",),
        positive_size,
        "largest /metrics or index body accepted; larger ones are refused while streaming (K/M/G suffixes)",
        metavar="BYTES",
        shown=shown_size(Settings.max_body_bytes),
    ),
    Option(
        "max_models",
        "--max-models",
        ("EXPORTER_MAX_MODELS",),
        positive_int,
        "cardinality cap: model versions emitted per cycle (bounds the CloudWatch bill)",
    ),
    Option(
        "buffer_events",
        "--buffer-events",
        ("EXPORTER_BUFFER_EVENTS",),
        positive_int,
        "tcp/udp sink: events held while the agent is away; oldest dropped (and counted) beyond",
    ),
    Option(
        "nvml",
        "--nvml",
        ("EXPORTER_NVML",),
        choice("auto", "on", "off"),
        "GPU telemetry from NVML: auto (use if present; if not, report it down and retry every 300 s), "
        "on (required: exit 2 at start when NVML cannot initialise), off",
    ),
    Option(
        "gpu_fault_action",
        "--gpu-fault-action",
        ("EXPORTER_GPU_FAULT_ACTION",),
        choice("report", "drain"),
        "when a GPU turns unhealthy (a fatal XID, a driver recovery action read twice, lost, row remapping "
        "failed): report (GpuHealthy=0 and a log line; no AWS call), or drain: also send one report to the "
        "fleet's controller (--controller-queue-url), which checks it and drains and replaces this instance within "
        "fleet-wide bounds (needs the ECS task metadata endpoint; docs/gpu.md, docs/controller.md). XID 63, XID 142 "
        "and the recovery action DRAIN_P2P are report-only either way",
    ),
    Option(
        "controller_queue_url",
        "--controller-queue-url",
        ("CONTROLLER_QUEUE_URL",),
        http_url,
        "the controller's SQS queue: where --gpu-fault-action drain sends its report (the same flag on every "
        "command naming that queue)",
    ),
    Option(
        "startup_wait",
        "--startup-wait",
        ("EXPORTER_STARTUP_WAIT",),
        non_negative,
        "seconds the first scrape waits for Triton's metrics port to accept connections (Triton opens its ports "
        "only once its models are loaded; started with it, the sidecar would otherwise report it down); after "
        "that, Triton down is reported as usual; 0: scrape at once",
        metavar="SECONDS",
    ),
    Option(
        "storage_resolution",
        "--storage-resolution",
        ("EXPORTER_STORAGE_RESOLUTION",),
        _resolution,
        "60: each metric's own resolution, as its catalog entry says (the leading scaling signals are high "
        "resolution, docs/scaling.md); 1: every metric high resolution",
        metavar="{1,60}",
    ),
    Option(
        "ecs_metadata_url",
        "--ecs-metadata-url",
        ("ECS_CONTAINER_METADATA_URI_V4",),
        http_url,
        "ECS task metadata endpoint (set by ECS); task identity goes into properties",
        shown="",
    ),
    Option(
        "log_level",
        "--log-level",
        ("EXPORTER_LOG_LEVEL",),
        choice("debug", "info", "warning", "error"),
        "level of the exporter's own JSON log lines on stderr",
        shown="info; error with --once",
    ),
    Option(
        "traces_to",
        "--traces-to",
        ("EXPORTER_TRACES_TO",),
        _traces_to,
        "run the trace relay and forward Triton's spans here: otlp+https://xray.REGION.amazonaws.com/v1/traces "
        "(SigV4) or otlp+http://HOST:PORT/v1/traces (a collector or the CloudWatch agent; docs/tracing.md)",
        metavar="ENDPOINT",
        shown="off",
    ),
    Option(
        "traces_listen",
        "--traces-listen",
        ("EXPORTER_TRACES_LISTEN",),
        _listen,
        "where the relay takes OTLP/HTTP from Triton (--trace-config opentelemetry,url=http://THIS/v1/traces); "
        "the relay has no authentication: an address beyond loopback (0.0.0.0) is warned about at start",
        metavar="HOST:PORT",
        shown="127.0.0.1:4318",
    ),
    Option(
        "trace_rate",
        "--trace-rate",
        ("EXPORTER_TRACE_RATE",),
        positive_int,
        "apply Triton's trace rate at runtime (1 request in N is traced; POST /v2/trace/setting, re-applied after a "
        "Triton restart)",
        shown="leave Triton's",
    ),
    Option(
        "traces_log_groups",
        "--traces-log-groups",
        ("EXPORTER_TRACES_LOG_GROUPS",),
        _names,
        "log groups whose lines carry trace ids (comma-separated): aws.log.group.names on every span, so the X-Ray "
        "console shows them beside the trace",
        metavar="GROUP[,GROUP...]",
        shown="none",
    ),
    Option(
        "traces_container",
        "--traces-container",
        ("EXPORTER_TRACES_CONTAINER",),
        str,
        "Triton's container name, container.name on every span",
        metavar="NAME",
    ),
    Option(
        "otlp_semconv",
        "--otlp-semconv",
        ("EXPORTER_OTLP_SEMCONV",),
        choice(*SEMCONVS),
        "genai: each OTLP output also sends OpenTelemetry's GenAI server metrics (gen_ai.server.time_to_first_token, "
        ".time_per_output_token, .request.duration) of every generative model (docs/otlp.md); needs an otlp+ --output",
    ),
    Option(
        "task_protection",
        "--task-protection",
        ("EXPORTER_TASK_PROTECTION",),
        choice("off", "on"),
        "on: ECS task scale-in protection while this task's work in flight lasts longer than "
        "--task-protection-drain (Little's law on Triton's pending requests, TensorRT-LLM's active ones and the "
        "completions), so a scale-in or a deployment does not cut it; renewed before it expires, cleared when "
        "idle; needs ECS_AGENT_URI (off outside ECS) and ecs:UpdateTaskProtection on the task role "
        "(docs/scaling.md)",
    ),
    Option(
        "ecs_agent_uri",
        "--ecs-agent-uri",
        ("ECS_AGENT_URI",),
        http_url,
        "the ECS agent's endpoint (set by ECS, agent 1.65+): --task-protection calls its task-protection/v1/state",
        shown="",
    ),
    Option(
        "task_protection_drain",
        "--task-protection-drain",
        ("EXPORTER_TASK_PROTECTION_DRAIN",),
        positive,
        "seconds a stopping task gives its requests: the load balancer's deregistration delay plus Triton's "
        "--exit-timeout-secs (60 in the shipped stack); work that lasts longer is protected",
        metavar="SECONDS",
    ),
    Option(
        "task_protection_idle",
        "--task-protection-idle",
        ("EXPORTER_TASK_PROTECTION_IDLE",),
        non_negative,
        "seconds without work outlasting the drain before the protection is cleared",
        metavar="SECONDS",
    ),
    Option(
        "task_protection_max",
        "--task-protection-max",
        ("EXPORTER_TASK_PROTECTION_MAX",),
        positive,
        "minutes a task stays protected on end at most; then cleared and left alone 5 minutes, so scale-in and "
        "deployments are held this long at most",
        metavar="MINUTES",
    ),
    *catalog_cli.OPTIONS,
    Option(
        "breakdown_zeros",
        "--breakdown-zeros",
        ("EXPORTER_BREAKDOWN_ZEROS",),
        choice("omit", "emit"),
        "omit: leave out a breakdown's zeros (failure reasons, an idle LLM's tokens) while its total is zero; "
        "CloudWatch bills a metric for every hour it receives data",
    ),
)
ENV_VARS = environment_variables(OPTIONS)

# python -m exporter COMMAND: each one reads its own arguments (exporter/__main__.py dispatches them)
SUBCOMMANDS = {
    "catalog": "every metric the exporter emits with this catalog and selection",
    "validate": "check EMF documents, one JSON object per line",
    "health": "the Triton container's deep health probe (docs/health.md)",
    "render": "alias of python -m render: dashboards, alarms, deploy files",
    "cost": "alias of python -m render cost: custom metrics, alarms and their monthly price",
    "adopt": "add the sidecar and the probe to a Triton task definition you run (docs/adopt.md)",
}


def build_parser(prog: str = "python -m exporter") -> argparse.ArgumentParser:
    from . import __version__  # the package metadata, read when first needed (see exporter/__init__.py)

    parser = ArgumentParser(
        prog=prog,
        description="Scrape Triton (/metrics, repository index) and NVML; emit CloudWatch EMF. Without a "
        "command: the sidecar.",
        epilog="Every setting can also come from its environment variable; a flag wins.",
    )
    add_commands(parser, SUBCOMMANDS)
    add_options(parser, OPTIONS, Settings())
    parser.add_argument(
        "--once",
        action="store_true",
        help="debugging view: scrape twice --interval apart, print that window's EMF "
        "to stdout and a summary table to stderr, then exit",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def load(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from flags and environment; raises ConfigError naming the bad setting."""
    environ = os.environ if environ is None else environ
    parser = build_parser()
    args, values = parse(parser, OPTIONS, argv, environ)
    command_first(parser, args)
    try:
        values["triton_admin_key"] = key_from_env(environ)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    settings = Settings(**values, once=args.once)
    if "timeout" not in values:
        settings = replace(settings, timeout=min(5.0, settings.interval / 2))
    if len(set(settings.outputs)) != len(settings.outputs):
        raise ConfigError(f"--output: {', '.join(map(str, settings.outputs))}: an output is given twice")
    if settings.gpu_fault_action == "drain" and (settings.nvml == "off" or not settings.ecs_metadata_url):
        raise ConfigError(
            "--gpu-fault-action drain needs the NVML source (--nvml auto or on) and the ECS task metadata endpoint "
            "(ECS_CONTAINER_METADATA_URI_V4, set by ECS, or --ecs-metadata-url) to find this instance"
        )
    if settings.gpu_fault_action == "drain" and not settings.controller_queue_url and not settings.once:
        raise ConfigError(
            "--gpu-fault-action drain needs --controller-queue-url (CONTROLLER_QUEUE_URL): the controller's queue, "
            "where the report goes (docs/controller.md)"
        )
    if settings.otlp_semconv != "off" and not settings.otlp_outputs:
        raise ConfigError(
            f"--otlp-semconv {settings.otlp_semconv}: it changes what the OTLP outputs send, and none is given "
            "(--output otlp+...)"
        )
    if settings.timeout >= settings.interval:
        raise ConfigError(
            f"--timeout ({settings.timeout:g}s) must be shorter than --interval "
            f"({settings.interval:g}s), or cycles would overlap"
        )
    return settings
