"""Safe rollouts, measured: four hosts (a real Triton and ``python -m modelsync`` each) on moto's S3, SNS and
SQS, traffic on every host, ``--canary-fraction 0.25 --bake-seconds 20 --bake-min-requests 30`` and the
default thresholds.

    .venv/bin/python bench/bench_rollout.py [--hosts 4] [--bake 20] [--timeline docs/rollout-timeline.json]

1. a good artifact: when it reached its first host (the canary), when every host served it;
2. a harmful one (every request fails): when the canary served it, when the canary was back on the previous
   artifact, and whether any other host ever answered from it or failed a request;
3. the reference, in the same run: the same fleet with ``--canary-fraction 0`` (today's fan-out: every host
   at once), upload to every host serving it;
4. the controller deciding (``python -m controller --rollouts on``, the daemons in ``--rollouts controller``
   mode, each an ECS task on moto): the harmful artifact at the default bake (600 s): seconds from the PUT to
   the rejection (only the early abort can be this quick; goal <= 90 s) and failed requests outside the canary
   (goal 0), beside the self-mode figures of 2.

The goal (issue 27): the good one on one host first and on all within bake + 30 s; the harmful one back to
the previous version on the canary within bake + 30 s, never on the other hosts. Times are from the PUT,
seen by each host's own traffic (the first answer from the new artifact), on this machine's clock. The
timeline (per host: install, serve, verdict, rollback, failed requests per second) is written as JSON, which
``python -m demo.preview rollout --from-bench FILE`` draws (docs/rollout-timeline.png).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.triton import free_port  # noqa: E402
from tests.support.msync import Fleet, Moto, rollout_files, wait_for  # noqa: E402


def first_answer(fleet: Fleet, model: str, value: float, since: float) -> dict[str, float | None]:
    """Per host: seconds from ``since`` to its traffic's first answer ``value`` (None: never)."""
    out: dict[str, float | None] = {}
    for h in fleet.hosts:
        t = h.traffic.get(model)
        times = [at for at, status, answer in (t.results if t else []) if status == 200 and answer == value]
        out[h.name] = round(times[0] - since, 2) if times else None
    return out


def last_answer(fleet: Fleet, model: str, value: float, since: float) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for h in fleet.hosts:
        t = h.traffic.get(model)
        times = [at for at, status, answer in (t.results if t else []) if status == 200 and answer == value]
        out[h.name] = round(times[-1] - since, 2) if times else None
    return out


def back_on(results: list[tuple[float, int, float]], since: float, previous: float = 1.0) -> float | None:
    """Seconds from ``since`` to the first answer of the previous artifact after the host stopped giving it."""
    left = False
    for at, status, answer in results:
        if at < since:
            continue
        if status != 200 or answer != previous:
            left = True
        elif left:
            return round(at - since, 2)
    return None


def failures_after(fleet: Fleet, model: str, since: float) -> dict[str, int]:
    return {
        h.name: sum(1 for at, status, _ in h.traffic[model].results if at >= since and status != 200)
        for h in fleet.hosts
    }


def failed_per_second(fleet: Fleet, model: str, since: float) -> dict[str, list[int]]:
    """Per host: its failed requests in each second from ``since`` (item i: from i to i + 1 s), to its last request."""
    out: dict[str, list[int]] = {}
    for h in fleet.hosts:
        ats = [at - since for at, _, _ in h.traffic[model].results if at >= since]
        bins = [0] * (math.floor(max(ats)) + 1 if ats else 0)
        for at, status, _ in h.traffic[model].results:
            if at >= since and status != 200:
                bins[math.floor(at - since)] += 1
        out[h.name] = bins
    return out


EVIDENCE = ("requests", "failures", "failure_ratio", "avg_ms")


