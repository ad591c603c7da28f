"""A rollout's evidence: what this host's own Triton says about a model, and the verdict rules.

Read from Triton's ``/metrics`` (the metrics port, ``--triton-metrics-url``), per model and version:

- ``nv_inference_request_success`` and ``nv_inference_request_failure`` (summed over ``reason``): counters;
- ``nv_inference_request_duration_us``: cumulative microseconds of the successful requests (a failed
  request adds nothing, seen on Triton 2.51): average latency = duration / successes;
- ``nv_inference_request_summary_us{quantile="0.95"}`` (with ``--metrics-config summary_latencies=true``):
  the p95 of the successful requests of the last 60 s, a gauge.

A window is the difference between two scrapes, series by series. Triton keeps a version's counters
across a reload of the same version number (seen: a model directory replaced and loaded again continued
from 3 requests), so the window of a new artifact starts with a scrape taken once it is READY; a counter
lower than at the start means Triton restarted, and that series counts from zero. A bundle's generation is
a new version number, whose series start at zero.

What this cannot see: a model that answers wrong but fast and without errors; an error *response* from a
Python model (Triton 2.51 counts it under ``success``; only an exception in ``execute`` is a failure);
requests that never reach Triton. See docs/modelsync.md, "Safe rollouts".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from triton_http import Client, RequestFailed

SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
DURATION = "nv_inference_request_duration_us"
SUMMARY = "nv_inference_request_summary_us"
FAMILIES = (SUCCESS, FAILURE, DURATION, SUMMARY)
MAX_BODY = 64 * 1024 * 1024  # bytes of /metrics read at most (a thousand models take a few MB)
CONNECT_TIMEOUT = 2.0
TIMEOUT = 10.0  # one scrape, body included
P95_MIN_BAKE = 60.0  # Triton's summary covers the last 60 s: shorter bakes would mix the two versions

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Key = tuple[str, str]  # (model, version)


class ScrapeError(Exception):
    """Triton's /metrics could not be read."""


@dataclass(frozen=True)
class Sample:
    """One model version's counters at one moment."""

    success: float = 0.0
    failure: float = 0.0
    duration_us: float = 0.0
    p95_us: float | None = None

    def to_json(self) -> list[float]:
        return [self.success, self.failure, self.duration_us]

    @classmethod
    def from_json(cls, raw: Any) -> Sample:
        if not isinstance(raw, list) or len(raw) != 3 or not all(isinstance(v, int | float) for v in raw):
            raise ValueError(f"not a counter sample: {raw!r}")
        return cls(float(raw[0]), float(raw[1]), float(raw[2]))


Snapshot = dict[Key, Sample]


def snapshot_to_json(snap: Snapshot) -> dict[str, list[float]]:
    return {f"{m}\x1f{v}": s.to_json() for (m, v), s in sorted(snap.items())}


def snapshot_from_json(raw: Any) -> Snapshot:
    if not isinstance(raw, dict):
        raise ValueError("not a snapshot")
    out: Snapshot = {}
    for k, v in raw.items():
        model, _, version = str(k).partition("\x1f")
        out[(model, version)] = Sample.from_json(v)
    return out


