"""The built-in demo: a real local Triton, sample models, traffic, and the exporter's output.

    python -m demo [--interval 5] [--keep-running]

Starts tritonserver (from the nvidia-pytriton wheel) on free ports with the
sample models (``broken`` fails to load on purpose; ``vllm_model`` and
``tensorrt_llm`` publish the vLLM and TensorRT-LLM backends' metric
families; the decoupled ``stream`` and the plain ``classify`` publish
Triton 26.01's first-response histogram, read as TimeToFirstToken for the
first and RequestLatency for the second), sends a steady mix of requests, and
runs ``python -m exporter --once`` against it: EMF on stdout, the summary
table (its LLM table, and what each model cannot produce, and why) on
stderr.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import llm
from .triton import TritonServer, copy_models


def requests(server: TritonServer) -> list[Callable[[int], object]]:
    """One request to each sample model of the core mix, as functions of the request's number ``n``."""
    x = [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}]
    bad = [{"name": "X", "datatype": "FP32", "shape": [1], "data": [-1.0]}]
    text = [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["hello"]}]
    return [
        lambda n: server.infer_add(1, values=(1.0, 2.0, 3.0)),
        lambda n: server.infer("slow", x),
        lambda n: server.infer("text", text),
        lambda n: server.infer("fails", bad if n % 2 else x),  # every other request raises in the model: a failure
        lambda n: server.infer("classify", x),  # not decoupled: its first-response histogram is its request latency
        lambda n: server.request("POST", "/v2/models/stream/generate_stream", {"text_input": "the first token"}),
    ]


def traffic(server: TritonServer, stop: threading.Event) -> None:
    """The core mix, one request to each model in turn, every 50 ms."""
    send = requests(server)
    n = 0
    while not stop.is_set():
        for one in send:
            one(n)
        n += 1
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0, help="window of the --once scrape, seconds")
    parser.add_argument(
        "--keep-running", action="store_true", help="after --once, run the exporter loop (Ctrl-C to stop)"
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="triton-demo-"))
    # As deployed: Triton's admin APIs open only to a key the sidecar holds (docs/security.md).
    key = secrets.token_urlsafe(32)
    server = TritonServer(copy_models(None, work / "models"), workdir=work, admin_key=key)
    print(f"starting Triton with sample models from {work / 'models'} ...", file=sys.stderr)
    server.start()
    print(f"Triton up: HTTP {server.url}, metrics {server.metrics_url}; server log {server.log_path}", file=sys.stderr)
    print(
        "its repository, configuration, trace and logging APIs answer only the exporter's TRITON_ADMIN_KEY",
        file=sys.stderr,
    )
    stop = threading.Event()
    threads = [
        threading.Thread(target=target, args=(server, stop), daemon=True) for target in (traffic, llm.traffic)
    ]  # LLM requests sleep their time to first token
    for thread in threads:
        thread.start()
    cmd = [
        sys.executable,
        "-m",
        "exporter",
        "--triton-url",
        server.url,
        "--triton-metrics-url",
        server.metrics_url,
        "--interval",
        str(args.interval),
    ]
    try:
        print(f"\n$ python -m exporter --once --interval {args.interval:g} ...\n", file=sys.stderr)
        env = {**os.environ, "TRITON_ADMIN_KEY": key}
        rc = subprocess.call([*cmd, "--once"], env=env)
        if args.keep_running and rc == 0:
            print("\nrunning the exporter loop; Ctrl-C to stop\n", file=sys.stderr)
            try:
                rc = subprocess.call(cmd, env=env)
            except KeyboardInterrupt:
                rc = 0
        return rc
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