def evidence(d: dict[str, Any]) -> dict[str, Any]:
    """The figures of a verdict's evidence (the canaries' and the baseline's requests, failures, latency)."""
    ev = d.get("evidence") or {}
    out: dict[str, Any] = {
        side: {k: ev[side][k] for k in EVIDENCE if k in ev[side]}
        for side in ("canary", "baseline")
        if isinstance(ev.get(side), dict)
    }
    out.update({k: ev[k] for k in ("failure_increase", "latency_ratio", "baked_s") if k in ev})
    return out


def decisions(fleet: Fleet, model: str, wall0: float, mono0: float) -> dict[str, list[dict[str, Any]]]:
    """Each host's rollout decisions, with their time from the upload (log timestamps, this machine's clock)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for h in fleet.hosts:
        rows = []
        for d in h.decisions(model):
            at = datetime.fromisoformat(d["ts"].replace("Z", "+00:00")).timestamp()
            row = {"verdict": d["verdict"], "t": round(at - wall0, 2), "reason": d.get("reason", "")[:200]}
            if d["verdict"] in ("promoted", "rejected") and (figures := evidence(d)):
                row["evidence"] = figures
            rows.append(row)
        installs = [
            d for d in h.lines() if d.get("model") == model and str(d.get("msg", "")).startswith(f"{model} in sync")
        ]
        for d in installs:
            at = datetime.fromisoformat(d["ts"].replace("Z", "+00:00")).timestamp()
            if at >= wall0:
                rows.append({"verdict": "installed", "t": round(at - wall0, 2), "sha256": d.get("sha256", "")[:12]})
        out[h.name] = sorted(rows, key=lambda r: r["t"])
    del mono0
    return out


def rollout(fleet: Fleet, model: str, add: float, behaviour: str, timeout: float) -> dict[str, Any]:
    """Upload v(add) of ``model`` (serving v1 under traffic) and watch it until it settles."""
    wall0, mono0 = time.time(), time.monotonic()
    rejected_s = math.nan
    fleet.upload(model, rollout_files(model, add, behaviour))
    if behaviour == "ok":
        wait_for(lambda: fleet.answers(model) == [add] * len(fleet.hosts), timeout=timeout, step=0.1)
    else:
        wait_for(lambda: "rejected" in [v["verdict"] for v in (fleet.state(model) or {}).get("verdicts", [])],
                 timeout=timeout, step=0.2)  # fmt: skip
        rejected_s = round(time.monotonic() - mono0, 2)
        wait_for(lambda: fleet.answers(model) == [1.0] * len(fleet.hosts), timeout=timeout, step=0.1)
    time.sleep(2.0)  # traffic after the end, on every host
    first = first_answer(fleet, model, add, mono0)
    return {
        "behaviour": behaviour,
        "rejected_s": rejected_s if behaviour != "ok" else None,
        "first_new_answer_s": first,  # a failing build never answers: then "serve" is its first failure
        "first_failure_s": {
            h.name: next(
                (round(at - mono0, 2) for at, status, _ in h.traffic[model].results if at >= mono0 and status != 200),
                None,
            )
            for h in fleet.hosts
        },
        "last_previous_answer_s": last_answer(fleet, model, 1.0, mono0),
        "back_on_previous_s": {h.name: back_on(h.traffic[model].results, mono0) for h in fleet.hosts},
        "failed_requests": failures_after(fleet, model, mono0),
        "failed_per_second": failed_per_second(fleet, model, mono0),
        "requests": {h.name: sum(1 for at, *_ in h.traffic[model].results if at >= mono0) for h in fleet.hosts},
        "decisions": decisions(fleet, model, wall0, mono0),
        "verdicts": [v["verdict"] for v in (fleet.state(model) or {}).get("verdicts", [])],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--bake", type=float, default=20.0)
    p.add_argument("--min-requests", type=int, default=30)
    p.add_argument("--fraction", type=float, default=0.25)
    p.add_argument("--timeline", type=Path, default=None, help="write the two rollouts' timelines here (JSON)")
    args = p.parse_args(argv)
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    moto = Moto(f"http://127.0.0.1:{port}")
    goal = args.bake + 30.0
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        fleet = Fleet(
            moto,
            Path(tmp),
            args.hosts,
            canary_fraction=args.fraction,
            bake_seconds=args.bake,
            bake_min_requests=args.min_requests,
            max_latency_ratio=1.5,  # the default (the test fleet loosens it)
        )
        results: dict[str, Any] = {}
        try:
            fleet.start_all()
            for name, behaviour, add in (("good", "ok", 2.0), ("harmful", "fail", 3.0)):
                model = f"bench-{name}"
                fleet.upload(model, rollout_files(model, 1.0))
                wait_for(lambda m=model: fleet.answers(m) == [1.0] * len(fleet.hosts), timeout=180, step=0.3)
                fleet.traffic(model)
                time.sleep(3.0)
                results[name] = rollout(fleet, model, add, behaviour, timeout=goal + 120)
                fleet.stop_traffic(model)
            # The reference: today's fan-out, every host at once.
            for h in fleet.hosts:
                fleet.stop(h)
            fleet.flags["canary-fraction"] = "0"
            fleet.start_all()
            model = "bench-reference"
            fleet.upload(model, rollout_files(model, 1.0))
            wait_for(lambda: fleet.answers(model) == [1.0] * len(fleet.hosts), timeout=180, step=0.3)
            fleet.traffic(model)
            time.sleep(3.0)
            results["reference"] = rollout(fleet, model, 2.0, "ok", timeout=120)
            fleet.stop_traffic(model)
            fleet.close()
            results["controller"] = controller_harmful(moto, Path(tmp) / "controller", args)
        finally:
            fleet.close()
            server.stop()
    report(results, args, goal)
    if args.timeline is not None:
        doc = {
            "description": "Two safe rollouts measured by bench/bench_rollout.py: seconds from the upload (PUT) per "
            "host. first_new_answer_s: the host's traffic first answered from the new artifact; first_failure_s: "
            "its first failed request; back_on_previous_s: its first answer from the previous artifact after "
            "serving the new one; failed_requests and requests: totals from the PUT on; failed_per_second: "
            "failed requests in each second from the PUT (item i: from i to i + 1 s); decisions: the daemon's "
            "rollout decisions and installs (log times), a verdict with the figures of its evidence. Drawn by "
            "python -m demo.preview rollout --from-bench FILE.",
            "settings": {
                "hosts": args.hosts,
                "canary_fraction": args.fraction,
                "bake_seconds": args.bake,
                "bake_min_requests": args.min_requests,
                "max_failure_increase": 0.01,
                "max_latency_ratio": 1.5,
            },
            "good": results["good"],
            "bad": results["harmful"],
            "reference_without_canary": results["reference"],
        }
        args.timeline.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"timeline written to {args.timeline}")
    return 0


def controller_harmful(moto: Moto, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The harmful artifact with the controller deciding, at the default bake (600 s)."""
    from tests.integration.controller.test_controller_rollouts import ControlledFleet, _transition

    _transition(moto, "/moto-api/state-manager/set-transition",
                {"model_name": "ecs::task", "transition": {"progression": "manual", "times": 1_000_000}})  # fmt: skip
    root.mkdir()
    fleet = ControlledFleet(moto, root, args.hosts)
    try:
        fleet.flags["canary-fraction"] = str(args.fraction)  # warned and ignored: the controller's decides
        fleet.start_controller(canary_fraction=args.fraction, bake_min_requests=args.min_requests,
                               max_latency_ratio=1.5)  # fmt: skip
        fleet.start_all()
        model = "bench-ctl-harmful"
        fleet.upload(model, rollout_files(model, 1.0))
        wait_for(lambda: fleet.answers(model) == [1.0] * len(fleet.hosts), timeout=180, step=0.3)
        wait_for(lambda: (fleet.state(model) or {}).get("stable") is not None, timeout=60)
        fleet.traffic(model)
        time.sleep(3.0)
        out = rollout(fleet, model, 3.0, "fail", timeout=150)
        fleet.stop_traffic(model)
        out["controller_decisions"] = [
            {k: d.get(k) for k in ("verdict", "reason", "ts")} for d in fleet.decisions(model)
        ]
        return out
    finally:
        fleet.close()


