"""Entry point: parse settings once, build the pipeline, map outcomes to exit codes.

    python -m exporter [settings]            the sidecar loop
    python -m exporter --once --interval 2   one window: EMF on stdout, a table on stderr
    python -m exporter catalog [--json]      every metric the exporter can emit (--catalog FILE: what it adds)
    python -m exporter health [...]          the Triton container's deep health probe
    python -m exporter render [...]          alias of python -m render: dashboards, alarms, deploy files
    python -m exporter cost [...]            alias of python -m render cost: custom metrics, monthly cost
    python -m exporter validate FILE         check EMF documents (one per line)
    python -m exporter adopt TASKDEF.json    add the sidecar and the probe to a Triton task definition you run

Exit codes: 0 done, 1 runtime failure (Triton unreachable in --once, output
closed), 2 invalid settings or usage, or a required source that cannot start
(``--nvml on`` without NVML). Every error is one ``exporter: error: ...`` line
(``exporter catalog: error: ...`` for a command), as telemetry/settings.py says.
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from catalog import Catalog, CatalogError, build, cli
from telemetry import logs
from telemetry.settings import ArgumentParser, ConfigError, add_options, fail, parse

from .config import Settings, load
from .sources import Source, SourceRequired

if TYPE_CHECKING:
    from telemetry.otlp.endpoint import Endpoint

    from .gpufaults import GpuHealth

PROG = "python -m exporter"

# Commands that live in their own modules, imported only when used; each main(argv, prog) shows prog in its
# usage. render and cost are the artifact generator's (python -m render); they answer here too because the
# image's entry point is python -m exporter (docker run IMAGE render). The sidecar itself never imports them.
# config.SUBCOMMANDS lists every command, these and catalog and validate, in --help.
COMMANDS = {
    "health": "triton_side.probe:main",  # the Triton-side probe, shipped in the wheel too
    "render": "render:main",
    "cost": "render.cost:main",
    "adopt": "exporter.adopt:main",  # docs/adopt.md
}


def build_catalog(settings: Settings) -> Catalog:
    """The catalog the settings describe, validated once; raises CatalogError (exit 2)."""
    return build(settings.catalog_files, settings.metrics, cli.packs(settings.llm_metrics))


def build_sources(settings: Settings, catalog: Catalog) -> list[Source]:
    # Imported here, not at the top: the HTTP client (http.client and the email parser under it) and the
    # /metrics reader are start-up time that commands like catalog or validate never need.
    from .sources.ecs import EcsMetadataSource
    from .sources.promtext import Parser
    from .sources.triton import TritonIndexSource, TritonMetricsSource

    # The OTLP output sends every series of the families it reads (all five quantiles of a summary); EMF alone
    # needs only the label values the catalog selects, and the parser skips the rest.
    selects = {} if settings.otlp_outputs else catalog.sample_selects()
    index = TritonIndexSource(
        settings.triton_url, settings.connect_timeout, settings.max_body_bytes, admin_key=settings.triton_admin_key
    )
    sources: list[Source] = [
        TritonMetricsSource(
            settings.metrics_url,
            Parser(catalog.wanted_samples(), selects=selects),
            settings.connect_timeout,
            settings.max_body_bytes,
        ),
        index,
    ]
    if settings.nvml != "off":
        nvml = _nvml_source(settings)
        if nvml is not None:
            sources.append(nvml)
    ecs = None
    if settings.ecs_metadata_url:
        ecs = EcsMetadataSource(settings.ecs_metadata_url, settings.connect_timeout)
        sources.append(ecs)
    if settings.traces_to is not None:
        sources.append(_trace_source(settings, settings.traces_to, ecs, index.listed))
    return sources


def _trace_source(
    settings: Settings, endpoint: Endpoint, ecs: Any, listed: Callable[[], frozenset[tuple[str, str]] | None]
) -> Source:
    """The trace relay, listening already, measuring the model versions ``listed`` (the repository index's);
    SourceRequired when its port cannot be had (exit 2)."""
    from telemetry.otlp.resource import ecs_resource

    from .traces.forward import SpanForwarder
    from .traces.relay import TraceRelay
    from .traces.sampling import TraceRate
    from .traces.source import TraceSource

    def context() -> dict[str, object]:
        metadata = (ecs.cached if ecs is not None else None) or {}
        return ecs_resource(metadata, settings.traces_container, settings.traces_log_groups)

    host, port = settings.traces_listen
    if not _loopback(host):
        logs.get("traces").warning(
            "the trace relay listens on %s:%d, beyond this host, and has no authentication: whoever reaches the "
            "port can send spans to %s; listen on 127.0.0.1 (--traces-listen) unless Triton is on another host",
            host,
            port,
            endpoint,
            extra={"fields": {"condition": "traces_listen", "listen": f"{host}:{port}"}},
        )
    try:
        relay = TraceRelay(host, port, context, listed=listed)
    except OSError as exc:
        raise SourceRequired(
            f"--traces-to needs the relay to listen on {host}:{port} (--traces-listen): {exc.strerror or exc}"
        ) from None
    relay.forwarder = SpanForwarder(endpoint)
    relay.start()
    rate = (
        TraceRate(settings.triton_url, settings.trace_rate, admin_key=settings.triton_admin_key)
        if settings.trace_rate
        else None
    )
    return TraceSource(relay, rate)


def _loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this host only: 127.0.0.0/8, ::1 or localhost."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that may resolve to anything


def _nvml_source(settings: Settings) -> Source | None:
    """The NVML source; raises SourceRequired under ``--nvml on`` when NVML cannot start."""
    try:
        from .sources.nvml import make_nvml_source
    except ImportError as exc:
        if settings.nvml == "on":
            raise SourceRequired(
                f"--nvml on (EXPORTER_NVML=on) needs the NVML source, which cannot load: {exc}"
            ) from None
        return None
    return make_nvml_source(settings.nvml, health=_gpu_health(settings))


def _gpu_health(settings: Settings) -> GpuHealth:
    """The GPU verdict with the ``--gpu-fault-action`` it leads to (docs/gpu.md)."""
    from .gpufaults import GpuHealth, Report

    if settings.gpu_fault_action != "drain":
        return GpuHealth(Report())
    if settings.once:  # a debugging view: it shows the verdict and never takes a host out of service
        return GpuHealth(Report("--once never drains"))
    from .gpufaults.drain import Drainer

    drainer = Drainer(settings.ecs_metadata_url, settings.controller_queue_url, retry_interval=settings.interval)
    return GpuHealth(drainer)


def listens(url: str, timeout: float) -> bool:
    """True when a TCP connection to ``url``'s host and port succeeds."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "localhost", port), timeout).close()
    except OSError:
        return False
    return True


def catalog_parser(prog: str = f"{PROG} catalog") -> ArgumentParser:
    parser = ArgumentParser(
        prog=prog,
        description="List every metric the exporter emits with this catalog and selection; with --catalog files, "
        "check them and list what they add.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output: every selected metric")
    parser.add_argument("--all", action="store_true", help="with --catalog: list every selected metric")
    add_options(parser, cli.OPTIONS)
    return parser


def catalog_main(argv: Sequence[str], prog: str = f"{PROG} catalog") -> int:
    import orjson

    try:
        args, values = parse(catalog_parser(prog), cli.OPTIONS, argv, os.environ)
    except ConfigError as exc:
        return fail(prog, f"invalid setting: {exc}")
    try:
        catalog = cli.from_values(values)
    except CatalogError as exc:
        return fail(prog, f"invalid catalog: {exc}")
    rows: list[dict[str, Any]] = [
        {
            "name": m.name,
            "unit": m.unit,
            "scope": str(m.scope),
            "kind": str(m.kind),
            "dimensions": [list(d) for d in m.dimension_sets],
            "source": m.source,
            "inputs": m.describe(),
            "interval": m.interval,  # seconds; None: every --interval
            "resolution": m.resolution,  # EMF StorageResolution
            "breakdown_of": m.breakdown_of,
            "origin": m.origin,
            "help": m.help,
        }
        for m in catalog.metrics
    ]
    if args.json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    sys.stdout.write(cli.listing(catalog, cli.builtin_of(values), args.all))
    return 0


def validate_parser(prog: str = f"{PROG} validate") -> ArgumentParser:
    parser = ArgumentParser(prog=prog, description="Check EMF documents, one JSON object per line.")
    parser.add_argument("file", metavar="FILE", help="the documents' file, or - for stdin")
    return parser


def validate_main(argv: Sequence[str], prog: str = f"{PROG} validate") -> int:
    from telemetry.emf_validate import validate

    args, _ = parse(validate_parser(prog), (), argv, os.environ)  # no settings: one positional argument
    try:
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    except OSError as exc:
        return fail(prog, f"cannot read {args.file}: {exc.strerror or exc}")
    bad = total = 0
    with stream:
        for n, line in enumerate(stream, 1):
            if not line.strip():
                continue
            total += 1
            errors = validate(line.rstrip(b"\n"))
            if errors:
                bad += 1
                sys.stdout.write(f"line {n}: " + "; ".join(errors) + "\n")
    sys.stdout.write(f"{total - bad} valid, {bad} invalid\n")
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    logs.catch_unexpected()  # no raw traceback on stderr, whatever fails (docs/reliability.md)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "catalog":
        return catalog_main(argv[1:])
    if argv and argv[0] == "validate":
        return validate_main(argv[1:])
    if argv and argv[0] in COMMANDS:
        module, func = COMMANDS[argv[0]].split(":")
        try:
            target = getattr(importlib.import_module(module), func)
        except ImportError as exc:
            return fail(PROG, f"command {argv[0]!r} is not available: {exc}")
        return int(target(argv[1:], prog=f"{PROG} {argv[0]}"))
    try:
        settings = load(argv, os.environ)
    except ConfigError as exc:
        return fail(PROG, f"invalid setting: {exc}")
    try:
        catalog = build_catalog(settings)
    except CatalogError as exc:
        return fail(PROG, f"invalid catalog: {exc}")
    from telemetry.sinks import SinkClosed, StreamSink, make_sinks

    from .pipeline import Pipeline, ScrapeOutput
    from .protection import make as task_protection
    from .runner import Runner, TritonUnreachable, run_once

    logs.setup(settings.log_level or ("error" if settings.once else "info"))
    try:
        sources = build_sources(settings, catalog)
    except SourceRequired as exc:
        return fail(PROG, str(exc))
    outputs: list[ScrapeOutput] = []
    if settings.otlp_outputs:
        from .otlp_output import OtlpMetricsOutput

        genai = settings.otlp_semconv == "genai"
        outputs.append(OtlpMetricsOutput(catalog, settings.otlp_outputs, settings.traces_container, genai=genai))
    protection = task_protection(settings)  # None unless --task-protection on, on ECS
    if protection is not None:
        outputs.append(protection)
    pipeline = Pipeline(settings, catalog, sources, outputs=outputs)
    if settings.once:
        try:
            run_once(pipeline, StreamSink(), settings.interval, sys.stderr)
        except TritonUnreachable as exc:
            return fail(PROG, f"cannot read Triton: {exc}", 1)
        except SinkClosed:
            return 0  # `--once | head` is normal use
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    runner = Runner(
        pipeline,
        make_sinks(settings.emf_outputs, settings.buffer_events, settings.connect_timeout),
        settings.interval,
        stop,
        triton_listens=partial(listens, settings.metrics_url, settings.connect_timeout),
        startup_wait=settings.startup_wait,
        triton_address=settings.metrics_url,
    )
    try:
        runner.run()
    except SinkClosed as exc:
        logs.get().error("%s; stopping", exc)
        return 1
    return 0


if __name__ == "__main__":
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`catalog | head`): normal use. Silence the interpreter's own flush-at-exit complaint.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)
