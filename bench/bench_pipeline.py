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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from exporter.sources import SourceKind  # noqa: E402


class FileSource:
    """Serves /metrics bodies written to disk by the parent, read as bytes and decoded like an HTTP body,
    so this process's peak RSS is the pipeline's, not the payload generator's."""

    name = "triton_metrics"

    kind = SourceKind.TRITON

    def __init__(self, paths: list[Path], wanted: frozenset[str]) -> None:
        from exporter.promtext import Parser

        self.paths = paths
        self.parser = Parser(wanted)
        self.calls = 0

    def collect(self, timeout: float):
        from exporter.sources import Collected

        body = self.paths[self.calls % len(self.paths)].read_bytes()
        self.calls += 1
        return Collected(samples=self.parser.parse(body.decode("utf-8", errors="replace")))

    def close(self) -> None:
        pass


def _ours(models: int, repeat: int, workdir: Path) -> dict:
    from exporter.catalog import build
    from exporter.config import Settings
    from exporter.pipeline import Pipeline
    from tests.helpers import IndexSource

    catalog = build()
    source = FileSource(sorted(workdir.glob("metrics-*.txt")), catalog.wanted_samples())
    clock = [0.0]
    index = IndexSource((workdir / "index.json").read_bytes())
    pipe = Pipeline(Settings(max_models=max(models, 1)), catalog, [source, index],
                    clock=lambda: clock[0])
    pipe.cycle()  # baseline (and label cache warm-up)
    times, events, size = [], 0, 0
    for _ in range(repeat):
        clock[0] += 60.0
        start = time.perf_counter()
        result = pipe.cycle()
        times.append(time.perf_counter() - start)
        events, size = len(result.events), sum(map(len, result.events))
    return {"ms": statistics.median(times) * 1e3, "rss_mb": _rss_mb(), "events": events, "emf_kb": size / 1024,
            "body_kb": source.paths[0].stat().st_size / 1024}


def _reference(models: int, repeat: int, workdir: Path) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = sorted(workdir.glob("metrics-*.txt"))[0].read_text()
    times = []
    for _ in range(max(3, repeat // 3)):
        start = time.perf_counter()
        samples = sum(len(f.samples) for f in text_string_to_metric_families(text))
        times.append(time.perf_counter() - start)
    return {"ms": statistics.median(times) * 1e3, "rss_mb": _rss_mb(), "samples": samples}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(kind: str, models: int, repeat: int, workdir: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(models), str(repeat), str(workdir)],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def _write_payloads(models: int, repeat: int, workdir: Path) -> None:
    from demo.payloads import model_names, triton_metrics

    names = model_names(models)
    (workdir / "index.json").write_text(json.dumps([{"name": n, "version": "1", "state": "READY"} for n in names]))
    for step in range(1, repeat + 2):
        (workdir / f"metrics-{step:04d}.txt").write_text(triton_metrics(names, step=step, gpus=["GPU-0"]))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, models, repeat, workdir = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
        print(json.dumps((_ours if kind == "ours" else _reference)(models, repeat, workdir)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{'models':>6} {'body KB':>8} {'events':>6} {'EMF KB':>7} {'ours ms':>8} {'prom ms':>8} "
          f"{'ratio':>6} {'ours RSS MB':>11} {'prom RSS MB':>11}")
    for n in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            _write_payloads(n, args.repeat, Path(tmp))
            # Alternate the two, best of --rounds each: the machine is shared and noisy.
            runs = [(_child("ours", n, args.repeat, Path(tmp)), _child("reference", n, args.repeat, Path(tmp)))
                    for _ in range(args.rounds)]
            ours = min((o for o, _ in runs), key=lambda r: r["ms"])
            ref = min((r for _, r in runs), key=lambda r: r["ms"])
        print(f"{n:>6} {ours['body_kb']:>8.0f} {ours['events']:>6} {ours['emf_kb']:>7.0f} {ours['ms']:>8.1f} "
              f"{ref['ms']:>8.1f} {ref['ms'] / ours['ms']:>6.1f} {ours['rss_mb']:>11.1f} {ref['rss_mb']:>11.1f}")


if __name__ == "__main__":
    main()
