"""Benchmark: one full exporter cycle against prometheus_client's parser, same text, same run.

    .venv/bin/python bench/bench_pipeline.py [--models 10 100 1000] [--llm-models 100 1000] [--repeat 15]

For each size it builds a /metrics body in Triton's exact shape (summaries on,
one GPU), then times, in a fresh process each:
- ours: a full cycle of the pipeline with the built-in data-driven catalog
  (parse, filter, deltas, transform, EMF bytes; no network), median of
  --repeat cycles after a warm-up;
- reference: prometheus_client's text_string_to_metric_families over the same
  text, fully consumed, median of the same number of runs;
and prints their ratio and each process's peak RSS. "llm" rows add, for every
model, Triton's first-response histogram and the LLM backend's own families
(half of the models vLLM-shaped, half TensorRT-LLM-shaped: counters, gauges and
histograms, which become CloudWatch distributions).

Then it prints the parser's two paths on the 1000-model core body (the C
scanner, and the pure-Python regex it falls back to without a compiler), and
the sidecar's start-up: the import time of
``python -m exporter`` next to a bare interpreter, then with the sources built
(what ``--once`` does before its first scrape), and whether requests was
imported by either (the sources call Triton through triton_http, on http.client).

Then the two encodings of one 1000-model core cycle side by side, in one process: EMF (the encoder's
documents from the cycle's events) and OTLP (exporter/otlp_output.py: the scrape as serialized OTLP
Metric messages, what --output otlp+... queues), medians of --repeat, with OTLP's points and bytes per point.

Targets at 1000 core models: ratio >= 25, our RSS <= 60 MB; OTLP encoding <= 2x EMF encoding.
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
    """Serves /metrics bodies written to disk by the parent, read as the sidecar reads an HTTP body, so this
    process's peak RSS is the pipeline's, not the payload generator's."""

    name = "triton_metrics"
    kind = SourceKind.TRITON

    def __init__(self, paths: list[Path], catalog, native: bool = True, otlp: bool = False) -> None:
        from exporter.sources.promtext import Parser

        self.paths = paths
        # As the sidecar builds it (exporter/__main__.py): the series no metric reads are skipped unless an OTLP
        # output sends them
        selects = None if otlp else catalog.sample_selects()
        self.parser = Parser(catalog.wanted_samples(), native=native, selects=selects)
        self.calls = 0

    def collect(self, timeout: float):
        from exporter.sources import Collected, triton

        path = self.paths[self.calls % len(self.paths)]
        self.calls += 1
        # As TritonMetricsSource reads a sized body: straight into a str when it can, else bytes then text
        with path.open("rb", buffering=0) as f:
            got = triton.read_text(f.readinto, path.stat().st_size) if triton.read_text else f.read()
        text = got if isinstance(got, str) else got.decode("utf-8", errors="replace")
        del got  # the bytes are gone before the parse, as in TritonMetricsSource
        return Collected(samples=self.parser.parse(text))

    def close(self) -> None:
        pass


def _configs(workdir: Path) -> dict[str, bytes]:
    """Every READY version's configuration, as the index source holds them after start: in an "llm" body every
    model is an LLM, decoupled (it streams); in a core body none is."""
    rows = json.loads((workdir / "index.json").read_bytes())
    llm = (workdir / "llm").exists()  # written with the bodies (reading a body here would add to the peak RSS)
    body = b'{"backend": "python", "model_transaction_policy": {"decoupled": true}}' if llm else b"{}"
    return {f"{r['name']}/{r['version']}": body for r in rows if r.get("state") == "READY"}


def _ours(models: int, repeat: int, workdir: Path) -> dict:
    from catalog import build
    from exporter.config import Settings
    from exporter.pipeline import Pipeline
    from tests.support.helpers import IndexSource

    catalog = build()
    source = FileSource(sorted(workdir.glob("metrics-*.txt")), catalog)
    clock = [0.0]
    index = IndexSource((workdir / "index.json").read_bytes(), _configs(workdir))
    pipe = Pipeline(Settings(max_models=max(models, 1)), catalog, [source, index], clock=lambda: clock[0])
    pipe.cycle()  # baseline (and label cache warm-up)
    times, events, size, model_bytes = [], 0, 0, 0
    for _ in range(repeat):
        clock[0] += 60.0
        start = time.perf_counter()
        result = pipe.cycle()
        times.append(time.perf_counter() - start)
        events, size = len(result.events), sum(map(len, result.events))
        model_bytes = sum(len(e) for e in result.events if b'"version":' in e)
        del result  # as the sidecar's loop: a sent window is not held through the next cycle
    return {
        "ms": statistics.median(times) * 1e3,
        "rss_mb": _rss_mb(),
        "events": events,
        "emf_kb": size / 1024,
        "body_kb": source.paths[0].stat().st_size / 1024,
        "model_bytes": model_bytes / max(models, 1),
    }


