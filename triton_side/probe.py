"""Deep health probe for the Triton container, run by the ECS ``healthCheck``: the checks and the command line.

``/v2/health/live`` only proves the HTTP server is up and ``/v2/health/ready``
answers a bare 400 without saying which model is wrong. This probe asks Triton
for the state of every model version, checks each one and, if asked, sends one
synthetic inference per model, then exits 0 (healthy), 1 (unhealthy) or 2
(usage error) with one line per problem.

It runs inside the stock Triton image, which has ``python3`` but none of the
sidecar's packages: standard library only, Python 3.8+ (Ubuntu 20.04 images),
started as ``python3 health.py`` (the few lines next to this file) or as
``python -m exporter health``. Every request shares one deadline (default 4 s,
under ECS's 5 s timeout) so a server that accepts connections and never
answers cannot hang the check. See docs/health.md.

This module holds what the probe checks (:func:`probe`) and its flags and
variables (:func:`main`); the rest is in this folder, each module importing
only the ones after it:

* ``_infer.py``: the ``--smoke`` inference, imported only when asked for;
* ``_report.py``: the results and the lines printed for them;
* ``_http.py``: the HTTP client under one deadline and its size bounds, and the probe's errors;
* ``_jsonparse.py``: the JSON reader with its nesting bound;
* ``_cli.py``: the flag reader shared with ``startup_check.py``.

ECS starts it as a new process every 30 s in every task, so its start-up is
kept small: no argparse unless the command line needs it (``_cli``), no json
(``_jsonparse``), no dataclasses, logging or concurrent.futures, plain threads
for the per-model checks, ``random`` and ``ssl`` only when a check uses them,
and no smoke inference code unless ``--smoke`` is given. Public standard
library modules only: the probe runs on whatever Python the Triton image
brings (tests/unit/triton_side/test_triton_side.py fails on a private import).
"""

from __future__ import annotations

import math
import os
import time

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing takes milliseconds to import; type checkers know the name
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, TypeVar

    T = TypeVar("T")
    R = TypeVar("R")

if TYPE_CHECKING or __package__:  # type checkers see the package import
    from . import _cli, _http, _report
else:  # imported as a top-level module by health.py, from the folder it was copied to
    import _cli
    import _http
    import _report

DEFAULT_URL = "http://localhost:8000"
DEFAULT_DEADLINE = 4.0
# Triton's restricted APIs (--http-restricted-api): the header and the variable the sidecars use too.
ADMIN_HEADER = "triton-admin-key"
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
DEFAULT_JOBS = 4


# --- settings ---------------------------------------------------------------------------------


class Options:
    """The probe's settings, from flags and environment (see :func:`options`)."""

    def __init__(self, json: bool = False, quiet: bool = False) -> None:
        self.url = DEFAULT_URL
        self.models: list[tuple[str, str | None]] | None = None  # None: every version in the index
        self.ignore: list[tuple[str, str | None]] = []
        self.smoke: list[tuple[str, str | None]] | None = None  # None: off; []: every required model
        self.deadline = DEFAULT_DEADLINE
        self.jobs = DEFAULT_JOBS
        self.json = json
        self.quiet = quiet
        self.admin_key = ""  # TRITON_ADMIN_KEY: opens the index and the configurations where Triton restricts them


def _matches(specs: list[tuple[str, str | None]], name: str, version: str) -> bool:
    return any(n == name and (v is None or v == version) for n, v in specs)


# --- the checks -------------------------------------------------------------------------------


def _timed(report: _report.Report, check: str, fn: Callable[[], tuple[T, str]]) -> tuple[T | None, _report.Check]:
    """Run ``fn`` and turn the probe's errors into a failed Check; returns (value, Check)."""
    t0 = time.monotonic()
    value: T | None
    try:
        value, detail = fn()
        result = _report.Check(check, "ok", time.monotonic() - t0, detail)
    except _http.HealthError as exc:
        value, result = None, _report.Check(check, "fail", time.monotonic() - t0, str(exc))
    report.add(result)
    return value, result


