"""Command line: a demo run and the dashboard preview; a redraw from a kept run; a rollout timeline.

python -m demo.preview [--window 5] [--windows 8] [--out docs/dashboard-preview.png] [--keep DIR] [--no-gpu-fake]
python -m demo.preview draw DIR/events.jsonl [--out PNG]
python -m demo.preview rollout [--from-bench docs/rollout-timeline.json] [--out docs/rollout-timeline.png]
python -m demo.preview rollout EVENTS.json [--out PNG]

Each drawing of the dashboard writes two PNGs: the whole dashboard (``--out``) and, next to it with
``-top`` added to its name (docs/dashboard-preview-top.png, the README's picture), its first screen:
status, alarms, the first row of graphs and one GPU panel, on half the width at twice the pixels.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from catalog import build, modelsync_catalog

from . import collect, dashboard, rollout, rollout_bench
from .alarms import load_alarms
from .emf import Store
from .metricmath import Clock, Data

ROOT = collect.ROOT
DASHBOARD = ROOT / "dashboards" / "triton.json"
ALARMS = ROOT / "alarms" / "cli"
OUT = ROOT / "docs" / "dashboard-preview.png"
GPU_FAKE_NOTE = "GPU panel from the test suite's NVML fake, no GPU here"
TIMELINE = ROOT / "docs" / "rollout-timeline.json"
ROLLOUT_PNG = ROOT / "docs" / "rollout-timeline.png"


def _say(text: str) -> None:
    print(f"preview: {text}", file=sys.stderr, flush=True)


def rules(folder: Path = ALARMS) -> dict[str, dict[str, Any]]:
    """The Contributor Insights rules the dashboard's INSIGHT_RULE_METRIC expressions name, by rule name."""
    out = {}
    for path in sorted(folder.glob("insight-rule-*.json")):
        doc = json.loads(path.read_text())
        out[doc["RuleName"]] = json.loads(doc["RuleDefinition"])
    return out


@functools.cache
def scope(name: str) -> str | None:
    """A metric's catalog scope (``gpu``, ``modelsync``, ...), None for a name neither catalog has."""
    metric = build().definition(name) or modelsync_catalog().definition(name)
    return None if metric is None else metric.scope.value


def scope_of() -> dashboard.Reason:
    return dashboard.no_data_reason(scope)


def gpu_fake_note(names: list[str]) -> str:
    """The line under a GPU graph's title when the run's exporter read the NVML fake."""
    return GPU_FAKE_NOTE if any(scope(n) == "gpu" for n in names if not n.startswith("rule:")) else ""


def top_of(out: Path) -> Path:
    """Where the first screen goes: ``-top`` added to the whole dashboard's file name."""
    return out.with_name(f"{out.stem}-top{out.suffix}")


def draw_run(events: Path, out: Path, body_path: Path = DASHBOARD) -> Path:
    """Draw a run's dashboard into ``out`` and its first screen into :func:`top_of` ``out``; returns ``out``."""
    meta, groups = collect.load(events)
    store = Store.from_lines(e.message for evs in groups.values() for e in evs)
    window = float(meta["window"])
    # Periods start half a window before each of the exporter's windows (its heartbeat marks each one).
    beats = [p.time for key, points in store.points.items() if key.name == "ExporterHeartbeat" for p in points]
    data = Data(store, Clock.around(beats or store.times(), window), groups, rules())
    started = datetime.fromtimestamp(float(meta.get("started", time.time())), UTC)
    name = body_path.relative_to(ROOT) if body_path.is_relative_to(ROOT) else body_path
    fake = meta.get("nvml")
    gpu = f" on the test suite's NVML fake (its {fake!r} GPUs; no GPU here)" if fake else " (no GPU here: NVML absent)"
    heading = [
        f"Preview of {name}, drawn from a demo run on {started:%Y-%m-%d} (times UTC)",
        f"A real local Triton (no GPU) with the demo's sample models and traffic; the exporter's loop{gpu} for "
        f"{meta.get('windows')} windows of {window:g} s, each standing for one {Clock(0, window).base:g} s "
        "period of the dashboard; model sync on moto's S3 with safe rollouts (an update through a canary bake to "
        "its verdict, then a refused archive); logs routed "
        "by the shipped Fluent Bit configuration. Regenerate: bash scripts/preview.sh",
    ]
    body = json.loads(body_path.read_text())
    alarms, note = load_alarms(ALARMS), gpu_fake_note if fake else None
    dashboard.save(dashboard.draw(body, data, alarms, scope_of(), heading, note=note), out)
    first = [
        f"The first screen of {name} (status, alarms, the first row) and one GPU panel, from a demo run on "
        f"{started:%Y-%m-%d} (times UTC)",
        f"Re-flowed onto half the dashboard's width; the whole dashboard: {out.name}. A real local Triton (no GPU), "
        f"the exporter's loop{gpu}, model sync on moto's S3. Regenerate: bash scripts/preview.sh",
    ]
    fig = dashboard.draw(dashboard.top(body), data, alarms, scope_of(), first, dashboard.TOP_COLUMNS, note)
    dashboard.save(fig, top_of(out), scale=2)
    return out


