"""The controller's verdict rules for a canary's evidence: pure functions, documented in docs/modelsync.md.

- **Failures, statistically**: a one-sided two-proportion z-test of "the canaries fail more often than the
  baseline" with the Agresti-Caffo adjustment (one failure and one success added to each side, so that a
  window with no failure has a variance), at :data:`CONFIDENCE`; the build is rejected when the test is
  significant *and* the observed increase is at least half of ``--max-failure-increase`` (a significant but
  negligible increase over millions of requests is no regression). The false-reject and miss rates at 100 and
  1,000 requests are computed exactly by ``bench/rollout_rules.py`` and listed in docs/modelsync.md.
- **Failures, absolutely**: a canary whose failure ratio is above ``--max-failure-ratio`` is rejected,
  whatever its baseline (a control at 30 % failures does not excuse a canary at 30.9 %).
- **Early abort**: with at least ``--bake-min-requests`` requests on the canaries, a failure increase
  significant at :data:`ABORT_CONFIDENCE` and at least five times ``--max-failure-increase``, or a failure
  ratio surely above the ceiling, rejects at once: the bake's length only gates a promotion.
- **Latency**: the average of the successful requests over the bake itself (the counters' deltas from the
  window's start: Triton's duration sum over its success count), never Triton's 60-second summary.
- **Crashes**: :data:`MAX_CRASHES` canaries whose Triton exited while serving the artifact reject it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from modelsync.evidence import PROMOTE, REJECT, Judgement, Thresholds, Window, evidence_of, pick_baseline, too_few

CONFIDENCE = 0.95
ABORT_CONFIDENCE = 0.999
MAX_CRASHES = 2
ABORT_FACTOR = 5.0  # "far beyond": this many times --max-failure-increase


def z_of(confidence: float) -> float:
    """The one-sided normal quantile (0.95 -> 1.645), by bisection on erf (no scipy in the image)."""
    lo, hi = 0.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < confidence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


Z = z_of(CONFIDENCE)
Z_ABORT = z_of(ABORT_CONFIDENCE)


@dataclass(frozen=True)
class Rules(Thresholds):
    """Model sync's thresholds (the same names, defaults and JSON), with the controller's absolute ceiling."""

    max_failure_ratio: float = 0.05

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "max_failure_ratio": self.max_failure_ratio, "confidence": CONFIDENCE}


def failure_z(failures: float, requests: float, base_failures: float, base_requests: float) -> float:
    """z of the one-sided test "the canary's failure probability exceeds the baseline's" (Agresti-Caffo). With no
    baseline (``base_requests`` 0) the baseline is taken as failing never, exactly (no variance of its own)."""
    pc = (failures + 1) / (requests + 2)
    var = pc * (1 - pc) / (requests + 2)
    pb = 0.0
    if base_requests > 0:
        pb = (base_failures + 1) / (base_requests + 2)
        var += pb * (1 - pb) / (base_requests + 2)
    return (pc - pb) / math.sqrt(var) if var > 0 else 0.0


def failure_rejects(failures: int, requests: int, base_failures: int, base_requests: int, increase: float) -> bool:
    """The statistical failure rule alone (the rates in docs/modelsync.md are of this function)."""
    if requests <= 0:
        return False
    observed = failures / requests - (base_failures / base_requests if base_requests else 0.0)
    return observed >= increase / 2 and failure_z(failures, requests, base_failures, base_requests) > Z


def early_abort(canary: Window, baselines: list[tuple[str, Window]], rules: Rules, baked: float) -> Judgement | None:
    """A rejection now, whatever the bake, when the canaries fail far beyond their baseline; else None."""
    if canary.requests < rules.min_requests:
        return None
    source, base = pick_baseline(baselines, rules.min_requests)
    bf, bn = (base.failures, base.requests) if base is not None else (0.0, 0)
    increase = canary.failure_ratio - (base.failure_ratio if base is not None else 0.0)
    z = failure_z(canary.failures, canary.requests, bf, bn)
    evidence = evidence_of(canary, base, source, rules, baked) | {"failure_increase": round(increase, 6),
                                                                 "z": round(z, 2)}  # fmt: skip
    if z > Z_ABORT and increase >= ABORT_FACTOR * rules.max_failure_increase:
        return Judgement(REJECT, [
            f"early abort after {baked:.0f} s of the bake: failure ratio {canary.failure_ratio:.4f} against "
            f"{base.failure_ratio if base else 0.0:.4f} ({source}) over {canary.requests} requests: +{increase:.4f}, "
            f"at least {ABORT_FACTOR:g}x --max-failure-increase {rules.max_failure_increase:g} at "
            f"{ABORT_CONFIDENCE:.1%} confidence (z {z:.1f})"], evidence)  # fmt: skip
    pc = (canary.failures + 1) / (canary.requests + 2)
    low = pc - Z_ABORT * math.sqrt(pc * (1 - pc) / (canary.requests + 2))
    if low > rules.max_failure_ratio:
        return Judgement(REJECT, [
            f"early abort after {baked:.0f} s of the bake: failure ratio {canary.failure_ratio:.4f} over "
            f"{canary.requests} requests, surely above --max-failure-ratio {rules.max_failure_ratio:g} (its "
            f"{ABORT_CONFIDENCE:.1%} lower bound is {low:.4f})"], evidence)  # fmt: skip
    return None


def judge(canary: Window, baselines: list[tuple[str, Window]], rules: Rules, baked: float) -> Judgement:
    """The verdict once the bake is over: promote, reject, or wait (too few requests: silence never promotes)."""
    source, base = pick_baseline(baselines, rules.min_requests)
    evidence = evidence_of(canary, base, source, rules, baked)
    if canary.requests < rules.min_requests:
        return too_few(canary, rules, evidence)
    reasons: list[str] = []
    bf, bn = (int(base.failures), base.requests) if base is not None else (0, 0)
    increase = canary.failure_ratio - (base.failure_ratio if base is not None else 0.0)
    z = failure_z(canary.failures, canary.requests, bf, bn)
    evidence |= {"failure_increase": round(increase, 6), "z": round(z, 2)}
    if failure_rejects(int(canary.failures), canary.requests, bf, bn, rules.max_failure_increase):
        reasons.append(
            f"failure ratio {canary.failure_ratio:.4f} against {base.failure_ratio if base else 0.0:.4f} ({source}): "
            f"+{increase:.4f}, significant at {CONFIDENCE:.0%} (z {z:.2f} > {Z:.3f}) and at least half of "
            f"--max-failure-increase {rules.max_failure_increase:g}"
        )
    if canary.failure_ratio > rules.max_failure_ratio:
        reasons.append(f"failure ratio {canary.failure_ratio:.4f} above the ceiling --max-failure-ratio "
                       f"{rules.max_failure_ratio:g}")  # fmt: skip
    if base is not None and base.avg_ms and canary.avg_ms is not None:
        ratio = canary.avg_ms / base.avg_ms
        evidence["latency_ratio"] = round(ratio, 3)
        if ratio > rules.max_latency_ratio:
            reasons.append(
                f"average latency over the bake {canary.avg_ms:.2f} ms against {base.avg_ms:.2f} ms ({source}): "
                f"{ratio:.2f}x, above --max-latency-ratio {rules.max_latency_ratio:g}"
            )
    if reasons:
        return Judgement(REJECT, reasons, evidence)
    what = f"against {source}" if base is not None else "with no baseline (failures against none, latency unjudged)"
    return Judgement(PROMOTE, [f"{canary.requests} requests over {baked:.0f} s, failure ratio "
                               f"{canary.failure_ratio:.4f}, within the rules {what}"], evidence)  # fmt: skip


def crashed(crashes: list[str]) -> Judgement | None:
    """A rejection once :data:`MAX_CRASHES` canaries' Triton exited while serving the artifact."""
    if len(crashes) < MAX_CRASHES:
        return None
    return Judgement(REJECT, [f"Triton exited on {len(crashes)} canaries while serving it ({', '.join(crashes)}): "
                              "a crash loop stops here"], {"crashes": list(crashes)})  # fmt: skip
