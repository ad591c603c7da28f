"""Issue 36's hostile model objects, measured on the real command: the peak RSS of ``python -m modelsync --once``.

Each scenario gets a bucket of its own on moto's S3 server holding one object, and one run of the daemon
(``--once``, no Triton: the first sync installs without loading), whose peak RSS comes from wait4(2)
(through a small Python in between: see MEASURE):

    empty       no object at all: the daemon's own floor
    zip600k     a zip of 600,000 empty entries (zip64, ~58 MB)
    zip300k     a zip of 300,000 empty entries (~28 MB)
    manifest60  a directory model whose manifest.json lists 600,000 files (~60 MB)
    empty8      a manifest.json of 2,800,000 empty objects (~8.4 MB)

    .venv/bin/python bench/modelsync_hostile.py [--tree DIR] [SCENARIO ...]

``--tree`` runs the daemon of another checkout (``git archive HEAD | tar -x -C /tmp/before``), so the same
harness measures the code before and after a change. Not a unit test: docs/modelsync.md records its figures.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.triton import free_port  # noqa: E402
from tests.support.msync import Moto, new_bucket, sha  # noqa: E402
from tests.unit.modelsync.zipcraft import hostile_manifest, hostile_zip  # noqa: E402


def _zip(entries: int) -> Callable[[Path], tuple[str, Path]]:
    def make(tmp: Path) -> tuple[str, Path]:
        path = tmp / f"bad{entries}.zip"
        hostile_zip(path, "bad", entries)
        return "bad.zip", path

    return make


def _manifest(entries: int, empty: bool) -> Callable[[Path], tuple[str, Path]]:
    def make(tmp: Path) -> tuple[str, Path]:
        path = tmp / f"manifest{entries}{empty}.json"
        hostile_manifest(path, entries, empty)
        return "bad/manifest.json", path

    return make


SCENARIOS: dict[str, Callable[[Path], tuple[str, Path]] | None] = {
    "empty": None,
    "zip600k": _zip(600_000),
    "zip300k": _zip(300_000),
    "manifest60": _manifest(600_000, empty=False),
    "empty8": _manifest(2_800_000, empty=True),
}


# ru_maxrss counts what the child had before its exec: a child forked from this process (moto's server holds the
# objects) would start at this process's size. A small Python in between forks the daemon from ~10 MB.
MEASURE = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(proc.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def run_once(moto: Moto, tree: Path, bucket: str, work: Path) -> tuple[int, float, float, str]:
    """(exit code, peak RSS in MB, seconds, last line on stderr) of one ``python -m modelsync --once``."""
    (work / "repo").mkdir(parents=True)
    args = [
        *("--bucket", bucket, "--repository", str(work / "repo"), "--store", str(work / "store")),
        *("--triton-url", f"http://127.0.0.1:{free_port()}", "--output", f"file:{work / 'emf.log'}"),
        *("--min-free-bytes", "0", "--hash-tag-wait", "0", "--once"),
    ]
    start = time.monotonic()
    with open(work / "stderr.log", "w") as err:
        measured = subprocess.run(
            [sys.executable, "-c", MEASURE, sys.executable, "-m", "modelsync", *args],
            cwd=tree,
            env=moto.env(),
            stderr=err,
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
    seconds = time.monotonic() - start
    code, peak_kib = (int(x) for x in measured.stdout.split())
    lines = (work / "stderr.log").read_text().strip().splitlines()
    return code, peak_kib / 1024, seconds, lines[-1] if lines else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose modelsync runs (default: this one)")
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"any of {', '.join(SCENARIOS)} (default: all)")
    args = ap.parse_args()
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        ap.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    args.scenarios = args.scenarios or list(SCENARIOS)
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    moto = Moto(f"http://127.0.0.1:{port}")
    print(f"tree: {args.tree}")
    print(f"{'scenario':<12} {'object':>10} {'peak RSS':>10} {'time':>7}  exit  last line on stderr")
    try:
        with tempfile.TemporaryDirectory(prefix="modelsync-hostile-") as tmp:
            for name in args.scenarios:
                bucket = new_bucket(moto)
                make = SCENARIOS[name]
                size = 0
                if make is not None:
                    key, path = make(Path(tmp))
                    data = path.read_bytes()
                    size = len(data)
                    moto.client("s3").put_object(Bucket=bucket, Key=key, Body=data, Metadata={"sha256": sha(data)})
                    del data
                    path.unlink()
                code, peak, seconds, last = run_once(moto, args.tree, bucket, Path(tmp) / name)
                print(f"{name:<12} {size / 1e6:>8.1f}MB {peak:>8.0f}MB {seconds:>6.1f}s  {code:>4}  {last[:150]}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
