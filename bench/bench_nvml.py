"""Per-cycle cost of the NVML source for 8 fake GPUs, next to references measured in the same run.

Prints medians of:
- ``NvmlSource.collect`` over 8 fake GPUs (the source's own Python work),
- the raw fake calls it makes, called directly in a loop (the floor: what
  any NVML reader pays for the same calls through this fake),
- the Triton /metrics parse of a payload with the same 8 GPUs and 10 models,
- a whole pipeline cycle with and without the NVML source.

On a real GPU each NVML call is a driver ioctl, so add the driver's cost per
call (printed: calls per cycle) to the first number; the fake measures only
the Python side.

    .venv/bin/python bench/bench_nvml.py [--runs 300]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: demo/, tests/support/nvml_fake.py

import pynvml

from catalog import build
from demo.payloads import triton_metrics
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.sources import Collected, SourceKind
from exporter.sources.nvml import MEMORY_TEMP_FIELD, MEMORY_V2, NvmlSource
from exporter.sources.promtext import Parser
from tests.support import nvml_fake as fk

CATALOG = build()  # the built-in catalog, built once by this script

GPUS = 8


def median_us(fn: Callable[[], object], runs: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def raw_calls(fake: fk.FakeNvml, handles: list[fk.FakeHandle], event_set: object) -> None:
    """The same calls the source makes in one cycle, without its bookkeeping."""
    with contextlib.suppress(pynvml.NVMLError):
        fake.nvmlEventSetWait(event_set, 0)
    for h in handles:
        fake.nvmlDeviceGetUtilizationRates(h)
        fake.nvmlDeviceGetMemoryInfo(h, version=MEMORY_V2)
        fake.nvmlDeviceGetPowerUsage(h)
        fake.nvmlDeviceGetEnforcedPowerLimit(h)
        fake.nvmlDeviceGetTotalEnergyConsumption(h)
        fake.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
        fake.nvmlDeviceGetFieldValues(h, [MEMORY_TEMP_FIELD])
        fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
        fake.nvmlDeviceGetCurrentClocksEventReasons(h)
        fake.nvmlDeviceGetTotalEccErrors(h, 0, 0)
        fake.nvmlDeviceGetTotalEccErrors(h, 1, 0)
        fake.nvmlDeviceGetRemappedRows(h)
        fake.nvmlDeviceGetPcieReplayCounter(h)


def grouped_metrics(step: int, uuids: list[str]) -> str:
    """Triton-shaped /metrics for 10 models and these GPUs (one TYPE block per family, as Triton prints them)."""
    return triton_metrics(10, step, gpus=uuids)


class Fixed:
    """A Triton /metrics source that parses the same text every cycle."""

    name = "triton_metrics"

    kind = SourceKind.TRITON

    def __init__(self, text: str) -> None:
        self.text = text
        self.parser = Parser(CATALOG.wanted_samples())

    def collect(self, timeout: float) -> Collected:
        return Collected(samples=self.parser.parse(self.text))

    def close(self) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()

    fake = fk.FakeNvml(fk.gpus(GPUS))
    source = NvmlSource(fake, {})
    source.start()
    source.collect(5.0)  # the first cycle also learns which fields the boards lack
    calls = fake.calls
    source.collect(5.0)
    per_cycle_calls = fake.calls - calls
    collect_us = median_us(lambda: source.collect(5.0), args.runs)

    raw = fk.FakeNvml(fk.gpus(GPUS))
    raw.nvmlInit()
    handles = [raw.nvmlDeviceGetHandleByIndex(i) for i in range(GPUS)]
    event_set = raw.nvmlEventSetCreate()
    raw_us = median_us(lambda: raw_calls(raw, handles, event_set), args.runs)

    text = grouped_metrics(1, fk.UUIDS[:GPUS])
    prom = Parser(CATALOG.wanted_samples())
    parse_us = median_us(lambda: prom.parse(text), args.runs)

    def cycle_us(with_nvml: bool) -> float:
        sources: list = [Fixed(text)]
        if with_nvml:
            sources.append(NvmlSource(fk.FakeNvml(fk.gpus(GPUS)), {}))
        pipeline = Pipeline(Settings(nvml="on"), CATALOG, sources)
        return median_us(pipeline.cycle, max(args.runs // 3, 20))

    without, with_nvml = cycle_us(False), cycle_us(True)
    source.close()

    print(f"NVML source, {GPUS} fake GPUs ({per_cycle_calls} NVML calls per cycle), median of {args.runs} runs:")
    print(f"  NvmlSource.collect                      {collect_us:9.1f} us")
    print(f"  the same fake calls, called directly    {raw_us:9.1f} us   (source overhead x{collect_us / raw_us:.2f})")
    print(f"  Triton /metrics parse, 10 models+{GPUS} GPUs {parse_us:9.1f} us   ({len(text)} bytes)")
    print(f"  pipeline cycle without NVML             {without:9.1f} us")
    print(f"  pipeline cycle with NVML                {with_nvml:9.1f} us   (+{with_nvml - without:.1f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
