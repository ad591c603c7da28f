"""Large archives: modelsync's parallel ranged GETs next to boto3's transfer manager and the CRT, and a whole sync.

moto reads the whole object for every ranged GET, so it cannot show what
parallel GETs gain (docs/modelsync.md, 'Large models: transfers'). This bench serves the
archives from Debian's nginx instead, capped per connection like S3
(``limit_rate``, 40 MB/s by default), path-style: nginx answers boto3's HEAD,
ranged and conditional (``If-Match``) GETs of a folder, sends the
``x-amz-meta-sha256`` header through ``add_header``, and answers the
bucket's ListObjectsV2 with a fixed XML document written here (nginx lists
nothing by itself), so the whole sync runs through it: download, verify,
extract, swap into a real Triton (explicit mode), load.

Every run is a child process, so its peak RSS (``VmHWM``) is its own:

- ``boto3``: ``download_file`` with the default TransferConfig (10 threads, 8 MiB parts), no hash;
- ``boto3+fsync``: the same, then the file fsync'd (modelsync's download is durable before it is used);
- ``crt``: awscrt's S3Client (``pip install awscrt``; ``--crt-path`` if installed aside), no hash;
- ``ours``: ``S3.download`` (modelsync/transfer.py), SHA-256 of the whole object and of each part included;
- ``sync``: one reconcile of a new archive through modelsync's parts, the phases from its EMF line.

    apt-get install -y nginx-light
    .venv/bin/python bench/bench_transfer.py [--sizes 64,1024] [--rate 40m] [--connections 16]

Skips (exit 0, one line saying why) when nginx is not installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUCKET = "bench-models"
MiB = 1024 * 1024
NGINX = ("nginx", "/usr/sbin/nginx")


def find_nginx() -> str | None:
    for name in NGINX:
        found = shutil.which(name) or (name if os.access(name, os.X_OK) else None)
        if found:
            return found
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the served folder -------------------------------------------------------------------------


def write_archive(path: Path, model: str, weights: int) -> str:
    """A stored (uncompressed, like real weights) zip of a small Python model plus ``weights`` random bytes,
    written in chunks; returns its sha256."""
    from tests.support.msync import model_files

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in model_files(model, 1.0).items():
            zf.writestr(name, data)
        with zf.open(f"{model}/1/weights.bin", "w", force_zip64=True) as f:
            left = weights
            while left:
                n = min(left, 8 * MiB)
                f.write(os.urandom(n))
                left -= n
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


def nginx_etag(path: Path) -> str:
    st = path.stat()
    return f'"{int(st.st_mtime):x}-{st.st_size:x}"'


def listing(objects: dict[str, tuple[Path, str]]) -> str:
    contents = "".join(
        f"<Contents><Key>{key}</Key><LastModified>"
        f"{datetime.fromtimestamp(p.stat().st_mtime, UTC).strftime('%Y-%m-%dT%H:%M:%S.000Z')}</LastModified>"
        f"<ETag>{nginx_etag(p).replace(chr(34), '&quot;')}</ETag><Size>{p.stat().st_size}</Size>"
        "<StorageClass>STANDARD</StorageClass></Contents>"
        for key, (p, _) in sorted(objects.items())
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{BUCKET}</Name><Prefix></Prefix><KeyCount>{len(objects)}</KeyCount><MaxKeys>1000</MaxKeys>"
        f"<IsTruncated>false</IsTruncated>{contents}</ListBucketResult>"
    )


def nginx_conf(root: Path, port: int, rate: str, objects: dict[str, tuple[Path, str]]) -> str:
    per_object = "".join(
        f"        location = /{BUCKET}/{key} {{ add_header x-amz-meta-sha256 {digest}; }}\n"
        for key, (_, digest) in objects.items()
    )
    body = listing(objects).replace("'", "\\'")
    return f"""worker_processes 2;
