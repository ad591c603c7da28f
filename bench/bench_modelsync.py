"""Upload to READY for a small model through modelsync, split by phase, next to a plain download + unzip.

Everything runs here, in one process and one run: moto's S3 server, a real
Triton (explicit mode), and modelsync's real parts. For each round a new
build of a small Python model (config, model.py and a weights file of
``--weights-mib`` random bytes, incompressible like real weights) is
uploaded with its sha256 metadata and synced; the reference is what a
script without the checks would do with the same archive in the same run:
``boto3 get_object`` read to a file, then ``zipfile.extractall``.

    .venv/bin/python bench/bench_modelsync.py [--rounds 5] [--weights-mib 32]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from demo.triton import TritonServer, free_port
from exporter.config import Output
from modelsync.__main__ import build
from modelsync.metrics import PHASES
from modelsync.settings import Settings
from tests.support.msync import Moto, make_zip, model_files, sha, upload


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--weights-mib", type=int, default=32)
    args = ap.parse_args()
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto = Moto(f"http://127.0.0.1:{port}")
    root = Path(tempfile.mkdtemp(prefix="bench-modelsync-"))
    (root / "repo").mkdir()
    (root / "triton").mkdir()
    triton = TritonServer(root / "repo", workdir=root / "triton")
    triton.start()
    s3 = moto.client("s3")
    bucket = "bench-models"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    settings = Settings(
        bucket=bucket,
        repository=root / "repo",
        store=root / "store",
        triton_url=triton.url,
        output=Output("file", path=str(root / "emf.log")),
        min_free_bytes=0,
        host="bench",
    )
    app = build(settings, s3_client=s3)
    ours: dict[str, list[float]] = {p: [] for p in (*PHASES, "total", "upload_to_ready")}
    ref: dict[str, list[float]] = {"download": [], "extract": [], "total": [], "durable": []}
    size = 0
    try:
        for i in range(args.rounds):
            files = {**model_files("bench", add=float(i)), "bench/1/weights.bin": os.urandom(args.weights_mib << 20)}
            data = make_zip(files)
            size = len(data)
            # the reference, same archive, same run: download to a file, extract
            upload(moto, bucket, "reference.zip", data)
            t0 = time.perf_counter()
            body = s3.get_object(Bucket=bucket, Key="reference.zip")["Body"]
            target = root / f"ref-{i}.zip"
            with open(target, "wb") as f:
                for chunk in body.iter_chunks(1 << 20):
                    f.write(chunk)
            t1 = time.perf_counter()
            with zipfile.ZipFile(target) as zf:
                zf.extractall(root / f"ref-{i}")
            t2 = time.perf_counter()
            ref["download"].append(t1 - t0)
            ref["extract"].append(t2 - t1)
            ref["total"].append(t2 - t0)
            # the same with what modelsync adds for integrity and durability: sha256 while reading, fsync
            t0 = time.perf_counter()
            digest = hashlib.sha256()
            body = s3.get_object(Bucket=bucket, Key="reference.zip")["Body"]
            target = root / f"dur-{i}.zip"
            with open(target, "wb") as f:
                for chunk in body.iter_chunks(1 << 20):
                    f.write(chunk)
                    digest.update(chunk)
                f.flush()
                os.fsync(f.fileno())
            with zipfile.ZipFile(target) as zf:
                zf.extractall(root / f"dur-{i}")
                for name in zf.namelist():
                    path = root / f"dur-{i}" / name
                    if path.is_file():
                        with open(path, "rb") as g:
                            os.fsync(g.fileno())
            ref["durable"].append(time.perf_counter() - t0)
            s3.delete_object(Bucket=bucket, Key="reference.zip")
            # modelsync: upload, then one reconcile until READY (a daemon would start on the event)
            t0 = time.perf_counter()
            upload(moto, bucket, "bench.zip", data)
            uploaded = time.perf_counter()
            report = app.syncer.reconcile_all()
            done = time.perf_counter()
            assert report.outcomes["bench"].in_sync, report.outcomes["bench"]
            assert os.readlink(root / "repo" / "bench").endswith(sha(data))
            attempt = [
                json.loads(line) for line in (root / "emf.log").read_bytes().splitlines() if b'"SyncAttempts"' in line
            ][-1]
            for p in PHASES:
                ours[p].append(attempt[f"Sync{p.title()}Time"] / 1000)
            ours["total"].append(done - uploaded)
            ours["upload_to_ready"].append(done - t0)
    finally:
        app.close()
        triton.stop()
        server.stop()

    def fmt(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:9.1f} {min(values) * 1000:9.1f} {max(values) * 1000:9.1f}"

    print(
        f"archive {size / 1e6:.1f} MB ({args.weights_mib} MiB weights + config + model.py), "
        f"{args.rounds} rounds, ms: median / min / max"
    )
    print(f"{'':38s}{'median':>9s} {'min':>9s} {'max':>9s}")
    for p in PHASES:
        print(f"  modelsync {p:27s} {fmt(ours[p])}")
    print(f"  modelsync reconcile, listing to READY    {fmt(ours['total'])}")
    print(f"  modelsync PUT start to READY             {fmt(ours['upload_to_ready'])}")
    print(f"  reference boto3 get_object to a file     {fmt(ref['download'])}")
    print(f"  reference zipfile.extractall             {fmt(ref['extract'])}")
    print(f"  reference download + extract             {fmt(ref['total'])}")
    print(f"  reference + sha256 + fsync of every file {fmt(ref['durable'])}")
    dl_ex = [sum(v) for v in zip(ours["download"], ours["verify"], ours["extract"], ours["swap"], strict=True)]
    print(
        f"  modelsync download+verify+extract+swap   {fmt(dl_ex)}  "
        f"({statistics.median(dl_ex) / statistics.median(ref['total']):.2f}x the reference)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
