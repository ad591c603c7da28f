"""Wall time of the deep health probe next to ``curl -sf <url>/v2/health/ready``.

Starts a real Triton (demo.triton) with the healthy sample models, then times,
in the same run: the probe in-process, the probe as a ``python3 health.py``
subprocess (what the ECS healthCheck pays), the same with ``--smoke``, and curl
(or a urllib GET when curl is missing). Prints medians and ratios to curl.

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
import urllib.request
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo.triton import TritonServer, copy_models
from exporter import health

MODELS = ["add", "slow", "text"]


def median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def expect(code: int, what: str) -> None:
    if code != 0:
        raise SystemExit(f"{what} exited {code}: the server is not healthy, numbers would be meaningless")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
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
        script = [python3, "-I", "-S", str(Path(health.__file__))]
        curl = shutil.which("curl")

        def in_process() -> None:
            expect(health.main(["--url", url, "--quiet"]), "probe")

        def in_process_smoke() -> None:
            expect(health.main(["--url", url, "--quiet", "--smoke"]), "probe --smoke")

        def subproc() -> None:
            expect(subprocess.run([*script, "--url", url, "--quiet"]).returncode, "health.py")

        def subproc_smoke() -> None:
            expect(subprocess.run([*script, "--url", url, "--quiet", "--smoke"]).returncode, "health.py --smoke")

        def baseline() -> None:
            if curl:
                expect(subprocess.run([curl, "-sf", f"{url}/v2/health/ready"]).returncode, "curl")
            else:
                with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as resp:
                    expect(0 if resp.status == 200 else 1, "GET ready")

        base_name = "curl -sf /v2/health/ready" if curl else "urllib GET /v2/health/ready (no curl)"
        rows = [
            (base_name, median_ms(baseline, args.runs)),
            ("probe in-process", median_ms(in_process, args.runs)),
            ("probe in-process --smoke", median_ms(in_process_smoke, args.runs)),
            (f"{python3} -I -S health.py", median_ms(subproc, args.runs)),
            ("python3 -I -S health.py --smoke", median_ms(subproc_smoke, args.runs)),
        ]
        base = rows[0][1]
        print(f"Triton at {url}, models {', '.join(MODELS)}, median of {args.runs} runs")
        for name, ms in rows:
            print(f"  {name:<48} {ms:8.2f} ms  {ms / base:6.1f}x")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
