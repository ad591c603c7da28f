"""The rollouts bench/bench_rollout.py measured, as the timeline :mod:`.rollout` draws.

    python -m demo.preview rollout --from-bench docs/rollout-timeline.json [--out docs/rollout-timeline.png]

The bench's file (its format is documented where it is written, in bench/bench_rollout.py) holds, per
rollout ("good", "bad"), each host's rollout decisions and installs from its daemon's log, and from its
own traffic its first answer from the new build, its first failure, its first answer from the previous
build again, its requests and its failed requests per second; every time in seconds from the upload.
They become :mod:`.rollout`'s events so:

- a ``started`` or ``canary claimed`` decision: ``canary_chosen`` (the host is a canary);
- ``installed`` of the new build: ``canary_installed`` on a canary, ``installed`` elsewhere; an install
  of another build (the previous one going back on a rejected canary) is not drawn: its ``rolled back``
  decision, right after it, is;
- ``baking``: ``bake_started``; ``promoted`` / ``rejected``: the verdict, with its evidence's figures;
  ``rolled back``: ``rolled_back``, with when the previous build answered again; ``waiting for evidence``
  is the bake window going on, already drawn; any other decision is refused (the picture would be wrong
  without it);
- the host's first answer from the new build: ``serving_new``; for a build that fails every request
  (it never answers), the first failure of a host that installed it;
- failed requests per second: ``failed_requests`` (the count of second i ends at i + 1), requests: ``requests``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .rollout import MAX_COUNTS, MAX_HOSTS, MAX_NAME, Rollout, RolloutError, parse

RUNS = ("good", "bad")
MAX_BYTES = 20 * 1024 * 1024
BEHAVIOUR = {"ok": "A good build", "fail": "A harmful build (every request fails)"}
CANARY = ("started", "canary claimed")
DECISIONS = (*CANARY, "installed", "baking", "promoted", "rejected", "rolled back", "waiting for evidence")


def _time(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RolloutError(f"{where}: {value!r} is not a number of seconds")
    return float(value)


def _per_host(run: dict[str, Any], key: str, which: str) -> dict[str, Any]:
    value = run.get(key, {})
    if not isinstance(value, dict) or len(value) > MAX_HOSTS:
        raise RolloutError(f"{which}.{key}: an object of at most {MAX_HOSTS} hosts is expected")
    return value


def _pct(ratio: Any) -> str:
    return f"{float(ratio) * 100:.3g}%" if isinstance(ratio, int | float) else "?"


def _figures(side: Any) -> str:
    if not isinstance(side, dict):
        return ""
    parts = []
    if isinstance(side.get("requests"), int | float):
        parts.append(f"{side['requests']:,.0f} requests")
    if "failure_ratio" in side:
        parts.append(f"{_pct(side['failure_ratio'])} failed")
    if isinstance(side.get("avg_ms"), int | float):
        parts.append(f"{side['avg_ms']:.2f} ms")
    return ", ".join(parts)


def verdict_detail(decision: dict[str, Any]) -> str:
    """The verdict's figures: the canary's and the previous build's (the baseline); else its reason."""
    ev = decision.get("evidence")
    if isinstance(ev, dict) and (canary := _figures(ev.get("canary"))):
        baseline = _figures(ev.get("baseline"))
        return f"canary {canary}" + (f"; previous build {baseline}" if baseline else "")
    return str(decision.get("reason", ""))


