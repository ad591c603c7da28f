"""Benchmark: one full exporter cycle against prometheus_client's parser, same text, same run.

    .venv/bin/python bench/bench_pipeline.py [--models 10 100 1000] [--repeat 15]

For each size it builds a /metrics body in Triton's exact shape (summaries on,
one GPU), then times, in a fresh process each:
- ours: a full cycle of the pipeline (parse, filter, deltas, transform, EMF
  bytes; no network), median of --repeat cycles after a warm-up;
- reference: prometheus_client's text_string_to_metric_families over the same
  text, fully consumed, median of the same number of runs;
and prints their ratio and each process's peak RSS. Targets at 1000 models:
ratio >= 20, our RSS <= 60 MB.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _ours(models: int, repeat: int) -> dict:
    from demo.payloads import model_names, triton_metrics
    from exporter.config import Settings
    from exporter.pipeline import Pipeline
    from tests.helpers import IndexSource, TextSource

    names = model_names(models)
    index = json.dumps([{"name": n, "version": "1", "state": "READY"} for n in names]).encode()
    source = TextSource(triton_metrics(names, step=1, gpus=["GPU-0"]))
    body_kb = len(source.texts[0]) / 1024
    clock = [0.0]
    pipe = Pipeline(Settings(max_models=max(models, 1)), [source, IndexSource(index)], clock=lambda: clock[0])
    pipe.cycle()  # baseline (and label cache warm-up)
    times, events, size = [], 0, 0
    for step in range(2, repeat + 2):
        source.texts = [triton_metrics(names, step=step, gpus=["GPU-0"])]  # one body alive at a time
        source.calls = 0
        clock[0] += 60.0
        start = time.perf_counter()
        result = pipe.cycle()
        times.append(time.perf_counter() - start)
        events, size = len(result.events), sum(map(len, result.events))
    return {"ms": statistics.median(times) * 1e3, "rss_mb": _rss_mb(), "events": events, "emf_kb": size / 1024,
            "body_kb": body_kb}


def _reference(models: int, repeat: int) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    from demo.payloads import model_names, triton_metrics

    text = triton_metrics(model_names(models), step=1, gpus=["GPU-0"])
    times = []
    for _ in range(max(3, repeat // 3)):
        start = time.perf_counter()
        samples = sum(len(f.samples) for f in text_string_to_metric_families(text))
        times.append(time.perf_counter() - start)
    return {"ms": statistics.median(times) * 1e3, "rss_mb": _rss_mb(), "samples": samples}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(kind: str, models: int, repeat: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(models), str(repeat)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, models, repeat = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        print(json.dumps((_ours if kind == "ours" else _reference)(models, repeat)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    print(f"{'models':>6} {'body KB':>8} {'events':>6} {'EMF KB':>7} {'ours ms':>8} {'prom ms':>8} "
          f"{'ratio':>6} {'ours RSS MB':>11} {'prom RSS MB':>11}")
    for n in args.models:
        ours = _child("ours", n, args.repeat)
        ref = _child("reference", n, args.repeat)
        print(f"{n:>6} {ours['body_kb']:>8.0f} {ours['events']:>6} {ours['emf_kb']:>7.0f} {ours['ms']:>8.1f} "
              f"{ref['ms']:>8.1f} {ref['ms'] / ours['ms']:>6.1f} {ours['rss_mb']:>11.1f} {ref['rss_mb']:>11.1f}")


if __name__ == "__main__":
    main()
