"""Cold start at the link's pace: modelsync's list to READY against a raw parallel download over the same capped link.

moto reads the whole object for every ranged GET, so it cannot show what
parallel GETs gain (docs/modelsync.md, 'Large models: transfers'). This bench serves the
models from Debian's nginx instead, capped per connection like S3
(``limit_rate``), path-style: nginx answers boto3's HEAD, ranged and
conditional (``If-Match``) GETs of a folder, sends the ``x-amz-meta-sha256``
header through ``add_header``, and answers the bucket's ListObjectsV2 with a
fixed XML document per prefix written here (nginx lists nothing by itself),
so the whole sync runs through it: list, download, verify, extract, swap into
a real Triton (explicit mode), load. With ``--unlimited`` a second nginx
server serves the same folder without the cap (a local endpoint: the
machine's own pace).

Scenarios (``--scenario``, sizes in MiB of weights, split into files of at most 256 MiB):

- ``dir[:1024]``: a directory model (``<prefix><model>/manifest.json`` and its files: config.pbtxt, a
  model.py that loads, 4 x 256 MiB of random "safetensors" files);
- ``archive[:512]``: one zip of the same layout, config.pbtxt and model.py deflated, the weights
  ``ZIP_STORED`` as zip(1) writes incompressible data (``--deflate-weights``: deflated, like Python's
  zipfile with ZIP_DEFLATED would).

Clients (``--clients``), each run a child process so its peak RSS (``VmHWM``) is its own:

- ``raw``: the link's pace: ``--connections`` ranged GETs of ``--part-size`` in parallel over all the
  model's objects (http.client, pwrite into the files), no hash, no fsync (the fsync after the clock is
  shown aside);
- ``boto3``: ``download_file`` of each object with the default TransferConfig (10 threads, 8 MiB parts), no hash;
- ``boto3+fsync``: the same, then each file fsync'd;
- ``crt``: awscrt's S3Client (``pip install awscrt``; ``--crt-path`` if installed aside), no hash;
- ``ours``: ``S3.download`` (modelsync/s3.py) of each object, SHA-256 included;
- ``naive``: ``download_file`` then ``zipfile.extractall`` (an archive; a directory model: ``download_file``
  of each file, nothing to extract);
- ``sync``: one whole reconcile into a fresh store and repository, list to READY, its phases from its
  EMF line; the model is unloaded and its store removed after each run (every run is a cold start).

The figures issue 39 asks for: (list to READY - Triton's load) / raw parallel download (goal <= 1.15);
throughput of list to READY without the load as a share of the link (connections x rate; goal >= 90 %, the
three runs within 15 %); on the unlimited endpoint (sync - load) / naive download and extract (goal <= 0.8);
peak RSS <= 200 MB.

    apt-get install -y nginx-light
    .venv/bin/python bench/bench_transfer.py [--scenario dir,archive] [--rate 10m] [--connections 16] \\
        [--runs 3] [--unlimited] [--clients raw,boto3,ours,naive,sync] [--json out.json]

Skips (exit 0, one line saying why) when nginx is not installed.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUCKET = "bench-models"
MiB = 1024 * 1024
FILE_MIB = 256  # the largest weights file: a safetensors shard
NGINX = ("nginx", "/usr/sbin/nginx")
CLIENTS = ("raw", "boto3", "boto3+fsync", "crt", "ours", "naive", "sync")
UNLIMITED_CLIENTS = ("raw", "naive", "sync")
CHILD_TIMEOUT = 600.0


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


def rate_bytes(rate: str) -> int:
    """nginx's size syntax: 10m is 10 x 1024 x 1024 bytes a second."""
    m = re.fullmatch(r"(\d+)([kKmMgG]?)", rate.strip())
    if not m:
        raise SystemExit(f"--rate {rate!r}: a number with k, m or g, as nginx reads it")
    return int(m.group(1)) * {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB}[m.group(2).lower()]


# --- the served folder -------------------------------------------------------------------------


@dataclass
class Scenario:
    kind: str  # "dir" or "archive"
    mib: int  # weights, MiB
    prefix: str = ""
    model: str = ""
    objects: list[tuple[str, int]] = field(default_factory=list)  # key, size: what a download fetches

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.mib}"

    @property
    def total(self) -> int:
        return sum(size for _, size in self.objects)

    def describe(self) -> str:
        n = len(weight_sizes(self.mib))
        what = "directory model" if self.kind == "dir" else "zip archive"
        return f"{what} {self.model}: {n} x {self.mib // n} MiB weights + config + model.py, {self.total / 1e6:.1f} MB"