def convert(doc: Any, which: str) -> dict[str, Any]:
    """Rollout ``which`` of the bench's file ``doc`` (parsed JSON) in :mod:`.rollout`'s schema."""
    if not isinstance(doc, dict) or not isinstance(run := doc.get(which), dict):
        found = sorted(k for k, v in doc.items() if isinstance(v, dict)) if isinstance(doc, dict) else []
        raise RolloutError(f"no rollout {which!r} in the bench's file (it has {', '.join(found) or 'none'})")
    decisions = _per_host(run, "decisions", which)
    if not decisions:
        raise RolloutError(f"{which}.decisions: no host")
    per_second = run.get("failed_per_second")
    if not isinstance(per_second, dict):
        raise RolloutError(
            f"{which}: no failed_per_second (bench/bench_rollout.py writes it since the timeline was drawn): "
            "measure again with bench/bench_rollout.py --timeline FILE"
        )
    rows: dict[str, list[dict[str, Any]]] = {}
    for host, got in decisions.items():
        if not isinstance(got, list) or not all(isinstance(d, dict) for d in got):
            raise RolloutError(f"{which}.decisions.{host}: a list of decisions is expected")
        for n, d in enumerate(got):
            if d.get("verdict") not in DECISIONS:
                raise RolloutError(
                    f"{which}.decisions.{host}[{n}]: decision {d.get('verdict')!r} is not drawn "
                    f"(only {', '.join(DECISIONS)}): this timeline shows a rollout that ran to its verdict"
                )
            _time(d.get("t"), f"{which}.decisions.{host}[{n}].t")
        rows[host] = sorted(got, key=lambda d: float(d["t"]))
    canaries = {h for h, got in rows.items() if any(d["verdict"] in CANARY for d in got)}
    if not canaries:
        raise RolloutError(f"{which}: no host took a canary slot (a rollout without canaries is not drawn)")
    # The new build: what a canary installed first (later installs on a canary put the previous one back).
    new = next((d.get("sha256") for h in sorted(canaries) for d in rows[h] if d["verdict"] == "installed"), None)
    first_new, first_failure = _per_host(run, "first_new_answer_s", which), _per_host(run, "first_failure_s", which)
    back_on = _per_host(run, "back_on_previous_s", which)
    events: list[dict[str, Any]] = [{"time": 0, "event": "uploaded"}]
    for host, got in rows.items():
        installed_new = False
        for d in got:
            verdict, t = d["verdict"], float(d["t"])
            if verdict in CANARY:
                events.append({"host": host, "time": t, "event": "canary_chosen"})
            elif verdict == "installed":
                if d.get("sha256") == new:
                    kind = "canary_installed" if host in canaries else "installed"
                    events.append({"host": host, "time": t, "event": kind, "detail": str(new)[:MAX_NAME]})
                    installed_new = True
            elif verdict == "baking":
                events.append({"host": host, "time": t, "event": "bake_started"})
            elif verdict in ("promoted", "rejected"):
                detail = verdict_detail(d)[:MAX_NAME]
                events.append({"host": host, "time": t, "event": f"verdict_{verdict}", "detail": detail})
            elif verdict == "rolled back":
                again = _time(back_on.get(host), f"{which}.back_on_previous_s.{host}")
                detail = f"the previous build answers again at {again:.1f} s" if again is not None else ""
                events.append({"host": host, "time": t, "event": "rolled_back", "detail": detail})
        serving = _time(first_new.get(host), f"{which}.first_new_answer_s.{host}")
        if serving is None and installed_new:
            serving = _time(first_failure.get(host), f"{which}.first_failure_s.{host}")
        if serving is not None:
            events.append({"host": host, "time": serving, "event": "serving_new"})
    failed: list[dict[str, Any]] = []
    for host, bins in per_second.items():
        if not isinstance(bins, list) or len(failed) + len(bins) > MAX_COUNTS:
            raise RolloutError(f"{which}.failed_per_second.{host}: a list of counts, at most {MAX_COUNTS} in all")
        failed += [{"host": host, "time": i + 1, "count": c} for i, c in enumerate(bins)]
    requests = [{"host": h, "count": n} for h, n in _per_host(run, "requests", which).items()]
    return {
        "title": title(run, which, events, failed),
        "events": events,
        "failed_requests": failed,
        "requests": requests,
    }


def title(run: dict[str, Any], which: str, events: list[dict[str, Any]], failed: list[dict[str, Any]]) -> str:
    """What happened, in one line: the canary, the verdict, the other hosts (the failed requests are drawn)."""
    canaries = sorted({e["host"] for e in events if e["event"] == "canary_chosen"})
    hosts = {e["host"] for e in events if "host" in e} | {c["host"] for c in failed}
    others = len(hosts - set(canaries))
    installed = len({e["host"] for e in events if e["event"] == "installed"})
    verdicts = [e["event"].removeprefix("verdict_") for e in events if e["event"].startswith("verdict_")]
    what = " and ".join(verdicts) or "no verdict yet"
    if any(e["event"] == "rolled_back" for e in events):
        what += ", rolled back"
    if installed == others and others:
        spread = f"all {others} other hosts install it"
    elif installed:
        spread = f"{installed} of the {others} other hosts install it"
    else:
        spread = f"none of the {others} other hosts installs it"
    label = BEHAVIOUR.get(str(run.get("behaviour")), which)
    return f"{label}: canary {', '.join(canaries)}, {what}; {spread}"


def heading(doc: dict[str, Any]) -> list[str]:
    """Where the figures come from: the bench's settings, and how to measure and draw again."""
    s = doc.get("settings")
    s = s if isinstance(s, dict) else {}
    flags = " ".join(
        f"--{flag} {s[key]:g}"
        for flag, key in (
            ("canary-fraction", "canary_fraction"),
            ("bake-seconds", "bake_seconds"),
            ("bake-min-requests", "bake_min_requests"),
            ("max-failure-increase", "max_failure_increase"),
            ("max-latency-ratio", "max_latency_ratio"),
        )
        if isinstance(s.get(key), int | float)
    )
    hosts = s.get("hosts", "?")
    return [
        "Safe model-sync rollouts, measured by bench/bench_rollout.py",
        f"{hosts} hosts, each a real Triton (no GPU) with traffic of its own and its model-sync daemon, on moto's "
        f"S3, SNS and SQS; {flags}. Times are seconds after the upload: decisions and installs from each daemon's "
        "log, serving and failed requests from each host's traffic. Measure again: .venv/bin/python "
        "bench/bench_rollout.py --timeline docs/rollout-timeline.json; draw again: python -m demo.preview rollout",
    ]


def load(path: Path) -> Any:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
        doc = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (OSError, ValueError) as exc:
        raise RolloutError(f"{path}: {exc}") from None
    if doc is None:
        raise RolloutError(f"{path}: over {MAX_BYTES // 2**20} MiB")
    return doc


def rollouts(doc: Any, runs: tuple[str, ...] = RUNS) -> list[Rollout]:
    return [parse(convert(doc, which)) for which in runs]
