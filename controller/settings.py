"""Settings: read once at the entry point from flags and ``CONTROLLER_*`` variables, validated, frozen.

The same rule as every command (telemetry/settings.py): a flag wins over its variable, the variable over the
default. AWS endpoints, region and credentials are not settings of ours: boto3 reads them from the standard
chain (``AWS_ENDPOINT_URL``, ``AWS_REGION``, the task role).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from modelsync.fanout import check_topic_arn
from telemetry.settings import (
    ArgumentParser,
    ConfigError,
    Option,
    add_options,
    choice,
    cloudwatch_namespace,
    environment_variables,
    http_url,
    non_negative,
    parse,
    positive,
    positive_int,
    printable,
)
from telemetry.sinks import Output, parse_output

from . import __version__
from .drains import DEFAULT_LIMIT, Bounds, Limit
from .fanout import check_queue_prefix
from .rules import Rules

__all__ = ["ENV_VARS", "OPTIONS", "ConfigError", "Settings", "build_parser", "load"]

STDOUT = Output("stdout")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class Settings:
    queue_url: str = ""
    cluster: str = ""
    max_draining: Limit = DEFAULT_LIMIT
    max_drains_per_hour: int = 4
    pause_above: float = 0.2
    replace_timeout: float = 900.0
    interval: float = 15.0
    state_bucket: str = ""
    state_key: str = ""  # empty: controller/<cluster>/state.json
    state_file: str = ""
    output: Output = STDOUT
    namespace: str = "Triton"
    log_level: str = "info"
    # The fan-out (controller/fanout.py): one queue per task of the Triton service on the model events' topic
    service: str = ""
    topic_arn: str = ""
    queue_name_prefix: str = "modelsync-"
    bucket: str = ""  # model sync's bucket and prefix: where the fleet's size is published for rollouts
    prefix: str = ""
    # Rollouts (controller/rollouts.py): decided here for every daemon in --rollouts controller mode
    rollouts: str = "off"
    canary_fraction: float = 0.25
    bake_seconds: float = 600.0
    bake_min_requests: int = 100
    max_failure_increase: float = 0.01
    max_latency_ratio: float = 1.5
    max_failure_ratio: float = 0.05

    @property
    def rules(self) -> Rules:
        return Rules(self.bake_seconds, self.bake_min_requests, self.max_failure_increase, self.max_latency_ratio,
                     self.max_failure_ratio)  # fmt: skip

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.max_draining, self.max_drains_per_hour, self.pause_above, self.replace_timeout)

    @property
    def key(self) -> str:
        return self.state_key or f"controller/{self.cluster}/state.json"


def _limit(text: str) -> Limit:
    """``2`` (instances) or ``10%`` / ``0.1`` (of the cluster's container instances)."""
    raw = text.strip()
    try:
        if raw.endswith("%"):
            fraction = float(raw[:-1]) / 100
        elif "." in raw:
            fraction = float(raw)
        else:
            return Limit(count=positive_int(raw))
    except ValueError:
        raise ValueError("must be a count (2) or a share of the cluster's instances (10% or 0.1)") from None
    if not 0 < fraction <= 1:
        raise ValueError("a share must be above 0 and at most 100%")
    return Limit(fraction=fraction)


def _share(text: str) -> float:
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError("must be a share: 20% or 0.2") from None
    if not 0 < value < 1:
        raise ValueError("must be above 0 and below 100%")
    return value


def _bucket(text: str) -> str:
    if not _BUCKET.fullmatch(text) or ".." in text:
        raise ValueError("must be an S3 bucket name (3-63 characters: a-z, 0-9, '.', '-')")
    return text


def _key(text: str) -> str:
    if not text or text.startswith("/") or len(text) > 1024:
        raise ValueError("must be an S3 key (1-1024 characters, not starting with '/')")
    return text


def _prefix(text: str) -> str:
    """Model sync's key prefix, read as model sync reads it: a folder (``models`` is ``models/``)."""
    if text.startswith("/"):
        raise ValueError("an S3 key prefix does not start with '/'")
    return text if not text or text.endswith("/") else text + "/"


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError("must be above 0 and at most 1")
    return value


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise ValueError("must be above 0 and below 1")
    return value


def _latency(text: str) -> float:
    value = float(text)
    if not 1 < value < 1e6:
        raise ValueError("must be above 1")
    return value


def _service(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,255}", text):
        raise ValueError("must be an ECS service name (1-255 characters: A-Z, a-z, 0-9, '-', '_')")
    return text


def _file(text: str) -> str:
    path = Path(text)
    if not path.parent.is_dir():
        raise ValueError(f"directory {path.parent} does not exist")
    return str(path)


OPTIONS: tuple[Option, ...] = (
    Option(
        "queue_url",
        "--controller-queue-url",
        ("CONTROLLER_QUEUE_URL",),
        http_url,
        "the SQS queue the hosts report to and the controller reads (the same flag on every command naming it)",
    ),
    Option("cluster", "--cluster", ("CONTROLLER_CLUSTER",), printable, "the ECS cluster (name or ARN) it decides for"),
    Option(
        "max_draining",
        "--max-draining",
        ("CONTROLLER_MAX_DRAINING",),
        _limit,
        "instances draining or being replaced for GPU faults at once, at most: a count (2) or a share of the "
        "cluster's container instances, rounded up, at least 1 (10%)",
        metavar="N|SHARE",
        shown="10%",
    ),
    Option(
        "max_drains_per_hour",
        "--max-drains-per-hour",
        ("CONTROLLER_MAX_DRAINS_PER_HOUR",),
        positive_int,
        "drains started in any hour, at most; more wait their turn",
    ),
    Option(
        "pause_above",
        "--pause-above",
        ("CONTROLLER_PAUSE_ABOVE",),
        _share,
        "pause every drain when more than this share of the cluster's instances reported a draining GPU fault "
        "within an hour (a fleet-wide cause); python -m controller resume resumes",
        metavar="SHARE",
        shown="20%",
    ),
    Option(
        "replace_timeout",
        "--replace-timeout",
        ("CONTROLLER_REPLACE_TIMEOUT",),
        non_negative,
        "seconds a DRAINING instance may keep tasks before it is replaced anyway (logged)",
        metavar="SECONDS",
    ),
    Option(
        "interval",
        "--interval",
        ("CONTROLLER_INTERVAL",),
        positive,
        "seconds between passes over the fleet",
        metavar="SECONDS",
    ),
    Option(
        "state_bucket",
        "--state-bucket",
        ("CONTROLLER_STATE_BUCKET",),
        _bucket,
        "S3 bucket of the controller's state (a small JSON object, written conditionally)",
    ),
    Option(
        "state_key",
        "--state-key",
        ("CONTROLLER_STATE_KEY",),
        _key,
        "S3 key of the state",
        shown="controller/<cluster>/state.json",
    ),
    Option(
        "state_file",
        "--state-file",
        ("CONTROLLER_STATE_FILE",),
        _file,
        "keep the state in this file instead (one host; tests)",
    ),
    Option(
        "service",
        "--service",
        ("CONTROLLER_SERVICE",),
        _service,
        "the Triton service's name: each of its tasks gets a fan-out queue (with --topic-arn), and its running "
        "tasks are the live hosts a canary share is sized from (with --bucket)",
        metavar="NAME",
    ),
    Option(
        "topic_arn",
        "--topic-arn",
        ("CONTROLLER_TOPIC_ARN",),
        check_topic_arn,
        "model sync's SNS topic of the bucket's object events: one SQS queue per task of --service is made, "
        "secured and subscribed to it, and removed when the task stops (model sync's --fanout controller)",
        shown="none",
    ),
    Option(
        "queue_name_prefix",
        "--queue-name-prefix",
        ("CONTROLLER_QUEUE_NAME_PREFIX",),
        check_queue_prefix,
        "name prefix of the per-task queues, <prefix><task id> (model sync's same setting); only queues of that "
        "exact form and tagged with this cluster and service are ever removed",
    ),
    Option(
        "bucket",
        "--bucket",
        ("CONTROLLER_BUCKET",),
        _bucket,
        "model sync's bucket: the running task count of --service is published at <prefix>.modelsync/fleet.json "
        "there, for the daemons' rollouts",
        shown="none",
    ),
    Option("prefix", "--prefix", ("CONTROLLER_PREFIX",), _prefix, "model sync's key prefix (a folder)", shown=""),
    Option(
        "rollouts",
        "--rollouts",
        ("CONTROLLER_ROLLOUTS",),
        choice("off", "on"),
        "on: decide model sync's rollouts for the daemons run with --rollouts controller (assign canaries, judge, "
        "write the state under <prefix>.modelsync/rollouts/); needs --bucket and --service, and a versioned bucket",
    ),
    Option(
        "canary_fraction",
        "--canary-fraction",
        ("CONTROLLER_CANARY_FRACTION",),
        _fraction,
        "a new artifact goes first to ceil(F x running tasks of --service) hosts, at least one",
    ),
    Option(
        "bake_seconds",
        "--bake-seconds",
        ("CONTROLLER_BAKE_SECONDS",),
        positive,
        "how long every canary serves a new artifact before it may be promoted (an early abort does not wait)",
    ),
    Option(
        "bake_min_requests",
        "--bake-min-requests",
        ("CONTROLLER_BAKE_MIN_REQUESTS",),
        positive_int,
        "fewer requests on the canaries is no evidence: no verdict (nor early abort) before",
    ),
    Option(
        "max_failure_increase",
        "--max-failure-increase",
        ("CONTROLLER_MAX_FAILURE_INCREASE",),
        _ratio,
        "the failure increase over the baseline that matters: rejected when the canaries fail more at 95 % "
        "confidence by at least half of it (docs/modelsync.md gives the test's rates)",
        metavar="FRACTION",
    ),
    Option(
        "max_latency_ratio",
        "--max-latency-ratio",
        ("CONTROLLER_MAX_LATENCY_RATIO",),
        _latency,
        "reject when the canaries' average latency over the bake exceeds the baseline's by this factor",
    ),
    Option(
        "max_failure_ratio",
        "--max-failure-ratio",
        ("CONTROLLER_MAX_FAILURE_RATIO",),
        _ratio,
        "reject a canary failing more than this share of its requests, whatever its baseline",
    ),
    Option(
        "output",
        "--output",
        ("CONTROLLER_OUTPUT", "AWS_EMF_AGENT_ENDPOINT"),
        parse_output,
        "where EMF goes: stdout, tcp://HOST:PORT, udp://HOST:PORT, file:PATH",
    ),
    Option("namespace", "--namespace", ("AWS_EMF_NAMESPACE",), cloudwatch_namespace, "CloudWatch namespace"),
    Option(
        "log_level",
        "--log-level",
        ("CONTROLLER_LOG_LEVEL",),
        choice("debug", "info", "warning", "error"),
        "level of the controller's JSON log lines on stderr",
    ),
)

ENV_VARS = environment_variables(OPTIONS)
COMMANDS = {
    "run": "the service, one per cluster",
    "resume": "resume paused GPU drains (clears the pause and the hour's reports)",
    "status": "print the state: what is draining, waiting, paused",
}

DESCRIPTION = (
    "The fleet's one controller: reads the hosts' GPU fault reports from one SQS queue, checks them against "
    "ECS, and drains and replaces instances within fleet-wide bounds; with --service and --topic-arn it owns "
    "model sync's fan-out queues, one per task (docs/controller.md)."
)


def build_parser(prog: str = "python -m controller") -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog="Every setting can also come from its environment variable; a flag wins. AWS endpoints, region and "
        "credentials come from the standard AWS settings (AWS_ENDPOINT_URL, AWS_REGION, the task role).",
    )
    # One positional: the commands share the settings (a subparser each would take none of them)
    parser.add_argument(
        "command",
        nargs="?",
        default="run",
        choices=tuple(COMMANDS),
        help="; ".join(f"{name}: {text}" for name, text in COMMANDS.items()) + " (default: run)",
    )
    add_options(parser, OPTIONS, Settings())
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def load(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[str, Settings]:
    """(command, settings) from flags and environment; raises ConfigError naming the bad setting."""
    environ = os.environ if environ is None else environ
    args, values = parse(build_parser(), OPTIONS, argv, environ)
    settings = Settings(**values)
    if not settings.cluster:
        raise ConfigError("--cluster (or CONTROLLER_CLUSTER) is required")
    if bool(settings.state_bucket) == bool(settings.state_file):
        raise ConfigError(
            "give one place for the state: --state-bucket (CONTROLLER_STATE_BUCKET) or --state-file "
            "(CONTROLLER_STATE_FILE)"
        )
    if args.command == "run" and not settings.queue_url:
        raise ConfigError("--controller-queue-url (or CONTROLLER_QUEUE_URL) is required")
    if (settings.topic_arn or settings.bucket) and not settings.service:
        raise ConfigError(
            "--topic-arn and --bucket need --service (CONTROLLER_SERVICE): the fan-out's queues are one per task of "
            "the Triton service, and the fleet's size is its running task count"
        )
    if settings.service and not (settings.topic_arn or settings.bucket):
        raise ConfigError(
            "--service (CONTROLLER_SERVICE) does nothing without --topic-arn (the fan-out) or --bucket (the fleet's "
            "size for rollouts)"
        )
    if settings.rollouts == "on" and not (settings.bucket and settings.service):
        raise ConfigError(
            "--rollouts on (CONTROLLER_ROLLOUTS) needs --bucket (model sync's bucket, where the state lives) and "
            "--service (the Triton service: its running tasks are the hosts)"
        )
    if settings.prefix and not settings.bucket:
        raise ConfigError("--prefix (CONTROLLER_PREFIX) is model sync's key prefix: it needs --bucket")
    return str(args.command), settings