def parse_scenarios(text: str) -> list[Scenario]:
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        kind, _, size = item.partition(":")
        if kind not in ("dir", "archive"):
            raise SystemExit(f"--scenario {item!r}: dir[:MiB] or archive[:MiB]")
        out.append(Scenario(kind, int(size) if size else (1024 if kind == "dir" else 512)))
    return out


def weight_sizes(mib: int) -> list[int]:
    n = max(1, -(-mib // FILE_MIB))
    return [mib * MiB // n + (1 if i < mib * MiB % n else 0) for i in range(n)]


def random_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(left, 8 * MiB))
            f.write(chunk)
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def file_sha(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


def write_scenario(sc: Scenario, www: Path, deflate_weights: bool) -> dict[str, str]:
    """The scenario's objects under ``www`` (the bucket's folder); returns key -> sha256 of each object."""
    sc.model = f"{'d' if sc.kind == 'dir' else 'a'}{sc.mib}"
    sc.prefix = f"{sc.kind}{sc.mib}/"
    sizes = weight_sizes(sc.mib)
    from tests.support.msync import model_files  # the tests' sample model (here only: the children stay lean)

    small = {k.split("/", 1)[1]: v for k, v in model_files(sc.model).items()}  # config.pbtxt, 1/model.py
    shards = [f"1/model-{i + 1:05d}-of-{len(sizes):05d}.safetensors" for i in range(len(sizes))]
    digests: dict[str, str] = {}
    if sc.kind == "dir":
        folder = www / sc.prefix / sc.model
        entries = []
        for rel, data in small.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
            entries.append({"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        for rel, size in zip(shards, sizes, strict=True):
            entries.append({"path": rel, "size": size, "sha256": random_file(folder / rel, size)})
        manifest = json.dumps({"files": entries}, indent=1).encode()  # as python -m modelsync.manifest prints it
        (folder / "manifest.json").write_bytes(manifest)  # written last, like the upload order
        for e in entries:
            digests[f"{sc.prefix}{sc.model}/{e['path']}"] = str(e["sha256"])
        digests[f"{sc.prefix}{sc.model}/manifest.json"] = hashlib.sha256(manifest).hexdigest()
        sc.objects = [(k, (www / k).stat().st_size) for k in digests]
    else:
        path = www / sc.prefix / f"{sc.model}.zip"
        path.parent.mkdir(parents=True)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for rel, data in small.items():
                zf.writestr(f"{sc.model}/{rel}", data)
            method = zipfile.ZIP_DEFLATED if deflate_weights else zipfile.ZIP_STORED
            for rel, size in zip(shards, sizes, strict=True):
                info = zipfile.ZipInfo(f"{sc.model}/{rel}", date_time=time.localtime()[:6])
                info.compress_type = method
                info.external_attr = 0o644 << 16
                with zf.open(info, "w", force_zip64=True) as f:
                    left = size
                    while left:
                        n = min(left, 8 * MiB)
                        f.write(os.urandom(n))
                        left -= n
        key = f"{sc.prefix}{sc.model}.zip"
        digests[key] = file_sha(path)
        sc.objects = [(key, path.stat().st_size)]
    return digests


def nginx_etag(path: Path) -> str:
    st = path.stat()
    return f'"{int(st.st_mtime):x}-{st.st_size:x}"'


def listing(www: Path, prefix: str, keys: list[str]) -> str:
    contents = ""
    chosen = sorted(k for k in keys if k.startswith(prefix))
    for key in chosen:
        p = www / key
        modified = datetime.fromtimestamp(p.stat().st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        contents += (
            f"<Contents><Key>{key}</Key><LastModified>{modified}</LastModified>"
            f"<ETag>{nginx_etag(p).replace(chr(34), '&quot;')}</ETag><Size>{p.stat().st_size}</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>{BUCKET}</Name><Prefix>{prefix}</Prefix><KeyCount>{len(chosen)}</KeyCount><MaxKeys>1000</MaxKeys>"
        f"<IsTruncated>false</IsTruncated>{contents}</ListBucketResult>"
    )


def write_listings(root: Path, www: Path, digests: dict[str, str]) -> None:
    """One ListObjectsV2 answer per prefix a client asks for (every folder of every key, every key, the whole
    bucket), in files nginx picks by the request's ``prefix`` argument (as sent, %2F or /); any other prefix
    lists nothing."""
    keys = list(digests)
    prefixes = {""}
    for key in keys:
        parts = key.split("/")
        prefixes.update("/".join(parts[:i]) + "/" for i in range(1, len(parts)))
        prefixes.add(key)
    folder = root / "listings"
    for prefix in prefixes:
        body = listing(www, prefix, keys)
        for name in {quote(prefix, safe=""), prefix}:
            path = folder / f"_{name}.xml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
    (folder / "_empty_.xml").write_text(listing(www, "", []))


def server_block(root: Path, port: int, rate: str, digests: dict[str, str]) -> str:
    per_object = "".join(
        f"        location = /{BUCKET}/{key} {{ add_header x-amz-meta-sha256 {digest}; }}\n"
        for key, digest in digests.items()
    )
    return f"""    server {{
        listen 127.0.0.1:{port};
        root {root}/www;
        limit_rate {rate};
        location = /{BUCKET} {{ root {root}/listings; try_files /_$arg_prefix.xml /_empty_.xml; }}
        location /_ {{ root {root}/listings; internal; }}
{per_object}    }}
"""


def nginx_conf(root: Path, servers: list[tuple[int, str]], digests: dict[str, str]) -> str:
    blocks = "".join(server_block(root, port, rate, digests) for port, rate in servers)
    return f"""worker_processes 2;
user root;
daemon off;
pid {root}/nginx.pid;
error_log {root}/nginx-error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    sendfile on;
    sendfile_max_chunk 128k;  # limit_rate waits after each chunk sent: small chunks keep the cap close
    types {{ application/xml xml; }}
    default_type application/octet-stream;
    client_body_temp_path {root}/tmp;
    proxy_temp_path {root}/tmp;
    fastcgi_temp_path {root}/tmp;
    uwsgi_temp_path {root}/tmp;
    scgi_temp_path {root}/tmp;
{blocks}}}
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


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One run; the clock starts once the libraries are imported and the client made and warm (one request
    done, as in a daemon), and covers what the client does for one model: HEAD and GETs (and, for naive,
    the extraction; for sync, the whole reconcile)."""
    what, url, dest = args.child, args.url, Path(args.dest)
    objects = [(str(key), int(size)) for key, size in json.loads(args.objects)]
    dest.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    if what in ("boto3", "boto3+fsync", "naive"):
        c = client(url)
        c.list_objects_v2(Bucket=BUCKET, Prefix=objects[0][0])
        t0 = time.perf_counter()
        paths = []
        for key, _ in objects:
            paths.append(dest / key)
            paths[-1].parent.mkdir(parents=True, exist_ok=True)
            c.download_file(BUCKET, key, str(paths[-1]))
            if what == "boto3+fsync":  # what modelsync adds for a crash: the bytes on disk before they are used
                fsync_path(paths[-1])
        if what == "naive":
            out["download_s"] = time.perf_counter() - t0
            zips = [p for p in paths if p.suffix == ".zip"]
            for p in zips:
                with zipfile.ZipFile(p) as zf:
                    zf.extractall(dest / "extracted")
            out["extract_s"] = time.perf_counter() - t0 - out["download_s"]
    elif what == "raw":
        t0 = time.perf_counter()
        fds = raw_download(url, objects, dest, args.part_size, args.connections)
        out["seconds"] = time.perf_counter() - t0
        for fd in fds:
            os.fsync(fd)
            os.close(fd)
        out["fsync_s"] = time.perf_counter() - t0 - out["seconds"]
    elif what == "crt":
        t0 = time.perf_counter()
        for key, _ in objects:
            (dest / key).parent.mkdir(parents=True, exist_ok=True)
            crt_download(url, key, dest / key, args.part_size)
    elif what == "ours":
        from modelsync.fsio import LocalFileSystem
        from modelsync.s3 import S3, Archive
        from modelsync.transfer import TransferConfig

        s3 = S3(client(url, args.connections), BUCKET, "", TransferConfig(args.part_size, args.connections))
        folder = objects[0][0].rsplit("/", 1)[0] + "/"
        s3.client.list_objects_v2(Bucket=BUCKET, Prefix=folder)
        t0 = time.perf_counter()
        listed: dict[str, Archive] = s3.list_files(folder)
        ok = True
        for key, _ in objects:
            archive = s3.head(listed[key])
            (dest / key).parent.mkdir(parents=True, exist_ok=True)
            digest, _ = s3.download(archive, dest / key, LocalFileSystem())
            ok = ok and digest == (archive.sha256 or digest)
        out["hash_ok"] = ok
    else:
        t0 = time.perf_counter()
        out.update(sync_once(args))
    out.setdefault("seconds", time.perf_counter() - t0)
    out["rss_mb"] = peak_rss_mb()
    return out


def raw_download(url: str, objects: list[tuple[str, int]], dest: Path, part_size: int, connections: int) -> list[int]:
    """The link's pace: ``connections`` threads, each with one keep-alive connection, take the next part of any
    of the objects and write it where it belongs (no hash, no fsync); returns the open files."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    fds, jobs = [], []
    # parts small enough to keep every connection busy on a small model, --part-size on a large one
    part_size = max(64 * 1024, min(part_size, -(-sum(size for _, size in objects) // connections)))
    for key, size in objects:
        path = dest / key
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fds.append(fd)
        jobs += [(fd, key, off, min(part_size, size - off)) for off in range(0, size, part_size)]
    todo = iter(jobs)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        view = memoryview(bytearray(MiB))
        try:
            while not errors:
                with lock:
                    job = next(todo, None)
                if job is None:
                    return
                fd, key, off, n = job
                conn.request("GET", f"/{BUCKET}/{key}", headers={"Range": f"bytes={off}-{off + n - 1}"})
                resp = conn.getresponse()
                if resp.status != 206:
                    raise RuntimeError(f"GET {key} {off}+{n}: HTTP {resp.status}")
                pos = off
                while k := resp.readinto(view):
                    pos += os.pwrite(fd, view[:k], pos)
                if pos - off != n:
                    raise RuntimeError(f"GET {key} {off}+{n}: {pos - off} bytes")
        except BaseException as exc:
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=work) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return fds


def peak_rss_mb() -> float:
    """This process's own high-water mark (VmHWM; rusage's maxrss of a child keeps the parent's from before
    the exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e6
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024 / 1e6


def crt_download(url: str, key: str, dest: Path, part_size: int) -> None:
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


def sync_once(args: argparse.Namespace) -> dict[str, Any]:
    """One reconcile through modelsync's own wiring (``build``, the public Settings), timed from the listing to
    READY; the phases come from its EMF line (any ``Sync<Phase>Time`` it writes)."""
    from modelsync.__main__ import build
    from modelsync.settings import Settings

    try:
        from telemetry.sinks import Output
    except ImportError:  # older trees
        from exporter.config import Output

    root = Path(args.dest)
    settings = Settings(
        bucket=BUCKET,
        prefix=args.prefix,
        repository=Path(args.repository),
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
    outcome = report.outcomes[args.model]
    if not outcome.in_sync:
        raise SystemExit(f"sync of {args.model} failed: {outcome}")
    lines = [json.loads(x) for x in (root / "emf.log").read_bytes().splitlines() if b'"SyncAttempts"' in x]
    line = [x for x in lines if x.get("model") == args.model][-1]
    phases = {}
    for name, value in line.items():
        m = re.fullmatch(r"Sync([A-Z][a-z]+)Time", name)
        if m and isinstance(value, int | float):
            phases[m.group(1).lower()] = value / 1000
    import modelsync

    return {"seconds": took, "phases": phases, "modelsync": str(Path(modelsync.__file__).resolve().parent)}


def run_child(argv: list[str]) -> dict[str, Any]:
    """One run in a child process: its JSON result, its own peak RSS included."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"no result after {CHILD_TIMEOUT:.0f} s"}
    if proc.returncode != 0:
        return {"error": (stderr.decode().strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    result: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    return result


# --- the runs ----------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--scenario", default="dir,archive", help="dir[:MiB], archive[:MiB], comma-separated")
    ap.add_argument("--sizes", default="", help="archive sizes in MiB (--scenario archive:N,...)")
    ap.add_argument("--rate", default="10m", help="nginx limit_rate per connection (the link: connections x rate)")
    ap.add_argument("--connections", type=int, default=16, help="parallel GETs of raw, ours and sync")
    ap.add_argument("--part-size", type=int, default=8 * MiB)
    ap.add_argument("--runs", type=int, default=3, help="runs of each client and scenario (min / median / max)")
    ap.add_argument("--clients", default="raw,boto3,ours,naive,sync", help=f"of {', '.join(CLIENTS)}")
    ap.add_argument("--unlimited", action="store_true", help=f"also {', '.join(UNLIMITED_CLIENTS)} without the cap")
    ap.add_argument("--deflate-weights", action="store_true", help="deflate the archive's weights (default: stored)")
    ap.add_argument("--crt-path", default="", help="a folder holding awscrt when it is not in the environment")
    ap.add_argument("--json", default="", help="write every run's result to this file")
    ap.add_argument("--no-sync", action="store_true", help="skip the whole sync through Triton (the sync client)")
    for hidden in ("child", "url", "objects", "dest", "triton-url", "prefix", "model", "repository"):
        ap.add_argument(f"--{hidden}", default="", help=argparse.SUPPRESS)
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
    clients = [c.strip() for c in args.clients.split(",") if c.strip() and not (args.no_sync and c.strip() == "sync")]
    unknown = set(clients) - set(CLIENTS)
    if unknown:
        raise SystemExit(f"--clients: unknown {', '.join(sorted(unknown))} (of {', '.join(CLIENTS)})")
    if "crt" in clients:
        try:
            import awscrt  # noqa: F401
        except ImportError:
            if not args.crt_path:
                print("note: awscrt is not installed: no CRT row (pip install awscrt, or --crt-path)")
                clients.remove("crt")
    wanted = ",".join(f"archive:{s}" for s in args.sizes.split(",")) if args.sizes else args.scenario
    scenarios = parse_scenarios(wanted)
    started = time.perf_counter()
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    www = root / "www" / BUCKET
    www.mkdir(parents=True)
    (root / "tmp").mkdir()
    digests: dict[str, str] = {}
    for sc in scenarios:
        digests.update(write_scenario(sc, www, args.deflate_weights))
    write_listings(root, www, digests)
    limited, unlimited = free_port(), free_port()
    servers = [(limited, args.rate)] + ([(unlimited, "0")] if args.unlimited else [])
    (root / "nginx.conf").write_text(nginx_conf(root, servers, digests))
    server = subprocess.Popen([nginx, "-p", str(root), "-c", str(root / "nginx.conf")])
    triton = None
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    try:
        for port, _ in servers:
            _wait_for_port(port)
        repository = root / "sync" / "repo"
        repository.mkdir(parents=True)
        if "sync" in clients:
            from demo.triton import TritonServer

            (root / "triton").mkdir()
            triton = TritonServer(repository, workdir=root / "triton")
            triton.start()
        plan = [("limited", sc, c) for sc in scenarios for c in clients if c != "naive" or sc.kind == "archive"]
        if args.unlimited:
            plan += [("unlimited", sc, c) for sc in scenarios for c in UNLIMITED_CLIENTS if c in clients]
        common = ["--part-size", str(args.part_size), "--connections", str(args.connections)]
        if args.crt_path:
            common += ["--crt-path", args.crt_path]
        for i in range(args.runs):
            shift = i * len(plan) // max(1, args.runs)  # each run starts elsewhere in the plan
            for endpoint, sc, what in plan[shift:] + plan[:shift]:
                url = f"http://127.0.0.1:{limited if endpoint == 'limited' else unlimited}"
                dest = root / f"dest-{what}"
                os.sync()  # the previous run's writeback is not this one's
                time.sleep(1)
                argv = [*common, "--child", what, "--url", url, "--dest", str(dest)]
                argv += ["--objects", json.dumps(sc.objects)]
                if what == "sync" and triton is not None:
                    argv += ["--triton-url", triton.url, "--prefix", sc.prefix, "--model", sc.model]
                    argv += ["--repository", str(repository)]
                res = run_child(argv)
                if what == "sync" and triton is not None:
                    if "error" not in res and not any(
                        v.get("name") == sc.model and v.get("state") == "READY" for v in triton.index()
                    ):
                        res = {"error": f"{sc.model} is not READY in Triton after the sync"}
                    triton.unload(sc.model)  # the next run is a cold start again
                    (repository / sc.model).unlink(missing_ok=True)
                    for leftover in repository.parent.glob(f".{repository.name}.*"):
                        shutil.rmtree(leftover, ignore_errors=True)
                shutil.rmtree(dest, ignore_errors=True)
                results.setdefault((endpoint, sc.name, what), []).append(res)
                print(
                    f"  run {i + 1}/{args.runs} {endpoint:9s} {sc.name:13s} {what:12s} {_brief(res)}", file=sys.stderr
                )
    finally:
        server.terminate()
        server.wait(10)
        if triton is not None:
            triton.stop()
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.perf_counter() - started
    report(results, scenarios, clients, args, elapsed, load_before)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "commit": _commit(),
                    "elapsed_s": elapsed,
                    "scenarios": {sc.name: {"objects": sc.objects, "bytes": sc.total} for sc in scenarios},
                    "runs": [
                        {"endpoint": e, "scenario": s, "client": c, "results": r} for (e, s, c), r in results.items()
                    ],
                },
                indent=1,
            )
        )
    return 0


def _brief(res: dict[str, Any]) -> str:
    if "error" in res:
        return "ERROR " + str(res["error"])[:100]
    load = res.get("phases", {}).get("load")
    return f"{res['seconds']:.2f} s" + (f" (load {load:.2f} s)" if load is not None else "")


def _wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nginx did not listen on {port}")


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


# --- the table ---------------------------------------------------------------------------------

Results = dict[tuple[str, str, str], list[dict[str, Any]]]
NAMES = {
    "raw": "raw parallel GETs (link's pace)",
    "boto3": "boto3 download_file",
    "boto3+fsync": "boto3 download_file + fsync",
    "crt": "CRT (awscrt S3Client)",
    "ours": "modelsync S3.download (hashed)",
    "naive": "download_file + extractall",
    "sync": "modelsync list to READY",
}


def _ok(runs: list[dict[str, Any]], key: str = "seconds") -> list[float]:
    return [float(r[key]) for r in runs if "error" not in r and key in r]


def _net(runs: list[dict[str, Any]]) -> list[float]:
    """list to READY less Triton's load, per run."""
    return [r["seconds"] - r["phases"].get("load", 0.0) for r in runs if "error" not in r]


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _share(size: int, secs: list[float], link: int) -> str:
    """The median's throughput as a percentage of the link, 6 wide; blank without runs (or without a link)."""
    return f"{size / statistics.median(secs) / link * 100:6.0f}" if secs else f"{'':6s}"


def _mmm(values: list[float]) -> str:
    if not values:
        return f"{'-':>7s} {'-':>7s} {'-':>7s}"
    return f"{min(values):7.2f} {statistics.median(values):7.2f} {max(values):7.2f}"


def report(
    results: Results,
    scenarios: list[Scenario],
    clients: list[str],
    args: argparse.Namespace,
    elapsed: float,
    load_before: tuple[float, float, float],
) -> None:
    link = args.connections * rate_bytes(args.rate)
    cpus = os.cpu_count()
    print(
        f"bench/bench_transfer.py at {_commit()}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {cpus} CPUs "
        f"(load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after); {elapsed / 60:.1f} min"
    )
    print(
        f"link: nginx limit_rate {args.rate} per connection x {args.connections} connections = "
        f"{link / 1e6:.0f} MB/s; {args.part_size // MiB} MiB parts; boto3 download_file: default TransferConfig "
        f"(10 threads, so at most 10 x {args.rate}); {args.runs} runs each, seconds min / median / max; "
        "peak RSS (VmHWM) of the child process, the largest of the runs"
    )
    for sc in scenarios:
        print(f"  {sc.name}: {sc.describe()}")
    used = sorted({r["modelsync"] for runs in results.values() for r in runs if "modelsync" in r})
    if used:
        print(f"  modelsync imported from {', '.join(used)}")
    goals: list[str] = []
    for endpoint in ("limited", "unlimited"):
        if not any(e == endpoint for e, _, _ in results):
            continue
        print()
        print(f"{endpoint} endpoint" + (f" ({link / 1e6:.0f} MB/s)" if endpoint == "limited" else " (no limit_rate)"))
        print(
            f"  {'scenario':13s} {'client':34s} {'min':>7s} {'median':>7s} {'max':>7s} {'MB/s':>6s} "
            f"{'link %':>6s} {'RSS MB':>6s}  note"
        )
        for sc in scenarios:
            for what in [*CLIENTS]:
                runs = results.get((endpoint, sc.name, what))
                if not runs:
                    continue
                secs = _ok(runs)
                errors = [str(r["error"]) for r in runs if "error" in r]
                rss = max((r["rss_mb"] for r in runs if "rss_mb" in r), default=0.0)
                mbps = sc.total / statistics.median(secs) / 1e6 if secs else 0.0
                share = _share(sc.total, secs if endpoint == "limited" else [], link)
                note = ""
                if what == "raw" and secs:
                    note = f"fsync after: {statistics.median(_ok(runs, 'fsync_s')):.2f} s"
                if what == "ours":
                    note = "sha256 ok" if all(r.get("hash_ok") for r in runs if "error" not in r) else "sha256 MISMATCH"
                if what == "naive" and secs:
                    note = (
                        f"download {statistics.median(_ok(runs, 'download_s')):.2f} s, "
                        f"extract {statistics.median(_ok(runs, 'extract_s')):.2f} s"
                    )
                if errors:
                    note = f"{len(errors)} failed: {errors[0][:80]}"
                print(f"  {sc.name:13s} {NAMES[what]:34s} {_mmm(secs)} {mbps:6.0f} {share} {rss:6.0f}  {note}".rstrip())
                if what == "sync" and secs:
                    net = _net(runs)
                    good = [r for r in runs if "error" not in r]
                    phases = ", ".join(
                        f"{p} {statistics.median([r['phases'].get(p, 0.0) for r in good]):.2f}"
                        for p in good[0]["phases"]
                    )
                    net_share = _share(sc.total, net if endpoint == "limited" else [], link)
                    print(
                        f"  {sc.name:13s} {'  the same less Triton load':34s} {_mmm(net)} "
                        f"{sc.total / statistics.median(net) / 1e6:6.0f} {net_share} {'':6s}  phases (median): {phases}"
                    )
        goals += _goals(results, scenarios, endpoint, link)
    rss_all = [r["rss_mb"] for (_, _, c), runs in results.items() if c == "sync" for r in runs if "rss_mb" in r]
    if rss_all:
        goals.append(
            f"  peak RSS of the sync child, largest of all runs: {max(rss_all):.0f} MB (goal <= 200 MB: "
            f"{_met(max(rss_all) <= 200)})"
        )
    if goals:
        print()
        print("issue 39's goals (ratios of medians):")
        print("\n".join(goals))


def _goals(results: Results, scenarios: list[Scenario], endpoint: str, link: int) -> list[str]:
    out = []
    for sc in scenarios:
        sync = results.get((endpoint, sc.name, "sync"), [])
        net = _net(sync)
        if not net:
            continue
        med = statistics.median(net)
        if endpoint == "limited":
            raw = _ok(results.get((endpoint, sc.name, "raw"), []))
            if raw:
                ratio = med / statistics.median(raw)
                out.append(
                    f"  {sc.name:13s} (list to READY - load) / raw parallel download: {med:.2f} / "
                    f"{statistics.median(raw):.2f} s = {ratio:.2f} (goal <= 1.15: {_met(ratio <= 1.15)})"
                )
            share = sc.total / med / link
            spread = (max(net) - min(net)) / med
            out.append(
                f"  {sc.name:13s} throughput (list to READY - load) / link: {sc.total / med / 1e6:.0f} of "
                f"{link / 1e6:.0f} MB/s = {share * 100:.0f} % (goal >= 90 %: {_met(share >= 0.9)}); "
                f"spread (max - min) / median of the {len(net)} runs {spread * 100:.0f} % "
                f"(goal <= 15 %: {_met(spread <= 0.15)})"
            )
        else:
            naive = _ok(results.get((endpoint, sc.name, "naive"), []))
            if naive:
                ratio = med / statistics.median(naive)
                what = "download_file + extractall" if sc.kind == "archive" else "download_file of each file"
                out.append(
                    f"  {sc.name:13s} unlimited: (sync - load) / naive {what}: {med:.2f} / "
                    f"{statistics.median(naive):.2f} s = {ratio:.2f} (goal <= 0.8: {_met(ratio <= 0.8)})"
                )
    return out


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    sys.exit(main())
