"""Settings: read once at the entry point from flags and environment, validated, frozen.

Every setting is a flag and an environment variable (flag wins, then the
variable, then the default); ``python -m modelsync --help`` lists them. The
S3 and SQS endpoints and the credentials are not settings of ours: boto3
reads them from the standard AWS chain (``AWS_ENDPOINT_URL``,
``AWS_REGION``, the ECS task role...).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from telemetry.settings import (
    ArgumentParser,
    ConfigError,
    Option,
    add_commands,
    add_options,
    boolean,
    choice,
    cloudwatch_namespace,
    command_first,
    environment_variables,
    http_url,
    non_negative,
    number,
    parse,
    positive,
    positive_int,
    positive_size,
    printable,
    shown_size,
    size,
)
from telemetry.sinks import Output, parse_output
from triton_http import AdminKey, key_from_env

from . import __version__
from .fanout import check_queue_prefix, check_task_queue_prefix, check_topic_arn

__all__ = ["ENV_VARS", "OPTIONS", "ConfigError", "Settings", "build_parser", "load"]

GiB = 1024**3
MiB = 1024**2


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
    fanout: str = "self"  # "controller": the controller makes this task's queue; the daemon only reads it
    interval: float = 60.0
    output: Output = Output("stdout")  # noqa: RUF009 - a frozen dataclass
    namespace: str = "Triton"
    allow_unverified: bool = False
    delete_removed: bool = False
    keep_previous: bool = True  # off: the replaced directory is deleted once the new one is loaded
    max_archive_bytes: int = 64 * GiB
    max_extracted_bytes: int = 128 * GiB
    max_entries: int = 10_000
    max_ratio: float = 100.0
    min_free_bytes: int = 1 * GiB
    hash_tag_wait: float = 15.0
    load_timeout: float = 600.0
    part_size: int = 8 * MiB
    connections: int = 32
    parallel_models: int = 3  # models of one pass installing at once (one loads while the next downloads)
    model_order: tuple[str, ...] = ()  # these first, in this order; then the largest first
    host: str = ""
    log_level: str = "info"
    once: bool = False
    # Safe rollouts (modelsync/rollout.py): off while canary_fraction is 0.
    canary_fraction: float = 0.0
    bake_seconds: float = 600.0
    bake_min_requests: int = 100
    max_failure_increase: float = 0.01
    max_latency_ratio: float = 1.5
    triton_metrics_url: str = "http://localhost:8002/metrics"
    # Who decides rollouts: self (the daemons, by compare-and-swap on the state; outside ECS) or controller
    # (python -m controller decides; this daemon reports to --controller-queue-url and follows the state)
    rollouts: str = "self"
    controller_queue_url: str = ""
    ignored: tuple[str, ...] = ()  # rollout settings given in controller mode: the controller's (warned once)
    # Optional provenance (modelsync/signing.py): an OpenSSF model-signing signature (<key>.sig) on every artifact
    require_signature: bool = False
    signature_public_key: str = ""  # the EC public key's PEM (given as text or as a path to the file)
    # Opens Triton's repository API where Triton restricts it: TRITON_ADMIN_KEY only (triton_http/admin.py)
    triton_admin_key: AdminKey | None = None

    @property
    def rollouts_on(self) -> bool:
        """Safe rollouts, decided by the daemons (--canary-fraction) or by the controller."""
        return self.canary_fraction > 0 or self.rollouts == "controller"

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
    """A key prefix is a folder: ``models`` is read as ``models/``, so that neither the daemon nor a grant on
    ``<prefix>*`` reaches ``models-private/...``."""
    if text.startswith("/"):
        raise ValueError("an S3 key prefix does not start with '/'")
    return text if not text or text.endswith("/") else text + "/"


def _path(text: str) -> Path:
    if not text.startswith("/"):
        raise ValueError("must be an absolute path")
    return Path(os.path.normpath(text))


def _part_size(text: str) -> int:
    value = size(text)
    if not 64 * 1024 <= value <= 5 * GiB:
        raise ValueError("must be between 64K and 5G")
    return value


def _connections(text: str) -> int:
    value = positive_int(text)
    if value > 64:
        raise ValueError("must be between 1 and 64")
    return value


def _parallel_models(text: str) -> int:
    value = positive_int(text)
    if value > 16:
        raise ValueError("must be between 1 and 16")
    return value


def _model_order(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if len(names) > 1000:
        raise ValueError("at most 1000 names")
    return names


def _queue_url(text: str) -> str:
    return http_url(text) if text else ""


_CURVES = ("secp256r1", "secp384r1", "secp521r1")  # what model_signing's EC-key signer accepts


def _public_key(text: str) -> str:
    """The PEM of an EC public key given as text (``-----BEGIN PUBLIC KEY-----...``, newlines or ``\\n``) or as
    an absolute path to a PEM file; ValueError naming what is wrong. Checked at start; cryptography is
    imported only when a key is given."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        pem = text.replace("\\n", "\n")
    elif text.startswith("/"):
        try:
            with open(text, "rb") as f:
                pem = f.read(64 * 1024 + 1).decode("ascii", "replace")
        except OSError as exc:
            raise ValueError(f"cannot read the public key file: {exc.strerror or exc}") from None
        if len(pem) > 64 * 1024:
            raise ValueError("the public key file is larger than 64 KiB: not a PEM public key")
    else:
        raise ValueError("must be a PEM public key ('-----BEGIN PUBLIC KEY-----...') or an absolute path to one")
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:  # pragma: no cover - the image installs it with model-signing
        raise ValueError("needs the cryptography package (installed with model-signing)") from None
    try:
        key = serialization.load_pem_public_key(pem.encode("ascii", "replace"))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a PEM public key: {str(exc)[:120]}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in _CURVES:
        raise ValueError(f"must be an elliptic-curve key on {', '.join(_CURVES)} (what model_signing signs with)")
    return pem.strip() + "\n"