def _live(client: _http.Client) -> tuple[None, str]:
    try:
        resp = client.request("GET", "/v2/health/live")
    except _http.ResolveError as exc:
        raise _http.ResolveError(f"{exc}: wrong TRITON_URL, or no resolver to ask") from exc
    except _http.DeadlineExceeded as exc:
        raise _http.DeadlineExceeded(
            f"{exc}: the server accepts connections but does not respond (hung, SIGSTOPped or overloaded)"
        ) from exc
    except _http.ConnectError as exc:
        raise _http.ConnectError(
            f"{exc}: tritonserver is not listening (crashed, still starting, or wrong TRITON_URL)"
        ) from exc
    if resp.status != 200:
        raise _http.ProtocolError(
            f"GET /v2/health/live answered HTTP {resp.status}: {_report.first_line(resp.error_text())}"
        )
    return None, "HTTP 200"


def _index(client: _http.Client) -> tuple[list[dict[str, Any]], str]:
    resp = client.request("POST", "/v2/repository/index", b"{}", {"Content-Type": "application/json"})
    if resp.status != 200:
        hint = ""
        if resp.status == 403 and "restricted" in resp.error_text():
            hint = f" (Triton restricts its repository API: set {ADMIN_KEY_ENV} to the key it was started with)"
        raise _http.ProtocolError(
            f"POST /v2/repository/index answered HTTP {resp.status}: {_report.first_line(resp.error_text())}{hint}"
        )
    body = resp.json()
    if not isinstance(body, list) or not all(isinstance(e, dict) and "name" in e for e in body):
        raise _http.ProtocolError("POST /v2/repository/index did not answer a list of model versions")
    for e in body:
        e["name"], e["version"] = str(e["name"]), str(e.get("version", ""))
    return body, f"{len(body)} model versions listed"


def select(index: list[dict[str, Any]], opts: Options, report: _report.Report) -> list[dict[str, Any]]:
    """Required versions from the index; records a state check for each and returns the READY ones."""
    # Unloaded on purpose (reason "unloaded"), or never loaded: in explicit model-control mode
    # Triton lists such a repository model as {"name": ...} with no version and no state.
    unloaded = {
        (e["name"], e["version"])
        for e in index
        if (e.get("state") == "UNAVAILABLE" and str(e.get("reason", "")).strip() == "unloaded") or "state" not in e
    }
    required: list[dict[str, Any]] = []
    if opts.models is None:
        for e in index:
            if (e["name"], e["version"]) in unloaded:
                continue
            if e.get("state") == "UNLOADING":
                report.add(
                    _report.Check(
                        "state",
                        "skip",
                        0.0,
                        "being unloaded on purpose",
                        e["name"],
                        e["version"],
                        "UNLOADING",
                    )
                )
                continue
            required.append(e)
    else:
        for name, version in opts.models:
            hits = [e for e in index if e["name"] == name and (version is None or e["version"] == version)]
            if version is None and any((e["name"], e["version"]) not in unloaded for e in hits):
                hits = [e for e in hits if (e["name"], e["version"]) not in unloaded]
            if not hits and not _matches(opts.ignore, name, version or ""):
                report.add(
                    _report.Check(
                        "state",
                        "fail",
                        0.0,
                        "not in the repository index (wrong name, or not in the model repository)",
                        name,
                        version,
                        "MISSING",
                    )
                )
                report.required.append(name if version is None else f"{name}/{version}")
            required += [e for e in hits if e not in required]
    required = [e for e in required if not _matches(opts.ignore, e["name"], e["version"])]
    ready = []
    for e in required:
        name, version, state = e["name"], e["version"], str(e.get("state", "UNKNOWN"))
        report.required.append(f"{name}/{version}" if version else name)
        reason = _report.first_line(e.get("reason", "")) or None
        if state == "READY":
            report.add(_report.Check("state", "ok", 0.0, "READY", name, version, state))
            ready.append(e)
        elif state == "LOADING":
            report.add(
                _report.Check(
                    "state",
                    "fail",
                    0.0,
                    "still loading (normal during the ECS startPeriod; stuck if it lasts longer)",
                    name,
                    version,
                    state,
                    reason,
                )
            )
        elif "state" not in e:
            detail = "in the repository but never loaded (explicit model control: add it to --load-model)"
            report.add(_report.Check("state", "fail", 0.0, detail, name, version or None, "NOT LOADED"))
        elif state == "UNAVAILABLE" and reason == "unloaded":
            report.add(
                _report.Check(
                    "state",
                    "fail",
                    0.0,
                    "unloaded on purpose, but required (load it, or drop it from --models/HEALTH_MODELS)",
                    name,
                    version,
                    state,
                    reason,
                )
            )
        else:
            report.add(_report.Check("state", "fail", 0.0, reason or "not ready", name, version, state, reason))
    return ready


