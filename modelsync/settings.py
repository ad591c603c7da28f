"""Settings: read once at the entry point from flags and environment, validated, frozen.

Every setting is a flag and an environment variable (flag wins, then the
variable, then the default); ``python -m modelsync --help`` lists them. The
S3 and SQS endpoints and the credentials are not settings of ours: boto3
reads them from the standard AWS chain (``AWS_ENDPOINT_URL``,
``AWS_REGION``, the ECS task role...).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from exporter.config import choice, given, http_url, non_negative, valid_namespace
from telemetry.sinks import Output, parse_output

from . import __version__
from .fanout import check_queue_prefix, check_topic_arn


class ConfigError(ValueError):
    """A setting is invalid; the message names the flag or variable and the value."""


GiB = 1024**3


@dataclass(frozen=True)
class Settings:
    bucket: str = ""
    prefix: str = ""
    repository: Path = Path("/mnt/triton-models")
    store: Path = Path("")  # empty: <repository>.store, beside it
    triton_url: str = "http://localhost:8000"
    queue_url: str = ""
    topic_arn: str = ""  # SNS fan-out: each daemon subscribes a queue of its own (modelsync/fanout.py)
    queue_name_prefix: str = "modelsync-"
    interval: float = 60.0
    output: Output = Output("stdout")  # noqa: RUF009 - a frozen dataclass
    namespace: str = "Triton"
    allow_unverified: bool = False
    delete_removed: bool = False
    max_archive_bytes: int = 64 * GiB
    max_extracted_bytes: int = 128 * GiB
    max_entries: int = 10_000
    max_ratio: float = 100.0
    min_free_bytes: int = 1 * GiB
    hash_tag_wait: float = 15.0
    load_timeout: float = 600.0
    host: str = ""
    log_level: str = "info"
    once: bool = False

    @property
    def store_root(self) -> Path:
        return (
            self.store
            if str(self.store) not in ("", ".")
            else self.repository.with_name(self.repository.name + ".store")
        )


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def _bucket(text: str) -> str:
    if not _BUCKET.fullmatch(text) or ".." in text:
        raise ValueError("must be an S3 bucket name (3-63 characters: a-z, 0-9, '.', '-')")
    return text


def _prefix(text: str) -> str:
    if text.startswith("/"):
        raise ValueError("an S3 key prefix does not start with '/'")
    return text


def _path(text: str) -> Path:
    if not text.startswith("/"):
        raise ValueError("must be an absolute path")
    return Path(os.path.normpath(text))


def _queue_url(text: str) -> str:
    return http_url(text) if text else ""


def _positive(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError("must be a positive number")
    return value


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes, with an optional binary suffix: ``1048576``, ``512M``, ``10GiB``."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ValueError("must be a byte count, optionally with K, M, G or T (binary: 1G = 1024^3)")
    unit = (m.group(2) or "B")[0].upper()
    return int(m.group(1)) * {"B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}[unit]


def _positive_size(text: str) -> int:
    value = parse_size(text)
    if value <= 0:
        raise ValueError("must be more than 0 bytes")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def _host(text: str) -> str:
    if not text.strip() or not text.isprintable():
        raise ValueError("must be a printable, non-empty name")
    return text.strip()


# (field, flag, environment variables in priority order, parser, help); booleans are flags
OPTIONS: list[tuple[str, str, tuple[str, ...], Callable[[str], object], str]] = [
    ("bucket", "--bucket", ("MODELSYNC_BUCKET",), _bucket, "S3 bucket holding <prefix><model>.zip archives (required)"),
    ("prefix", "--prefix", ("MODELSYNC_PREFIX",), _prefix, "key prefix, used literally (include a trailing '/')"),
    (
        "repository",
        "--repository",
        ("MODELSYNC_REPOSITORY",),
        _path,
        "Triton's model repository: holds only symbolic links, one per model, to complete store directories",
    ),
    (
        "store",
        "--store",
        ("MODELSYNC_STORE",),
        _path,
        "where archives are extracted, <store>/<model>/<sha256>/; may be shared by the daemons of several "
        "repositories on one machine (one download each archive); never inside the repository (default: "
        "<repository>.store beside it)",
    ),
    ("triton_url", "--triton-url", ("TRITON_URL",), http_url, "Triton HTTP API (explicit model-control mode)"),
    (
        "queue_url",
        "--queue-url",
        ("MODELSYNC_QUEUE_URL",),
        _queue_url,
        "optional SQS queue fed by S3 or EventBridge object events; events only trigger a reconcile of the model",
    ),
    (
        "topic_arn",
        "--topic-arn",
        ("MODELSYNC_TOPIC_ARN",),
        check_topic_arn,
        "optional SNS topic fed by the bucket's object events: each daemon creates its own SQS queue, subscribes "
        "it, and deletes it at a clean stop, so every host hears every event (excludes --queue-url)",
    ),
    (
        "queue_name_prefix",
        "--queue-name-prefix",
        ("MODELSYNC_QUEUE_NAME_PREFIX",),
        check_queue_prefix,
        "name prefix of the per-daemon queues with --topic-arn (a 12-character id follows); every daemon deletes "
        "queues named so whose heartbeat is older than 10 minutes",
    ),
    ("interval", "--interval", ("MODELSYNC_INTERVAL",), _positive, "seconds between full reconciles with S3"),
    (
        "output",
        "--output",
        ("MODELSYNC_OUTPUT", "AWS_EMF_AGENT_ENDPOINT"),
        parse_output,
        "where EMF goes: stdout, tcp://HOST:PORT, udp://HOST:PORT, file:PATH",
    ),
    ("namespace", "--namespace", ("AWS_EMF_NAMESPACE",), valid_namespace, "CloudWatch namespace"),
    (
        "allow_unverified",
        "--allow-unverified",
        ("MODELSYNC_ALLOW_UNVERIFIED",),
        _bool,
        "install archives that carry no expected sha256 (metadata or tag); refused otherwise",
    ),
    (
        "delete_removed",
        "--delete-removed",
        ("MODELSYNC_DELETE_REMOVED",),
        _bool,
        "unload and delete models whose archive left S3; otherwise they are kept and reported",
    ),
    (
        "max_archive_bytes",
        "--max-archive-bytes",
        ("MODELSYNC_MAX_ARCHIVE_BYTES",),
        _positive_size,
        "largest archive downloaded (K/M/G/T suffixes)",
    ),
    (
        "max_extracted_bytes",
        "--max-extracted-bytes",
        ("MODELSYNC_MAX_EXTRACTED_BYTES",),
        _positive_size,
        "largest total of uncompressed entry sizes in one archive",
    ),
    ("max_entries", "--max-entries", ("MODELSYNC_MAX_ENTRIES",), _positive_int, "most entries in one archive"),
    (
        "max_ratio",
        "--max-ratio",
        ("MODELSYNC_MAX_RATIO",),
        _positive,
        "highest compression ratio of an entry over 1 MiB, and of the whole archive (zip bombs)",
    ),
    (
        "min_free_bytes",
        "--min-free-bytes",
        ("MODELSYNC_MIN_FREE_BYTES",),
        parse_size,
        "free space that must remain on the store's filesystem after download and extraction",
    ),
    (
        "hash_tag_wait",
        "--hash-tag-wait",
        ("MODELSYNC_HASH_TAG_WAIT",),
        non_negative,
        "seconds to wait for a sha256 object tag when an event arrives before the tag",
    ),
    (
        "load_timeout",
        "--load-timeout",
        ("MODELSYNC_LOAD_TIMEOUT",),
        _positive,
        "seconds one Triton load call may take (the call blocks until loaded or failed)",
    ),
    ("host", "--host-id", ("MODELSYNC_HOST",), _host, "this host's name in the EMF properties (default: hostname)"),
    (
        "log_level",
        "--log-level",
        ("MODELSYNC_LOG_LEVEL",),
        choice("debug", "info", "warning", "error"),
        "level of modelsync's own JSON log lines on stderr",
    ),
]
BOOLEAN_FIELDS = {f.name for f in fields(Settings) if f.type in ("bool", bool)} - {"once"}
ENV_VARS = tuple(env for _, _, envs, _, _ in OPTIONS for env in envs)


def _shown(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 and value % 1024 == 0:
        for unit in ("T", "G", "M", "K"):
            size = {"T": 1024**4, "G": 1024**3, "M": 1024**2, "K": 1024}[unit]
            if value % size == 0:
                return f"{value // size}{unit}"
    return str(value)


def build_parser(prog: str = "python -m modelsync") -> argparse.ArgumentParser:
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Keep Triton's model repository in sync with s3://BUCKET/PREFIX<model>.zip archives: verify, "
        "extract into a store, flip a symbolic link atomically, load in Triton, roll back when the load fails.",
        epilog="Every setting can also come from its environment variable; a flag wins. S3/SQS endpoint, region "
        "and credentials come from the standard AWS settings (AWS_ENDPOINT_URL, AWS_REGION, the task role).",
    )
    for field, flag, envs, _, text in OPTIONS:
        default = getattr(defaults, field)
        if field in BOOLEAN_FIELDS:
            parser.add_argument(
                flag,
                dest=field,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{text} (default: {str(default).lower()}) [env: {', '.join(envs)}]",
            )
            continue
        shown = {
            "bucket": "",
            "store": "",
            "host": "",
            "prefix": " (default: empty)",
            "queue_url": " (default: none)",
            "topic_arn": " (default: none)",
        }.get(field, f" (default: {_shown(default)})")
        parser.add_argument(
            flag, dest=field, metavar=field.split("_")[-1].upper(), help=f"{text}{shown} [env: {', '.join(envs)}]"
        )
    parser.add_argument(
        "--once",
        action="store_true",
        help="reconcile once and exit: 0 when every model in S3 is installed and READY, 1 "
        "otherwise (one line per failed model on stderr)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def load(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from flags and environment; raises ConfigError naming the bad setting."""
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(list(argv))
    values: dict[str, Any] = {"once": args.once}  # each converted by its option's parser
    converters = {field: convert for field, _, _, convert, _ in OPTIONS}
    for field, raw, origin in given(args, OPTIONS, environ):
        if isinstance(raw, bool):  # a --flag/--no-flag given on the command line
            values[field] = raw
            continue
        try:
            values[field] = converters[field](raw)
        except ValueError as exc:
            raise ConfigError(f"{origin}={raw!r}: {exc}") from None
    if not values.get("bucket"):
        raise ConfigError("--bucket (or MODELSYNC_BUCKET) is required")
    if not values.get("host"):
        values["host"] = socket.gethostname() or "unknown"
    settings = Settings(**values)
    repo, store = settings.repository, settings.store_root
    if repo == store or store.is_relative_to(repo) or repo.is_relative_to(store):
        raise ConfigError(
            f"--store={store}: must be outside --repository={repo} (every directory there is a "
            "model to Triton) and must not contain it"
        )
    if settings.queue_url and settings.topic_arn:
        raise ConfigError(
            "--queue-url (MODELSYNC_QUEUE_URL) and --topic-arn (MODELSYNC_TOPIC_ARN) are both set: with a topic "
            "each daemon reads a queue of its own, with a shared queue each event reaches one host only; set one"
        )
    if settings.max_extracted_bytes < 1 or settings.max_archive_bytes < 1:
        raise ConfigError("archive limits must be positive")
    return settings