def _fraction(text: str) -> float:
    value = number(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be between 0 (off) and 1")
    return value


def _ratio_increase(text: str) -> float:
    value = number(text)
    if not 0.0 <= value < 1.0:
        raise ValueError("must be at least 0 and below 1 (an absolute increase of the failure ratio)")
    return value


def _latency_ratio(text: str) -> float:
    value = number(text)
    if not value >= 1.0:
        raise ValueError("must be at least 1 (the new artifact's latency over the previous one's)")
    return value


OPTIONS: tuple[Option, ...] = (
    Option(
        "bucket",
        "--bucket",
        ("MODELSYNC_BUCKET",),
        _bucket,
        "S3 bucket holding <prefix><model>.zip archives or <prefix><model>/manifest.json directory models (required)",
        shown="",
    ),
    Option(
        "prefix",
        "--prefix",
        ("MODELSYNC_PREFIX",),
        _prefix,
        "key prefix, a folder: a missing trailing '/' is added (models -> models/)",
        shown="empty",
    ),
    Option(
        "repository",
        "--repository",
        ("MODELSYNC_REPOSITORY",),
        _path,
        "Triton's model repository: holds only symbolic links, one per model, to complete store directories",
        metavar="DIR",
    ),
    Option(
        "store",
        "--store",
        ("MODELSYNC_STORE",),
        _path,
        "where archives are extracted, <store>/<model>/<sha256>/; may be shared by the daemons of several "
        "repositories on one machine (one download each archive); never inside the repository",
        metavar="DIR",
        shown="<repository>.store beside it",
    ),
    Option("triton_url", "--triton-url", ("TRITON_URL",), http_url, "Triton HTTP API (explicit model-control mode)"),
    Option(
        "queue_url",
        "--queue-url",
        ("MODELSYNC_QUEUE_URL",),
        _queue_url,
        "optional SQS queue fed by S3 or EventBridge object events; events only trigger a reconcile of the model",
        metavar="URL",
        shown="none",
    ),
    Option(
        "topic_arn",
        "--topic-arn",
        ("MODELSYNC_TOPIC_ARN",),
        check_topic_arn,
        "optional SNS topic fed by the bucket's object events: each daemon creates its own SQS queue, subscribes "
        "it, and deletes it at a clean stop, so every host hears every event (excludes --queue-url)",
        shown="none",
    ),
    Option(
        "queue_name_prefix",
        "--queue-name-prefix",
        ("MODELSYNC_QUEUE_NAME_PREFIX",),
        check_queue_prefix,
        "name prefix of the per-daemon queues with --topic-arn (a 12-character id follows); every daemon deletes "
        "queues named so whose heartbeat is older than 10 minutes. With --fanout controller: <prefix><ECS task id>, "
        "the controller's --queue-name-prefix",
    ),
    Option(
        "fanout",
        "--fanout",
        ("MODELSYNC_FANOUT",),
        choice("self", "controller"),
        "who owns the --topic-arn queues: self (each daemon creates, subscribes and sweeps its own; outside ECS) "
        "or controller (python -m controller makes one per ECS task; the daemon finds its own by name, only "
        "receives and deletes messages, and a rollout sizes its canary share from the controller's count of "
        "running tasks)",
    ),
    Option(
        "interval",
        "--interval",
        ("MODELSYNC_INTERVAL",),
        positive,
        "seconds between full reconciles with S3",
        metavar="SECONDS",
    ),
    Option(
        "output",
        "--output",
        ("MODELSYNC_OUTPUT", "AWS_EMF_AGENT_ENDPOINT"),
        parse_output,
        "where EMF goes: stdout, tcp://HOST:PORT, udp://HOST:PORT, file:PATH",
    ),
    Option("namespace", "--namespace", ("AWS_EMF_NAMESPACE",), cloudwatch_namespace, "CloudWatch namespace"),
    Option(
        "allow_unverified",
        "--allow-unverified",
        ("MODELSYNC_ALLOW_UNVERIFIED",),
        boolean,
        "install archives that carry no expected sha256 (metadata or tag); refused otherwise",
        boolean=True,
        shown="false",
    ),
    Option(
        "delete_removed",
        "--delete-removed",
        ("MODELSYNC_DELETE_REMOVED",),
        boolean,
        "unload and delete models whose archive left S3; otherwise they are kept and reported",
        boolean=True,
        shown="false",
    ),
    Option(
        "keep_previous",
        "--keep-previous",
        ("MODELSYNC_KEEP_PREVIOUS",),
        boolean,
        "keep each model's previous store directory after an update (up to two versions on disk per model); "
        "--no-keep-previous deletes it once the new one is loaded (one version, two only during an update)",
        boolean=True,
        shown="true",
    ),
    Option(
        "max_archive_bytes",
        "--max-archive-bytes",
        ("MODELSYNC_MAX_ARCHIVE_BYTES",),
        positive_size,
        "largest archive downloaded (K/M/G/T suffixes)",
        shown=shown_size(64 * GiB),
    ),
    Option(
        "max_extracted_bytes",
        "--max-extracted-bytes",
        ("MODELSYNC_MAX_EXTRACTED_BYTES",),
        positive_size,
        "largest total of uncompressed entry sizes in one archive",
        shown=shown_size(128 * GiB),
    ),
    Option("max_entries", "--max-entries", ("MODELSYNC_MAX_ENTRIES",), positive_int, "most entries in one archive"),
    Option(
        "max_ratio",
        "--max-ratio",
        ("MODELSYNC_MAX_RATIO",),
        positive,
        "highest compression ratio of an entry over 1 MiB, and of the whole archive (zip bombs)",
    ),
    Option(
        "min_free_bytes",
        "--min-free-bytes",
        ("MODELSYNC_MIN_FREE_BYTES",),
        size,
        "free space that must remain on the store's filesystem after download and extraction",
        shown=shown_size(GiB),
    ),
    Option(
        "hash_tag_wait",
        "--hash-tag-wait",
        ("MODELSYNC_HASH_TAG_WAIT",),
        non_negative,
        "seconds to wait for a sha256 object tag when an event arrives before the tag",
        metavar="SECONDS",
    ),
    Option(
        "load_timeout",
        "--load-timeout",
        ("MODELSYNC_LOAD_TIMEOUT",),
        positive,
        "seconds one Triton load call may take (the call blocks until loaded or failed)",
        metavar="SECONDS",
    ),
    Option(
        "part_size",
        "--part-size",
        ("MODELSYNC_PART_SIZE",),
        _part_size,
        "bytes per ranged GET of a download; an archive of at most one part is one plain GET (K/M/G suffixes)",
        metavar="BYTES",
        shown=shown_size(8 * MiB),
    ),
    Option(
        "connections",
        "--connections",
        ("MODELSYNC_CONNECTIONS",),
        _connections,
        "the most ranged GETs in flight, all downloads together (S3 caps each connection at tens of MB/s; each "
        "download starts at 16 and doubles while its throughput grows: docs/modelsync.md); also the S3 client's "
        "connection pool",
        metavar="N",
    ),
    Option(
        "parallel_models",
        "--parallel-models",
        ("MODELSYNC_PARALLEL_MODELS",),
        _parallel_models,
        "models of one pass installing at once, sharing --connections: one model loads while the next "
        "downloads (1: one after another)",
        metavar="N",
    ),
    Option(
        "model_order",
        "--model-order",
        ("MODELSYNC_MODEL_ORDER",),
        _model_order,
        "models to install first, in this order (comma-separated); the others follow, the largest first",
        metavar="NAME,...",
        shown="none",
    ),
    Option(
        "host",
        "--host-id",
        ("MODELSYNC_HOST",),
        printable,
        "this host's name in the EMF properties",
        shown="hostname",
    ),
    Option(
        "canary_fraction",
        "--canary-fraction",
        ("MODELSYNC_CANARY_FRACTION",),
        _fraction,
        "safe rollouts: a new artifact of a model the fleet serves goes first to ceil(F x live hosts) hosts (at "
        "least one), and to the others only once promoted on evidence from the canaries' own Triton; 0: off, "
        "every host at once (needs --topic-arn: live hosts are counted by their fan-out queues)",
    ),
    Option(
        "bake_seconds",
        "--bake-seconds",
        ("MODELSYNC_BAKE_SECONDS",),
        positive,
        "how long the canaries serve a new artifact before the verdict",
    ),
    Option(
        "bake_min_requests",
        "--bake-min-requests",
        ("MODELSYNC_BAKE_MIN_REQUESTS",),
        positive_int,
        "fewer requests than this on the canaries during the bake is no evidence: the rollout keeps baking",
    ),
    Option(
        "max_failure_increase",
        "--max-failure-increase",
        ("MODELSYNC_MAX_FAILURE_INCREASE",),
        _ratio_increase,
        "reject when the canaries' failure ratio exceeds the baseline's by more than this (absolute)",
        metavar="FRACTION",
    ),
    Option(
        "max_latency_ratio",
        "--max-latency-ratio",
        ("MODELSYNC_MAX_LATENCY_RATIO",),
        _latency_ratio,
        "reject when the canaries' average latency (and p95, with Triton's summary latencies and a bake of 60 s "
        "or more) exceeds the baseline's by this factor",
    ),
    Option(
        "rollouts",
        "--rollouts",
        ("MODELSYNC_ROLLOUTS",),
        choice("self", "controller"),
        "who decides safe rollouts: self (the daemons, with --canary-fraction; outside ECS) or controller (python -m "
        "controller decides; this daemon reports its evidence to --controller-queue-url, follows the state and "
        "never writes it; the rollout settings are then the controller's)",
    ),
    Option(
        "controller_queue_url",
        "--controller-queue-url",
        ("MODELSYNC_CONTROLLER_QUEUE_URL", "CONTROLLER_QUEUE_URL"),
        http_url,
        "the controller's SQS queue (--rollouts controller): rollout evidence and events are sent there",
        shown="none",
    ),
    Option(
        "triton_metrics_url",
        "--triton-metrics-url",
        ("TRITON_METRICS_URL",),
        http_url,
        "Triton's Prometheus endpoint, the canaries' evidence (only read with --canary-fraction)",
    ),
    Option(
        "require_signature",
        "--require-signature",
        ("MODELSYNC_REQUIRE_SIGNATURE",),
        boolean,
        "install only artifacts with a valid OpenSSF model-signing signature beside them (<key>.sig, signed by "
        "--signature-public-key, for the model's own name, with the per-file digests of the bytes installed); "
        "bundles are refused while it is on",
        boolean=True,
        shown="false",
    ),
    Option(
        "signature_public_key",
        "--signature-public-key",
        ("MODELSYNC_SIGNATURE_PUBLIC_KEY",),
        _public_key,
        "the signers' EC public key (P-256/384/521): its PEM as text ('-----BEGIN PUBLIC KEY-----...', newlines "
        "or \\n) or an absolute path to a PEM file; required by --require-signature",
        metavar="PEM|FILE",
        shown="none",
    ),
    Option(
        "log_level",
        "--log-level",
        ("MODELSYNC_LOG_LEVEL",),
        choice("debug", "info", "warning", "error"),
        "level of modelsync's own JSON log lines on stderr",
    ),
)

ENV_VARS = environment_variables(OPTIONS)
# The settings a controller-decided rollout takes from the controller (accepted here, warned once, ignored).
ROLLOUT_SETTINGS = ("canary_fraction", "bake_seconds", "bake_min_requests", "max_failure_increase", "max_latency_ratio")


DESCRIPTION = (
    "Keep Triton's model repository in sync with s3://BUCKET/PREFIX<model>.zip archives: verify, extract into a "
    "store, flip a symbolic link atomically, load in Triton, roll back when the load fails."
)


# python -m modelsync COMMAND: each reads its own arguments (modelsync/__main__.py dispatches it)
SUBCOMMANDS = {"rollout": "status, promote, reject: see and steer the safe rollouts (--canary-fraction)"}


def build_parser(
    prog: str = "python -m modelsync", description: str = DESCRIPTION, commands: Mapping[str, str] | None = None
) -> argparse.ArgumentParser:
    """``commands``: the subcommands the entry point dispatches, listed in --help (none for the health check)."""
    parser = ArgumentParser(
        prog=prog,
        description=description,
        epilog="Every setting can also come from its environment variable; a flag wins. S3/SQS endpoint, region "
        "and credentials come from the standard AWS settings (AWS_ENDPOINT_URL, AWS_REGION, the task role).",
    )
    add_commands(parser, commands or {})
    add_options(parser, OPTIONS, Settings())
    parser.add_argument(
        "--once",
        action="store_true",
        help="reconcile once and exit: 0 when every model in S3 is installed and READY, 1 "
        "otherwise (one line per failed model on stderr)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def load(
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    prog: str = "python -m modelsync",
    description: str = DESCRIPTION,
    commands: Mapping[str, str] | None = None,
) -> Settings:
    """Settings from flags and environment; raises ConfigError naming the bad setting. ``prog``,
    ``description`` and ``commands``: the command's own, for its --help (the health check reads the daemon's
    settings)."""
    environ = os.environ if environ is None else environ
    parser = build_parser(prog, description, commands)
    args, values = parse(parser, OPTIONS, argv, environ)
    command_first(parser, args)
    values["once"] = args.once
    try:
        values["triton_admin_key"] = key_from_env(environ)  # a secret: its variable only, never a flag
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
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
    if settings.fanout == "controller":
        if not settings.topic_arn:
            raise ConfigError(
                "--fanout controller (MODELSYNC_FANOUT) needs --topic-arn (MODELSYNC_TOPIC_ARN): the queue the "
                "controller makes for this task is subscribed to that topic, in its region"
            )
        try:
            check_task_queue_prefix(settings.queue_name_prefix)
        except ValueError as exc:
            raise ConfigError(f"--queue-name-prefix={settings.queue_name_prefix!r}: {exc}") from None
    if settings.rollouts == "controller":
        if not settings.controller_queue_url:
            raise ConfigError(
                "--rollouts controller (MODELSYNC_ROLLOUTS) needs --controller-queue-url "
                "(MODELSYNC_CONTROLLER_QUEUE_URL): the controller's queue the evidence is sent to"
            )
        given = tuple(f for f in ROLLOUT_SETTINGS if f in values)
        settings = replace(settings, canary_fraction=0.0, ignored=given)
    elif settings.canary_fraction > 0 and not settings.topic_arn:
        raise ConfigError(
            "--canary-fraction (MODELSYNC_CANARY_FRACTION) needs --topic-arn (MODELSYNC_TOPIC_ARN): the live hosts "
            "are counted by their fan-out queues, and a verdict reaches every host through the topic"
        )
    if settings.require_signature and not settings.signature_public_key:
        raise ConfigError(
            "--require-signature (MODELSYNC_REQUIRE_SIGNATURE) needs --signature-public-key "
            "(MODELSYNC_SIGNATURE_PUBLIC_KEY): the PEM of the key the models are signed with, or a path to it"
        )
    if settings.signature_public_key and not settings.require_signature:
        raise ConfigError(
            "--signature-public-key (MODELSYNC_SIGNATURE_PUBLIC_KEY) is set but --require-signature is not: nothing "
            "would be verified; set MODELSYNC_REQUIRE_SIGNATURE=true, or remove the key"
        )
    if settings.require_signature and importlib.util.find_spec("model_signing") is None:
        raise ConfigError("--require-signature needs the model-signing package (pip install model-signing pyOpenSSL)")
    if settings.max_extracted_bytes < 1 or settings.max_archive_bytes < 1:
        raise ConfigError("archive limits must be positive")
    return settings