user root;
daemon off;
pid {root}/nginx.pid;
error_log {root}/nginx-error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    sendfile on;
    default_type application/octet-stream;
    client_body_temp_path {root}/tmp;
    proxy_temp_path {root}/tmp;
    fastcgi_temp_path {root}/tmp;
    uwsgi_temp_path {root}/tmp;
    scgi_temp_path {root}/tmp;
    server {{
        listen 127.0.0.1:{port};
        root {root}/www;
        limit_rate {rate};
        location = /{BUCKET} {{ default_type application/xml; return 200 '{body}'; }}
{per_object}    }}
}}
"""


# --- one run, in a child process ---------------------------------------------------------------


def client(url: str, pool: int = 10) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(
            s3={"addressing_style": "path"}, max_pool_connections=max(10, pool), retries={"mode": "standard"}
        ),
    )


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One run; the clock starts once the libraries are imported and the client made and warm (one request
    done, as in a daemon), and covers what the client does for one object: HEAD and GETs."""
    what, url, key, dest = args.child, args.url, args.key, Path(args.dest)
    out: dict[str, Any] = {}
    if what in ("boto3", "boto3+fsync"):
        c = client(url)
        c.list_objects_v2(Bucket=BUCKET, Prefix=key)
        t0 = time.perf_counter()
        c.download_file(BUCKET, key, str(dest))
        if what == "boto3+fsync":  # what modelsync adds for a crash: the bytes on disk before they are used
            fd = os.open(dest, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    elif what == "crt":
        t0 = time.perf_counter()
        out.update(crt_download(url, key, dest, args.part_size))
    elif what == "ours":
        from modelsync.fsio import LocalFileSystem
        from modelsync.s3 import S3
        from modelsync.transfer import TransferConfig

        s3 = S3(client(url, args.connections), BUCKET, "", TransferConfig(args.part_size, args.connections))
        prefix, name = key.rsplit("/", 1)
        s3.prefix = prefix + "/"
        listed = s3.find(name.removesuffix(".zip")) or _missing(key)
        t0 = time.perf_counter()
        archive = s3.head(listed)
        digest, _ = s3.download(archive, dest, LocalFileSystem())
        out["hash_ok"] = digest == archive.sha256
    else:
        t0 = time.perf_counter()
        out.update(sync_once(args, key))
    out["seconds"] = time.perf_counter() - t0
    out["rss_mb"] = peak_rss_mb()
    return out


def peak_rss_mb() -> float:
    """This process's own high-water mark (VmHWM; rusage's maxrss of a child keeps the parent's from before
    the exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e6
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024 / 1e6


def _missing(key: str) -> Any:
    raise SystemExit(f"{key} is not in the listing")


def crt_download(url: str, key: str, dest: Path, part_size: int) -> dict[str, Any]:
    from awscrt.auth import AwsCredentialsProvider
    from awscrt.http import HttpHeaders, HttpRequest
    from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
    from awscrt.s3 import S3Client, S3RequestTlsMode, S3RequestType

    host = url.split("//", 1)[1]
    elg = EventLoopGroup()
    bootstrap = ClientBootstrap(elg, DefaultHostResolver(elg))
    s3 = S3Client(
        bootstrap=bootstrap,
        region="us-east-1",
        credential_provider=AwsCredentialsProvider.new_static("bench", "bench"),
        tls_mode=S3RequestTlsMode.DISABLED,
        part_size=part_size,
    )
    request = HttpRequest("GET", f"/{BUCKET}/{key}", HttpHeaders([("Host", host)]))
    s3.make_request(type=S3RequestType.GET_OBJECT, request=request, recv_filepath=str(dest)).finished_future.result(600)
    return {}


def sync_once(args: argparse.Namespace, key: str) -> dict[str, Any]:
    from exporter.config import Output
    from modelsync.__main__ import build
    from modelsync.metrics import PHASES
    from modelsync.settings import Settings

    root = Path(args.dest)
    prefix, name = key.rsplit("/", 1)
    model = name.removesuffix(".zip")
    settings = Settings(
        bucket=BUCKET,
        prefix=prefix + "/",
        repository=root / "repo",
        store=root / "store",
        triton_url=args.triton_url,
        output=Output("file", path=str(root / "emf.log")),
        min_free_bytes=0,
        max_ratio=1000.0,
        part_size=args.part_size,
        connections=args.connections,
        host="bench",
    )
    app = build(settings, s3_client=client(args.url, args.connections))
    try:
        app.syncer.recover()
        t0 = time.perf_counter()
        report = app.syncer.reconcile_all()
        took = time.perf_counter() - t0
    finally:
        app.close()
    outcome = report.outcomes[model]
    if not outcome.in_sync:
        raise SystemExit(f"sync of {model} failed: {outcome}")
    lines = [json.loads(x) for x in (root / "emf.log").read_bytes().splitlines() if b'"SyncAttempts"' in x]
    line = [x for x in lines if x.get("model") == model][-1]
    return {"reconcile_s": took, "phases": {p: line[f"Sync{p.title()}Time"] / 1000 for p in PHASES}}


def run_child(argv: list[str]) -> dict[str, Any]:
    """One run in a child process: its JSON result, its own peak RSS included."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    stdout, stderr = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    proc.wait()
    if proc.returncode != 0:
        return {"error": (stderr.decode().strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    result: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    return result


# --- the table ---------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="64,1024", help="archive sizes in MiB of weights, comma-separated")
    ap.add_argument("--rate", default="40m", help="nginx limit_rate per connection")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--part-size", type=int, default=8 * MiB)
    ap.add_argument("--runs", type=int, default=2, help="runs of each client and size (the median is shown)")
    ap.add_argument("--crt-path", default="", help="a folder holding awscrt when it is not in the environment")
    ap.add_argument("--no-sync", action="store_true", help="skip the whole sync through Triton")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--key", default="", help=argparse.SUPPRESS)
    ap.add_argument("--dest", default="", help=argparse.SUPPRESS)
    ap.add_argument("--triton-url", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.crt_path:
        sys.path.insert(0, args.crt_path)
    if args.child:
        print(json.dumps(child(args)))
        return 0

    nginx = find_nginx()
    if nginx is None:
        print("SKIP bench_transfer: nginx is not installed (apt-get install -y nginx-light); moto cannot stand in")
        return 0
    crt = args.crt_path or ""
    try:
        import awscrt  # noqa: F401
    except ImportError:
        if not crt:
            print("note: awscrt is not installed: no CRT row (pip install awscrt, or --crt-path)")
    root = Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    (root / "www" / BUCKET).mkdir(parents=True)
    (root / "tmp").mkdir()
    sizes = [int(s) for s in args.sizes.split(",")]
    objects: dict[str, tuple[Path, str]] = {}
    for mib in sizes:
        for use in ("raw", "sync"):  # one prefix each: the sync installs only its own
            key = f"{use}{mib}/m{mib}.zip"
            path = root / "www" / BUCKET / key
            path.parent.mkdir()
            objects[key] = (path, write_archive(path, f"m{mib}", mib * MiB))
    sizes_of = {mib: objects[f"raw{mib}/m{mib}.zip"][0].stat().st_size for mib in sizes}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (root / "nginx.conf").write_text(nginx_conf(root, port, args.rate, objects))
    server = subprocess.Popen([nginx, "-p", str(root), "-c", str(root / "nginx.conf")])
    triton = None
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    try:
        _wait_for_port(port)
        common = ["--url", url, "--part-size", str(args.part_size), "--connections", str(args.connections)]
        if crt:
            common += ["--crt-path", crt]
        clients = ["boto3", "boto3+fsync", "crt", "ours"]
        for mib in sizes:
            for i in range(args.runs):
                for what in clients[i % 4 :] + clients[: i % 4]:  # each client first in turn
                    dest = root / f"dest-{what}"
                    os.sync()  # the previous run's writeback is not this one's
                    time.sleep(1)
                    res = run_child([*common, "--child", what, "--key", f"raw{mib}/m{mib}.zip", "--dest", str(dest)])
                    dest.unlink(missing_ok=True)
                    results.setdefault((mib, what), []).append(res)
            objects[f"raw{mib}/m{mib}.zip"][0].unlink()
        if not args.no_sync:  # Triton only now: it does not run beside the plain downloads
            from demo.triton import TritonServer

            (root / "sync" / "repo").mkdir(parents=True)
            (root / "triton").mkdir()
            triton = TritonServer(root / "sync" / "repo", workdir=root / "triton")
            triton.start()
            for mib in sizes:
                os.sync()
                sync = ["--child", "sync", "--key", f"sync{mib}/m{mib}.zip", "--dest", str(root / "sync")]
                results[(mib, "sync")] = [run_child([*common, *sync, "--triton-url", triton.url])]
    finally:
        server.terminate()
        server.wait(10)
        if triton is not None:
            triton.stop()
        shutil.rmtree(root, ignore_errors=True)
    report(results, sizes_of, args)
    return 0


def _wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nginx did not listen on {port}")


Results = dict[tuple[int, str], list[dict[str, Any]]]


def report(results: Results, sizes: dict[int, int], args: argparse.Namespace) -> None:
    print(
        f"nginx limit_rate {args.rate} per connection; ours: {args.connections} connections, "
        f"{args.part_size // MiB} MiB parts; boto3 download_file: default TransferConfig (10 threads, 8 MiB); "
        f"median of {args.runs} runs; peak RSS of the child process"
    )
    print(f"{'archive':>9s} {'client':<24s} {'MB/s':>7s} {'ours/boto3':>10s} {'peak RSS MB':>12s}  note")
    for mib, archive in sizes.items():
        base = _rate(results.get((mib, "boto3"), []), archive)
        names = {
            "boto3": "boto3 download_file",
            "boto3+fsync": "boto3 + fsync",
            "crt": "CRT (awscrt S3Client)",
            "ours": "modelsync (hashed)",
        }
        for what, name in names.items():
            runs = results.get((mib, what), [])
            rate = _rate(runs, archive)
            errors = [r["error"] for r in runs if "error" in r]
            note = errors[0][:70] if errors else ("sha256 ok" if any(r.get("hash_ok") for r in runs) else "")
            ratio = f"{rate / base:10.2f}" if rate and base else f"{'-':>10s}"
            rss = max((r["rss_mb"] for r in runs if "rss_mb" in r), default=0.0)
            shown = f"{rate:7.0f}" if rate else f"{'-':>7s}"
            print(f"{mib:>6d} MiB {name:<24s} {shown} {ratio} {rss:12.0f}  {note}")
        for r in results.get((mib, "sync"), []):
            if "error" in r:
                print(f"{mib:>6d} MiB whole sync: {r['error'][:100]}")
                continue
            phases = r["phases"]
            shown = ", ".join(f"{p} {s:.2f} s" for p, s in phases.items())
            print(
                f"{mib:>6d} MiB whole sync (list to READY {r['reconcile_s']:.2f} s, peak RSS {r['rss_mb']:.0f} MB): "
                f"{shown}; download {archive / phases['download'] / 1e6:.0f} MB/s"
            )


def _rate(runs: list[dict[str, Any]], size: int) -> float:
    ok = [r["seconds"] for r in runs if "seconds" in r]
    return size / statistics.median(ok) / 1e6 if ok else 0.0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    sys.exit(main())