def _ready(client: _http.Client, name: str, version: str) -> tuple[None, str]:
    seg = _http.segment(name)
    if seg is None:
        raise _http.Unsynthesisable("name cannot be sent in an HTTP path; READY in the index")
    resp = client.request("GET", f"/v2/models/{seg}/versions/{version}/ready")
    if resp.status != 200:
        raise _http.ProtocolError(
            f"index says READY but the ready endpoint answered HTTP {resp.status}: "
            f"{_report.first_line(resp.error_text()) or 'no reason given'}"
        )
    return None, "HTTP 200"


def _smoke(client: _http.Client, name: str, version: str, explicit: bool) -> tuple[str, str]:
    """The smoke inference of one model version (``_infer.smoke``), its module imported on the first call.

    Only ``--smoke`` runs reach this. Imported at the top, _infer and the json
    it writes its requests with would cost every default run (every 30 s in
    every task) 5.1 ms by ``python3 -X importtime -I -S`` on Python 3.11, json
    4.9 ms of it (re, enum), for code that run never uses.
    """
    if TYPE_CHECKING or __package__:
        from ._infer import smoke
    else:
        from _infer import smoke
    return smoke(client, name, version, explicit)


def _version_checks(client: _http.Client, e: dict[str, Any], smoke: bool, explicit: bool) -> list[_report.Check]:
    name, version = e["name"], e["version"]
    out: list[_report.Check] = []
    t0 = time.monotonic()
    try:
        _, detail = _ready(client, name, version)
        out.append(_report.Check("ready", "ok", time.monotonic() - t0, detail, name, version, "READY"))
    except _http.Unsynthesisable as exc:
        out.append(_report.Check("ready", "skip", time.monotonic() - t0, str(exc), name, version, "READY"))
    except _http.HealthError as exc:
        out.append(_report.Check("ready", "fail", time.monotonic() - t0, str(exc), name, version, "READY"))
        if smoke:
            out.append(_report.Check("smoke", "skip", 0.0, "not ready", name, version))
        return out
    if smoke:
        t0 = time.monotonic()
        try:
            status, detail = _smoke(client, name, version, explicit)
        except _http.HealthError as exc:
            status, detail = "fail", str(exc)
        out.append(_report.Check("smoke", status, time.monotonic() - t0, detail, name, version, "READY"))
    return out