def _max(values: dict[str, float | None]) -> float:
    known = [v for v in values.values() if v is not None]
    return max(known) if known and len(known) == len(values) else math.nan


def report(results: dict[str, Any], args: argparse.Namespace, goal: float) -> None:
    good, bad, ref = results["good"], results["harmful"], results["reference"]
    first = good["first_new_answer_s"]
    canary = min((v, h) for h, v in first.items() if v is not None)
    others = sorted(v for h, v in first.items() if h != canary[1] and v is not None)
    print(
        f"\nsafe rollouts: {args.hosts} hosts, --canary-fraction {args.fraction:g}, --bake-seconds {args.bake:g}, "
        f"--bake-min-requests {args.min_requests}, default thresholds (goal: bake + 30 = {goal:g} s)\n"
    )
    print("  good artifact                                   seconds after the PUT")
    print(f"    first host (the canary, {canary[1]}) serves it            {canary[0]:7.2f}")
    print(f"    next host serves it                               {others[0] if others else math.nan:7.2f}")
    print(f"    every host serves it                              {_max(first):7.2f}   (goal <= {goal:g})")
    print(f"    failed requests, all hosts                        {sum(good['failed_requests'].values()):7d}")
    bad_first = {h: v for h, v in bad["first_failure_s"].items() if v is not None}
    bad_canary = next(iter(bad_first)) if len(bad_first) == 1 else None
    back = bad["back_on_previous_s"].get(bad_canary or "", None)
    print("  harmful artifact (fails every request)")
    print(f"    hosts that ever failed a request                  {len(bad_first):7d}   ({', '.join(bad_first)})")
    if bad_canary:
        print(f"    canary {bad_canary} first failure                           {bad_first[bad_canary]:7.2f}")
        print(f"    canary back on the previous artifact              {back if back is not None else math.nan:7.2f}   "
              f"(goal <= {goal:g})")  # fmt: skip
    outside = {h: n for h, n in bad["failed_requests"].items() if h != bad_canary}
    print(f"    failed requests outside the canary                {sum(outside.values()):7d}   {outside}")
    print(f"    failed requests on the canary                     {bad['failed_requests'].get(bad_canary or '', 0):7d}")
    print(f"    verdicts                                          {bad['verdicts']}")
    print(f"    rejected (self mode, --bake-seconds {args.bake:g})               {bad['rejected_s']:7.2f}")
    print("  reference: --canary-fraction 0 (every host at once, today's fan-out)")
    print(f"    every host serves the new artifact                {_max(ref['first_new_answer_s']):7.2f}")
    ctl = results["controller"]
    failing = {h: n for h, n in ctl["failed_requests"].items() if n}
    canary = max(failing, key=lambda h: failing[h]) if failing else ""
    outside = sum(n for h, n in ctl["failed_requests"].items() if h != canary)
    print("  harmful artifact, the controller deciding (python -m controller --rollouts on), --bake-seconds 600")
    print(f"    rejected (the early abort)                        {ctl['rejected_s']:7.2f}   (goal <= 90)")
    print(f"    hosts that ever failed a request                  {len(failing):7d}   ({', '.join(failing)})")
    print(f"    failed requests outside the canary                {outside:7d}   (goal 0)")
    print(f"    failed requests on the canary                     {failing.get(canary, 0):7d}")
    print(f"    verdicts                                          {ctl['verdicts']}")


if __name__ == "__main__":
    sys.exit(main())
