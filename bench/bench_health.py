"""Wall and CPU time of the deep health probe next to ``curl -sf <url>/v2/health/ready``.

Starts a real Triton (demo.triton) with the healthy sample models, then times,
in the same run and interleaved (one round of every variant, ``--runs`` times,
so a busy machine slows them all alike): a bare ``python3 -I -S -c pass``, curl,
the probe as the ECS healthCheck runs it (a new ``python3 health.py`` process),
the same without a bytecode cache (a read-only folder: the modules are compiled
on every run), with ``--smoke``, and the probe in-process. ``--reference DIR``
adds the healthCheck run of another copy of the folder (an earlier version:
``git archive <commit> triton_side | tar -x -C /tmp/ref``) to the same rounds.
Prints medians of wall time and of CPU time (user + system of the process, which
a busy machine disturbs less), the ratio to curl, the probe's imports, and
whether its start-up target holds:

    probe process - bare interpreter <= 3 x curl

    .venv/bin/python bench/bench_health.py [--runs 30] [--reference /tmp/ref/triton_side]
"""

from __future__ import annotations

import argparse
import resource
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


def race(variants: dict[str, Callable[[], object]], runs: int) -> dict[str, tuple[float, float]]:
    """Median wall and CPU milliseconds of each variant, run round-robin after one warm-up round.

    CPU is this process's and its children's user + system time over the call: a
    subprocess variant counts the child's, an in-process one this process's own.
    """
    for fn in variants.values():
        fn()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(runs):
        for name, fn in variants.items():
            c0, t0 = cpu(), time.perf_counter()
            fn()
            times[name].append(((time.perf_counter() - t0) * 1000, (cpu() - c0) * 1000))
    return {
        name: (statistics.median(w for w, _ in ts), statistics.median(c for _, c in ts)) for name, ts in times.items()
    }


def cpu() -> float:
    """Seconds of CPU used by this process and its finished children (getrusage: microseconds, not clock ticks)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def expect(code: int, what: str) -> None:
    if code != 0:
        raise SystemExit(f"{what} exited {code}: the server is not healthy, numbers would be meaningless")


def run(cmd: list[str], what: str) -> Callable[[], None]:
    return lambda: expect(subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode, what)


def imports(python: str, url: str, script: Path = SCRIPT) -> tuple[list[str], float]:
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
    rows = read([python, "-X", "importtime", "-I", "-S", str(script), "--triton-url", url, "--quiet"])
    extra = [(name, us) for name, us in rows if name.strip() not in bare]
    return [name.strip() for name, _ in extra], sum(us for name, us in extra if not name.startswith(" "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--reference", type=Path, help="another triton_side folder to time alongside (an earlier version)")
    args = ap.parse_args()
    reference = args.reference / "health.py" if args.reference else None
    if reference is not None and not reference.is_file():
        raise SystemExit(f"--reference {args.reference}: no health.py there")
    work = Path(tempfile.mkdtemp(prefix="bench-health-"))
    server = TritonServer(copy_models(MODELS, work / "models"), workdir=work)
    server.start()
    try:
        url = server.url
        # the system interpreter, as in the Triton image (a pyenv shim would add ~50 ms of bash)
        python3 = next((p for p in ("/usr/bin/python3",) if Path(p).exists()), None)
        python3 = python3 or shutil.which("python3") or sys.executable
        curl = shutil.which("curl")
        probe_cmd = [python3, "-I", "-S", str(SCRIPT), "--triton-url", url, "--deadline", "4"]
        # A read-only copy of the folder: -B, so no __pycache__ is ever written there (the standard library's own
        # cache is read as usual, as in an image whose folder was copied in without compileall).
        uncached = work / "read-only" / "triton_side"
        shutil.copytree(SCRIPT.parent, uncached, ignore=shutil.ignore_patterns("__pycache__"))
        variants: dict[str, Callable[[], object]] = {
            "python3 -I -S -c pass (bare interpreter)": run([python3, "-I", "-S", "-c", "pass"], "python3"),
        }
        if curl:
            variants["curl -sf /v2/health/ready"] = run([curl, "-sf", f"{url}/v2/health/ready"], "curl")
        else:
            print("note: no curl here (apt-get install curl): the target below cannot be checked")
        variants |= {
            "python3 -I -S health.py (the ECS healthCheck)": run(probe_cmd, "health.py"),
            **(
                {"  the same, --reference folder": run([python3, "-I", "-S", str(reference), *probe_cmd[4:]], "ref")}
                if reference
                else {}
            ),
            "  same, no bytecode cache (read-only folder)": run(
                [python3, "-B", "-I", "-S", str(uncached / "health.py"), *probe_cmd[4:]], "health.py uncached"
            ),
            "python3 -I -S health.py --smoke": run([*probe_cmd, "--smoke"], "health.py --smoke"),
            "probe in-process": lambda: expect(probe.main(["--triton-url", url, "--quiet"]), "probe"),
            "probe in-process --smoke": lambda: expect(
                probe.main(["--triton-url", url, "--quiet", "--smoke"]), "probe"
            ),
        }
        ms = race(variants, args.runs)
        base = ms["curl -sf /v2/health/ready"][0] if curl else None
        print(f"Triton at {url}, models {', '.join(MODELS)}, {python3}, median of {args.runs} interleaved runs")
        print(f"  {'':<48} {'wall':>8}     {'':<11} {'CPU':>8}")
        for name, (wall, cpu_ms) in ms.items():
            ratio = f"{wall / base:6.1f}x curl" if base else ""
            print(f"  {name:<48} {wall:8.2f} ms  {ratio:<11} {cpu_ms:8.2f} ms")
        modules, import_us = imports(python3, url)
        print(f"  imports beyond the bare interpreter: {', '.join(modules)} "
              f"({import_us / 1000:.1f} ms by -X importtime)")  # fmt: skip
        if reference:
            modules, import_us = imports(python3, url, reference)
            print(f"  the reference's: {', '.join(modules)} ({import_us / 1000:.1f} ms by -X importtime)")
        bare = ms["python3 -I -S -c pass (bare interpreter)"]
        overhead = ms["python3 -I -S health.py (the ECS healthCheck)"][0] - bare[0]
        cpu_overhead = ms["python3 -I -S health.py (the ECS healthCheck)"][1] - bare[1]
        if reference:
            ref = ms["  the same, --reference folder"]
            print(f"  reference - bare = {ref[0] - bare[0]:.2f} ms wall, {ref[1] - bare[1]:.2f} ms CPU")
        if base:
            verdict = "met" if overhead <= TARGET * base else "NOT met"
            print(f"  start-up target: probe - bare = {overhead:.2f} ms, {TARGET:g} x curl = {TARGET * base:.2f} ms: "
                  f"{verdict} ({overhead / base:.1f}x curl); CPU: probe - bare = {cpu_overhead:.2f} ms")  # fmt: skip
        else:
            print(f"  probe - bare = {overhead:.2f} ms ({cpu_overhead:.2f} ms CPU); target not checked (no curl)")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
