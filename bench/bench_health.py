"""Wall time of the deep health probe next to ``curl -sf <url>/v2/health/ready``.

Starts a real Triton (demo.triton) with the healthy sample models, then times,
in the same run and interleaved (one round of every variant, ``--runs`` times,
so a busy machine slows them all alike): a bare ``python3 -I -S -c pass``, curl,
the probe as the ECS healthCheck runs it (a new ``python3 health.py`` process),
the same without a bytecode cache (a read-only folder: the modules are compiled
on every run), with ``--smoke``, and the probe in-process. Prints medians, the
ratio to curl, the probe's imports, and whether its start-up target holds:

    probe process - bare interpreter <= 3 x curl

    .venv/bin/python bench/bench_health.py [--runs 30]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo.triton import TritonServer, copy_models
from triton_side import probe

MODELS = ["add", "slow", "text"]
SCRIPT = Path(probe.__file__).with_name("health.py")
TARGET = 3.0  # the probe's overhead over a bare interpreter, in multiples of curl's time


def race(variants: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median milliseconds of each variant, run round-robin after one warm-up round."""
    for fn in variants.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(runs):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000)
    return {name: statistics.median(ts) for name, ts in times.items()}


def expect(code: int, what: str) -> None:
    if code != 0:
        raise SystemExit(f"{what} exited {code}: the server is not healthy, numbers would be meaningless")


def run(cmd: list[str], what: str) -> Callable[[], None]:
    return lambda: expect(subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode, what)


def imports(python: str, url: str) -> tuple[list[str], float]:
    """Modules the probe's run imports beyond a bare interpreter, and their import time (-X importtime)."""

    def read(cmd: list[str]) -> list[tuple[str, int]]:
        """(name with its indentation, cumulative microseconds) per line of -X importtime."""
        err = subprocess.run(cmd, capture_output=True, text=True).stderr
        rows = []
        for line in err.splitlines():
            parts = line.split("|")
            if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
                rows.append((parts[2][1:].rstrip(), int(parts[1])))
        return rows

    bare = {name.strip() for name, _ in read([python, "-X", "importtime", "-I", "-S", "-c", "pass"])}
    rows = read([python, "-X", "importtime", "-I", "-S", str(SCRIPT), "--url", url, "--quiet"])
    extra = [(name, us) for name, us in rows if name.strip() not in bare]
    return [name.strip() for name, _ in extra], sum(us for name, us in extra if not name.startswith(" "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-health-"))
    server = TritonServer(copy_models(MODELS, work / "models"), workdir=work)
    server.start()
    try:
        url = server.url
        # the system interpreter, as in the Triton image (a pyenv shim would add ~50 ms of bash)
        python3 = next((p for p in ("/usr/bin/python3",) if Path(p).exists()), None)
        python3 = python3 or shutil.which("python3") or sys.executable
        curl = shutil.which("curl")
        probe_cmd = [python3, "-I", "-S", str(SCRIPT), "--url", url, "--deadline", "4"]
        uncached = work / "no-pycache"  # -B: never written; an empty prefix: never read
        variants: dict[str, Callable[[], object]] = {
            "python3 -I -S -c pass (bare interpreter)": run([python3, "-I", "-S", "-c", "pass"], "python3"),
        }
        if curl:
            variants["curl -sf /v2/health/ready"] = run([curl, "-sf", f"{url}/v2/health/ready"], "curl")
        else:
            print("note: no curl here (apt-get install curl): the target below cannot be checked")
        variants |= {
            "python3 -I -S health.py (the ECS healthCheck)": run(probe_cmd, "health.py"),
            "  same, no bytecode cache (read-only folder)": run(
                [python3, "-B", "-X", f"pycache_prefix={uncached}", *probe_cmd[1:]], "health.py uncached"
            ),
            "python3 -I -S health.py --smoke": run([*probe_cmd, "--smoke"], "health.py --smoke"),
            "probe in-process": lambda: expect(probe.main(["--url", url, "--quiet"]), "probe"),
            "probe in-process --smoke": lambda: expect(probe.main(["--url", url, "--quiet", "--smoke"]), "probe"),
        }
        ms = race(variants, args.runs)
        base = ms.get("curl -sf /v2/health/ready")
        print(f"Triton at {url}, models {', '.join(MODELS)}, {python3}, median of {args.runs} interleaved runs")
        for name, value in ms.items():
            ratio = f"{value / base:6.1f}x curl" if base else ""
            print(f"  {name:<48} {value:8.2f} ms  {ratio}")
        modules, import_us = imports(python3, url)
        print(f"  imports beyond the bare interpreter: {', '.join(modules)} "
              f"({import_us / 1000:.1f} ms by -X importtime)")  # fmt: skip
        overhead = ms["python3 -I -S health.py (the ECS healthCheck)"] - ms["python3 -I -S -c pass (bare interpreter)"]
        if base:
            verdict = "met" if overhead <= TARGET * base else "NOT met"
            print(f"  start-up target: probe - bare = {overhead:.2f} ms, {TARGET:g} x curl = {TARGET * base:.2f} ms: "
                  f"{verdict} ({overhead / base:.1f}x curl)")  # fmt: skip
        else:
            print(f"  probe - bare = {overhead:.2f} ms; target not checked (no curl)")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