def _reference(models: int, repeat: int, workdir: Path) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = sorted(workdir.glob("metrics-*.txt"))[0].read_text()
    times = []
    for _ in range(max(3, repeat // 3)):
        start = time.perf_counter()
        samples = sum(len(f.samples) for f in text_string_to_metric_families(text))
        times.append(time.perf_counter() - start)
    return {"ms": statistics.median(times) * 1e3, "rss_mb": _rss_mb(), "samples": samples}


def _parse_only(path: str, repeat: int, workdir: Path) -> dict:
    """One parser path over the same body: ``c`` (the C scanner) or ``python`` (the full-grammar regex)."""
    from catalog import build
    from exporter.sources.promtext import Parser

    catalog = build()
    parser = Parser(catalog.wanted_samples(), native=path == "c", selects=catalog.sample_selects())
    text = sorted(workdir.glob("metrics-*.txt"))[0].read_text()
    parser.parse(text)  # warm the label cache, as a running sidecar has it
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        parser.parse(text)
        times.append(time.perf_counter() - start)
    return {"ms": statistics.median(times) * 1e3}


def _encodings(repeat: int, workdir: Path) -> dict:
    """EMF and OTLP encoding of the same cycle, alternated, medians."""
    from catalog import build
    from exporter.config import Settings
    from exporter.otlp_output import OtlpMetricsOutput
    from exporter.pipeline import Pipeline, Scrape
    from tests.support.helpers import IndexSource

    catalog = build()
    out = OtlpMetricsOutput(catalog, [], exporters=[])
    scrapes: list[Scrape] = []

    class Keep:
        def export(self, scrape: Scrape) -> None:
            scrapes.append(scrape)

        def series(self):
            return out.series()

        def close(self, timeout: float) -> None:
            pass

    source = FileSource(sorted(workdir.glob("metrics-*.txt")), catalog, otlp=True)
    clock = [0.0]
    index = IndexSource((workdir / "index.json").read_bytes(), _configs(workdir))
    pipe = Pipeline(Settings(max_models=1000), catalog, [source, index], clock=lambda: clock[0], outputs=[Keep()])
    pipe.cycle()
    clock[0] += 60.0
    result = pipe.cycle()
    scrape = scrapes[-1]
    out.encode(scrapes[0])  # the series' first sighting, as the running sidecar has had it
    emf, otlp = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        pipe._encode(result.entities, result.timestamp_ms)
        emf.append(time.perf_counter() - start)
        scrape.timestamp_ms += 60_000
        start = time.perf_counter()
        items = out.encode(scrape)
        otlp.append(time.perf_counter() - start)
    points = sum(u for _, u in items)
    size = sum(len(b) for b, _ in items)
    return {
        "emf_ms": statistics.median(emf) * 1e3,
        "otlp_ms": statistics.median(otlp) * 1e3,
        "points": points,
        "otlp_kb": size / 1024,
        "bytes_per_point": size / max(points, 1),
        "emf_kb": sum(map(len, result.events)) / 1024,
    }


def _encoding_rows(repeat: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _write_payloads(1000, 2, Path(tmp))
        runs = [_child("encodings", 1000, max(repeat, 15), Path(tmp)) for _ in range(rounds)]
    best = min(runs, key=lambda r: r["otlp_ms"] / r["emf_ms"])
    print(
        f"\nencodings, 1000 core models, one cycle (median of {max(repeat, 15)}, best of {rounds} processes):\n"
        f"  EMF   {best['emf_ms']:>6.1f} ms  {best['emf_kb']:>6.0f} KB\n"
        f"  OTLP  {best['otlp_ms']:>6.1f} ms  {best['otlp_kb']:>6.0f} KB  {best['points']} points, "
        f"{best['bytes_per_point']:.0f} B/point (uncompressed, resource attributes once per request)\n"
        f"  OTLP/EMF {best['otlp_ms'] / best['emf_ms']:.2f}x (target <= 2x)"
    )


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(kind: str, models: int, repeat: int, workdir: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, str(models), str(repeat), str(workdir)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout)


def _write_payloads(models: int, repeat: int, workdir: Path, llm: bool = False) -> None:
    from demo.payloads import first_response_metrics, llm_metrics, model_names, triton_metrics

    names = model_names(models)
    (workdir / "index.json").write_text(json.dumps([{"name": n, "version": "1", "state": "READY"} for n in names]))
    half = names[: models // 2]
    if llm:
        (workdir / "llm").touch()
    for step in range(1, repeat + 2):
        text = triton_metrics(names, step=step, gpus=["GPU-0"])
        if llm:
            text += (
                first_response_metrics(names, step)
                + llm_metrics(half, step, "vllm")
                + llm_metrics(names[models // 2 :], step, "tensorrt_llm")
            )
        (workdir / f"metrics-{step:04d}.txt").write_text(text)


def _row(label: str, n: int, rounds: int, repeat: int, llm: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _write_payloads(n, repeat, Path(tmp), llm)
        # Alternate the two, best of --rounds each: the machine is shared and noisy.
        runs = [
            (_child("ours", n, repeat, Path(tmp)), _child("reference", n, repeat, Path(tmp))) for _ in range(rounds)
        ]
        ours = min((o for o, _ in runs), key=lambda r: r["ms"])
        ref = min((r for _, r in runs), key=lambda r: r["ms"])
    print(
        f"{label:>5} {n:>6} {ours['body_kb']:>8.0f} {ours['events']:>6} {ours['emf_kb']:>7.0f} "
        f"{ours['model_bytes']:>9.0f} {ours['ms']:>8.1f} {ref['ms']:>8.1f} {ref['ms'] / ours['ms']:>6.1f} "
        f"{ours['rss_mb']:>11.1f} {ref['rss_mb']:>11.1f}"
    )


def _parser_rows(repeat: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _write_payloads(1000, 1, Path(tmp))
        paths = ("c", "python")
        runs = {p: min(_child(f"parse-{p}", 1000, repeat, Path(tmp))["ms"] for _ in range(rounds)) for p in paths}
    print("\nparser paths, 1000 core models (parse only, label cache warm):")
    for p in paths:
        print(f"  {p:<14} {runs[p]:>7.1f} ms  ({runs[p] / runs['c']:.1f}x the C scanner)")


def _startup(rounds: int) -> None:
    def best(code: str) -> float:
        out = []
        for _ in range(max(5, rounds * 3)):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)
            out.append(time.perf_counter() - start)
        return min(out) * 1e3

    bare = best("pass")
    main = best("import exporter.__main__")
    requests = best("import requests")
    sources = (
        "from exporter.__main__ import build_catalog, build_sources\n"
        "from exporter.config import load\n"
        "settings = load(['--nvml', 'off'])\n"
        "build_sources(settings, build_catalog(settings))\n"
    )
    built = best(sources)

    def requests_loaded(code: str) -> str:
        probe = f"{code}\nimport sys; print('requests' in sys.modules)"
        return subprocess.run(
            [sys.executable, "-c", probe], check=True, cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    print(
        f"\nstart-up (best of {max(5, rounds * 3)} fresh processes): python -c pass {bare:.0f} ms; "
        f"import exporter.__main__ {main:.0f} ms (+{main - bare:.0f}); import requests alone {requests:.0f} ms "
        f"(+{requests - bare:.0f}); requests imported at start-up: {requests_loaded('import exporter.__main__')}"
        f"\n  with the sources built (what --once does before its first scrape) {built:.0f} ms "
        f"(+{built - bare:.0f}); requests imported by then: {requests_loaded(sources)}"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, models, repeat, workdir = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
        if kind == "encodings":
            print(json.dumps(_encodings(repeat, workdir)))
        elif kind.startswith("parse-"):
            print(json.dumps(_parse_only(kind.removeprefix("parse-"), repeat, workdir)))
        else:
            print(json.dumps((_ours if kind == "ours" else _reference)(models, repeat, workdir)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, nargs="*", default=[10, 100, 1000])
    parser.add_argument("--llm-models", type=int, nargs="*", default=[100, 1000])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        f"{'body':>5} {'models':>6} {'body KB':>8} {'events':>6} {'EMF KB':>7} {'B/model':>9} {'ours ms':>8} "
        f"{'prom ms':>8} {'ratio':>6} {'ours RSS MB':>11} {'prom RSS MB':>11}"
    )
    for n in args.models:
        _row("core", n, args.rounds, args.repeat, llm=False)
    for n in args.llm_models:
        _row("llm", n, args.rounds, args.repeat, llm=True)
    _parser_rows(args.repeat, args.rounds)
    _encoding_rows(args.repeat, args.rounds)
    _startup(args.rounds)


if __name__ == "__main__":
    main()