def draw_rollout(args: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m demo.preview rollout",
        description="Draw a model-sync rollout timeline: by default the good and the bad rollouts that "
        "bench/bench_rollout.py "
        f"measured ({TIMELINE.relative_to(ROOT)}) into {ROLLOUT_PNG.relative_to(ROOT)}.",
    )
    p.add_argument(
        "events", type=Path, nargs="?", help="a rollout's per-host events instead (schema: demo/preview/rollout.py)"
    )
    p.add_argument(
        "--from-bench",
        type=Path,
        metavar="FILE",
        help=f"bench/bench_rollout.py's --timeline file (default {TIMELINE.relative_to(ROOT)})",
    )
    p.add_argument(
        "--runs",
        nargs="+",
        default=list(rollout_bench.RUNS),
        help="the bench's rollouts to draw, one panel each (default: good bad)",
    )
    p.add_argument("--out", type=Path, default=ROLLOUT_PNG, help=f"the PNG (default {ROLLOUT_PNG.relative_to(ROOT)})")
    a = p.parse_args(args)
    if a.events is not None and a.from_bench is not None:
        p.error("give either a rollout's events or --from-bench, not both")
    try:
        if a.events is not None:
            fig = rollout.draw(rollout.load(a.events))
        else:
            doc = rollout_bench.load(a.from_bench or TIMELINE)
            fig = rollout.draw(*rollout_bench.rollouts(doc, tuple(a.runs)), heading=rollout_bench.heading(doc))
    except rollout.RolloutError as exc:
        _say(f"error: {exc}")
        return 1
    rollout.save(fig, a.out)
    _say(f"wrote {a.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "draw":
        p = argparse.ArgumentParser(prog="python -m demo.preview draw", description="redraw from a kept run")
        p.add_argument("events", type=Path, help="events.jsonl of a run (--keep DIR)")
        p.add_argument("--out", type=Path, default=OUT)
        a = p.parse_args(args[1:])
        _say(f"wrote {draw_run(a.events, a.out)} and {top_of(a.out)}")
        return 0
    if args and args[0] == "rollout":
        return draw_rollout(args[1:])
    p = argparse.ArgumentParser(prog="python -m demo.preview", description=__doc__.splitlines()[0])
    p.add_argument("--window", type=float, default=5.0, help="seconds per exporter window (default 5)")
    p.add_argument("--windows", type=int, default=8, help="exporter windows to collect (default 8)")
    p.add_argument("--out", type=Path, default=OUT, help=f"the PNG (default {OUT.relative_to(ROOT)})")
    p.add_argument("--keep", type=Path, help="keep the run's files (events.jsonl) in this folder")
    p.add_argument(
        "--no-gpu-fake",
        action="store_true",
        help=f"run the exporter without the test suite's NVML fake ({collect.NVML_FAKE}): the GPU section then "
        "says it needs a GPU",
    )
    a = p.parse_args(args)
    if a.windows < 2 or a.window <= 0:
        p.error("--windows must be 2 or more and --window positive")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="triton-preview-") as tmp:
        folder = a.keep or Path(tmp)
        try:
            events = collect.run(folder, a.window, a.windows, _say, None if a.no_gpu_fake else collect.NVML_FAKE)
        except collect.RunFailed as exc:
            _say(f"error: {exc}")
            return 1
        _say(f"wrote {draw_run(events, a.out)} and {top_of(a.out)} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