def run_parallel(fn: Callable[[T], R], items: Sequence[T], jobs: int) -> list[R]:
    """``fn`` of every item, results in order, at most ``jobs`` at a time; a call's exception is raised here.

    What ``ThreadPoolExecutor.map`` does (every call runs, the first failing
    one in order raises) with plain threads: concurrent.futures would cost
    every run its import (see "start-up cost" in _http.py), and one item needs
    no thread at all.
    """
    if jobs <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    import threading  # only when there is more than one model version to check

    results: dict[int, R] = {}
    errors: dict[int, BaseException] = {}
    todo = iter(range(len(items)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = fn(items[i])
            except BaseException as exc:  # handed to the caller below, as pool.map would
                errors[i] = exc

    workers = [threading.Thread(target=work, name=f"check-{n}") for n in range(min(jobs, len(items)))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()  # each call is bounded by the probe's deadline
    if errors:
        raise errors[min(errors)]
    return [results[i] for i in range(len(items))]


def probe(opts: Options, start: float | None = None) -> _report.Report:
    """Run every check under one deadline and return the report (never raises HealthError)."""
    t_start = time.monotonic() if start is None else start
    deadline = _http.Deadline(opts.deadline, t_start)
    report = _report.Report(url=opts.url, deadline_s=opts.deadline)
    client = _http.Client(opts.url, deadline, {ADMIN_HEADER: opts.admin_key} if opts.admin_key else None)
    try:
        _, live = _timed(report, "live", lambda: _live(client))
        if live.status != "ok":
            return report
        index, idx = _timed(report, "index", lambda: _index(client))
        if idx.status != "ok" or index is None:
            return report
        ready = select(index, opts, report)
        if opts.models is None and not report.required:
            report.add(
                _report.Check(
                    "index",
                    "fail",
                    0.0,
                    "no model version to check: the repository index is empty or everything is ignored or unloaded",
                )
            )
        smoke_all = opts.smoke == []
        smoke_specs = opts.smoke or []
        for name, version in smoke_specs:
            known = any(  # a required version that is not READY already has its own failure line
                c.check == "state" and c.model == name and (version is None or c.version == version)
                for c in report.checks
            )
            if not known and not _matches(opts.ignore, name, version or ""):
                report.add(
                    _report.Check(
                        "smoke",
                        "fail",
                        0.0,
                        "smoke inference asked for, but the model is not among the required models",
                        name,
                        version,
                    )
                )
        jobs = []
        for e in ready:
            wanted = smoke_all or _matches(smoke_specs, e["name"], e["version"])
            jobs.append((e, opts.smoke is not None and wanted, not smoke_all and wanted))
        results = run_parallel(lambda job: _version_checks(client, *job), jobs, opts.jobs)
        flat = [c for r in results for c in r]
        report.checks += [c for c in flat if c.check == "ready"] + [c for c in flat if c.check == "smoke"]
        return report
    finally:
        report.duration_s = time.monotonic() - t_start


# --- command line -----------------------------------------------------------------------------


def parse_specs(text: str, what: str) -> list[tuple[str, str | None]]:
    """``add,text/2`` → [("add", None), ("text", "2")]; a version follows the last slash."""
    specs: list[tuple[str, str | None]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, version = item.rpartition("/")
        if not sep:
            specs.append((item, None))
        elif name and version.isdigit():
            specs.append((name, version))
        else:
            raise _http.UsageError(f"{what}: {item!r} is not MODEL or MODEL/VERSION")
    return specs


PROG = "health.py"
DESCRIPTION = (
    "Deep health check for a Triton container: liveness, every required model version "
    "READY, optional smoke inference. Exit 0 healthy, 1 unhealthy, 2 usage error. "
    "Flags win over the environment variables ([env: ...])."
)
FLAGS = (
    _cli.Flag(
        "--triton-url",  # the same flag as the exporter's and model sync's
        metavar="URL",
        dest="url",
        help=f"Triton HTTP endpoint (default: {DEFAULT_URL}) [env: TRITON_URL]",
    ),
    _cli.Flag("--url", metavar="URL", dest="url", hidden=True),  # its former name: adopted task definitions use it
    _cli.Flag(
        "--models",
        kind=_cli.APPEND,
        metavar="M[,M/V...]",
        help="models that must be ready, MODEL or MODEL/VERSION, comma-separated "
        "(default: every version in the repository index except those unloaded on purpose) [env: HEALTH_MODELS]",
    ),
    _cli.Flag(
        "--ignore",
        kind=_cli.APPEND,
        metavar="M[,M/V...]",
        help="models or versions never checked (default: none) [env: HEALTH_IGNORE]",
    ),
    _cli.Flag(
        "--smoke",
        kind=_cli.OPTIONAL,
        const="all",
        metavar="all|M[,M/V...]",
        help="send one synthetic inference to every required model (no value or 'all') or to "
        "the named ones (default: off) [env: HEALTH_SMOKE]",
    ),
    _cli.Flag("--no-smoke", kind=_cli.SWITCH, help="no smoke inference, whatever HEALTH_SMOKE says"),
    _cli.Flag(
        "--deadline",
        metavar="SECONDS",
        help=f"overall time limit, under ECS's 5 s (default: {DEFAULT_DEADLINE:g}) [env: HEALTH_DEADLINE]",
    ),
    _cli.Flag("--jobs", metavar="N", help=f"concurrent per-model checks (default: {DEFAULT_JOBS}) [env: HEALTH_JOBS]"),
    _cli.Flag("--json", kind=_cli.SWITCH, help="print one JSON document with every check"),
    _cli.Flag("--quiet", kind=_cli.SWITCH, help="print nothing when healthy"),
)


def options(argv: Sequence[str] | None, env: Mapping[str, str] | None = None, prog: str = PROG) -> Options:
    """Merge flags and environment variables (flags win); UsageError on bad values, _cli.Exit after --help."""
    env = os.environ if env is None else env
    ns = _cli.parse(FLAGS, argv, prog, DESCRIPTION)

    def pick(flag: object, var: str) -> str | None:
        return _cli.pick(flag, var, env)

    opts = Options(json=bool(ns["json"]), quiet=bool(ns["quiet"]))
    opts.url = (pick(ns["url"], "TRITON_URL") or DEFAULT_URL).strip()
    models = pick(ns["models"], "HEALTH_MODELS")
    if models is not None:
        opts.models = parse_specs(models, "--models/HEALTH_MODELS")
        if not opts.models:
            raise _http.UsageError("--models/HEALTH_MODELS names no model")
    ignore = pick(ns["ignore"], "HEALTH_IGNORE")
    opts.ignore = parse_specs(ignore, "--ignore/HEALTH_IGNORE") if ignore else []
    smoke = None if ns["no_smoke"] else pick(ns["smoke"], "HEALTH_SMOKE")
    if smoke is not None:
        low = smoke.strip().lower()
        if low in ("all", "*", "1", "true", "yes", "on"):
            opts.smoke = []
        elif low not in ("0", "false", "no", "off", "none"):
            opts.smoke = parse_specs(smoke, "--smoke/HEALTH_SMOKE")
    for attr, var, flag, conv, lo, hi in (
        ("deadline", "HEALTH_DEADLINE", ns["deadline"], float, 0.0, 3600.0),
        ("jobs", "HEALTH_JOBS", ns["jobs"], int, 0, 64),  # bounds exclusive below: one job (serial) is allowed
    ):
        raw = pick(flag, var)
        if raw is None:
            continue
        try:
            value = conv(raw)
        except ValueError as exc:
            raise _http.UsageError(f"{attr} ({var}) must be a number, got {raw!r}") from exc
        if not (lo < value <= hi) or (isinstance(value, float) and math.isnan(value)):
            raise _http.UsageError(f"{attr} ({var}) must be above {lo:g} and at most {hi:g}, got {raw!r}")
        setattr(opts, attr, value)
    # A secret: its variable only, never a flag (ps shows flags); checked here, shown nowhere.
    opts.admin_key = env.get(ADMIN_KEY_ENV, "").strip()
    if opts.admin_key and not all((c.isalnum() and c.isascii()) or c in "-_.~+/" for c in opts.admin_key):
        raise _http.UsageError(f"{ADMIN_KEY_ENV} may hold letters, digits and -_.~+/ only")
    _http.Client(opts.url, _http.Deadline(1))  # validates the URL
    return opts


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Entry point for ``python3 health.py`` and ``python -m exporter health`` (``prog``: the name its usage
    shows); returns the exit code."""
    start = time.monotonic()
    try:
        opts = options(argv, prog=prog)
    except _cli.Exit as exc:
        return exc.status
    except _cli.UsageError as exc:
        return _cli.usage_error(prog, exc)
    try:
        report = probe(opts, start)
        text = _report.render_json(report) if opts.json else _report.render_text(report)
    except Exception as exc:  # a probe bug must still give ECS a clear "unhealthy" line, never a traceback
        print(f"UNHEALTHY triton {opts.url}: probe error {type(exc).__name__}: {_report.first_line(exc)}", flush=True)
        return 1
    if not (opts.quiet and report.healthy):
        print(text, flush=True)
    return 0 if report.healthy else 1