def parse(text: str, models: set[str]) -> Snapshot:
    """The four families of ``models`` from Prometheus text; every other line is skipped unread."""
    acc: dict[Key, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith("nv_inference_request_"):
            continue
        m = _LINE.match(line)
        if m is None or m.group(1) not in FAMILIES:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        model = labels.get("model", "")
        if model not in models:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        slot = acc.setdefault((model, labels.get("version", "")), {})
        name = m.group(1)
        if name == SUMMARY:
            if labels.get("quantile") == "0.95":
                slot["p95"] = value
        else:
            slot[name] = slot.get(name, 0.0) + value  # the failure counter: summed over reason
    return {
        key: Sample(v.get(SUCCESS, 0.0), v.get(FAILURE, 0.0), v.get(DURATION, 0.0), v.get("p95"))
        for key, v in acc.items()
    }


def client() -> Client:
    """The client scrapes go through: at most :data:`MAX_BODY` bytes within :data:`TIMEOUT` seconds."""
    return Client(CONNECT_TIMEOUT, MAX_BODY)


def scrape(http: Client, url: str, models: set[str]) -> Snapshot:
    """One GET of /metrics; raises ScrapeError."""
    try:
        r = http.get(url, TIMEOUT)
    except RequestFailed as exc:
        raise ScrapeError(f"GET {exc}") from None
    if r.status != 200:
        raise ScrapeError(f"GET {url} answered {r.status}")
    return parse(r.body.decode("utf-8", "replace"), models)


# --- windows ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Requests of one artifact over a window (one host, or several summed)."""

    successes: float = 0.0
    failures: float = 0.0
    duration_us: float = 0.0
    p95_ms: float | None = None

    @property
    def requests(self) -> int:
        return int(self.successes + self.failures)

    @property
    def failure_ratio(self) -> float:
        return self.failures / (self.successes + self.failures) if self.successes + self.failures else 0.0

    @property
    def avg_ms(self) -> float | None:
        return self.duration_us / self.successes / 1000.0 if self.successes else None

    def __add__(self, other: Window) -> Window:
        p95s = [(w.p95_ms, w.successes) for w in (self, other) if w.p95_ms is not None and w.successes]
        weight = sum(n for _, n in p95s)
        p95 = sum(p * n for p, n in p95s) / weight if weight else None
        return Window(
            self.successes + other.successes, self.failures + other.failures, self.duration_us + other.duration_us, p95
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "failures": int(self.failures),
            "failure_ratio": round(self.failure_ratio, 6),
            "successes": int(self.successes),
            "duration_us": round(self.duration_us),
        }
        if self.avg_ms is not None:
            out["avg_ms"] = round(self.avg_ms, 3)
        if self.p95_ms is not None:
            out["p95_ms"] = round(self.p95_ms, 3)
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Window:
        if not isinstance(raw, dict):
            raise ValueError("not a window")
        p95 = raw.get("p95_ms")
        return cls(
            float(raw.get("successes", 0)),
            float(raw.get("failures", 0)),
            float(raw.get("duration_us", 0)),
            float(p95) if isinstance(p95, int | float) else None,
        )


def window(start: Snapshot, now: Snapshot) -> Window:
    """What happened between two scrapes; a series whose counters went down restarted (Triton did)."""
    total = Window()
    for key, cur in now.items():
        base = start.get(key, Sample())
        if cur.success < base.success or cur.failure < base.failure or cur.duration_us < base.duration_us:
            base = Sample()
        grew = cur.success - base.success
        total = total + Window(
            grew,
            cur.failure - base.failure,
            cur.duration_us - base.duration_us,
            cur.p95_us / 1000.0 if cur.p95_us is not None and grew > 0 else None,
        )
    return total


# --- the verdict ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Thresholds:
    bake_seconds: float = 600.0
    min_requests: int = 100
    max_failure_increase: float = 0.01
    max_latency_ratio: float = 1.5

    def to_json(self) -> dict[str, Any]:
        return {
            "bake_seconds": self.bake_seconds,
            "bake_min_requests": self.min_requests,
            "max_failure_increase": self.max_failure_increase,
            "max_latency_ratio": self.max_latency_ratio,
        }


PROMOTE, REJECT, WAIT = "promote", "reject", "wait"


@dataclass
class Judgement:
    verdict: str  # promote | reject | wait
    reasons: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def pick_baseline(baselines: list[tuple[str, Window]], min_requests: int) -> tuple[str, Window | None]:
    """The first baseline (in order of preference) with at least ``min_requests``; ("none", None) when none has."""
    return next(((s, w) for s, w in baselines if w.requests >= min_requests), ("none", None))


def evidence_of(canary: Window, base: Window | None, source: str, thresholds: Thresholds,
                baked: float) -> dict[str, Any]:  # fmt: skip
    """What every judgement carries, whoever judges (this daemon, or the controller's rules)."""
    return {
        "canary": canary.to_json(),
        "baseline": {"source": source, **(base.to_json() if base is not None else {})},
        "baked_s": round(baked, 1),
        "thresholds": thresholds.to_json(),
    }


def too_few(canary: Window, thresholds: Thresholds, evidence: dict[str, Any]) -> Judgement:
    """Fewer requests on the canaries than ``min_requests``: no evidence either way (silence never promotes)."""
    return Judgement(WAIT, [f"{canary.requests} requests on the canaries, fewer than --bake-min-requests "
                            f"{thresholds.min_requests}"], evidence)  # fmt: skip


def judge(canary: Window, baselines: list[tuple[str, Window]], thresholds: Thresholds, baked: float) -> Judgement:
    """The canaries' window against the first baseline with enough requests (``baselines`` in order of
    preference: the hosts still on the previous artifact over the same window, then the previous artifact on
    the canary hosts before the switch). Without one, failures are judged against none and latency not at
    all. Fewer requests on the canaries than ``min_requests`` is no evidence either way: wait."""
    t = thresholds
    source, base = pick_baseline(baselines, t.min_requests)
    evidence = evidence_of(canary, base, source, t, baked)
    if canary.requests < t.min_requests:
        return too_few(canary, t, evidence)
    reasons: list[str] = []
    increase = canary.failure_ratio - (base.failure_ratio if base is not None else 0.0)
    evidence["failure_increase"] = round(increase, 6)
    if increase > t.max_failure_increase:
        reasons.append(
            f"failure ratio {canary.failure_ratio:.4f} against {base.failure_ratio if base else 0.0:.4f} "
            f"({source}): +{increase:.4f}, above --max-failure-increase {t.max_failure_increase:g}"
        )
    if base is not None and base.avg_ms and canary.avg_ms is not None:
        ratio = canary.avg_ms / base.avg_ms
        evidence["latency_ratio"] = round(ratio, 3)
        if ratio > t.max_latency_ratio:
            reasons.append(
                f"average latency {canary.avg_ms:.2f} ms against {base.avg_ms:.2f} ms ({source}): {ratio:.2f}x, "
                f"above --max-latency-ratio {t.max_latency_ratio:g}"
            )
    if base is not None and base.p95_ms and canary.p95_ms is not None and t.bake_seconds >= P95_MIN_BAKE:
        ratio = canary.p95_ms / base.p95_ms
        evidence["p95_ratio"] = round(ratio, 3)
        if ratio > t.max_latency_ratio:
            reasons.append(
                f"p95 latency {canary.p95_ms:.2f} ms against {base.p95_ms:.2f} ms ({source}): {ratio:.2f}x, "
                f"above --max-latency-ratio {t.max_latency_ratio:g}"
            )
    if reasons:
        return Judgement(REJECT, reasons, evidence)
    what = f"against {source}" if base is not None else "with no baseline (failures against none, latency unjudged)"
    return Judgement(
        PROMOTE,
        [f"{canary.requests} requests, failure ratio {canary.failure_ratio:.4f}, within the thresholds {what}"],
        evidence,
    )
