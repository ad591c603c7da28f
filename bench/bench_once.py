"""Benchmark: a whole ``python -m exporter --once`` process against prometheus_client's whole process, same body.

    .venv/bin/python bench/bench_once.py [--models 1000] [--rounds 5] [--llm] [--before DIR]
    .venv/bin/python bench/bench_once.py --serve [--models 1000] [--llm]   # the scripted Triton alone, to profile

``--before DIR`` runs another checkout's sidecar too (``git worktree add DIR COMMIT``, or ``git archive COMMIT``
unpacked, with the C scanner built there: ``python setup.py build_ext --inplace``), in the same alternated rounds:
a before/after pair measured on the same machine in the same minutes.

A scripted Triton in this process (a threaded HTTP server) answers what the sidecar reads: ``/metrics`` (bodies
in Triton's exact shape from demo/payloads.py, the next step of traffic on every scrape, so the second scrape
has deltas), ``POST /v2/repository/index`` (every model READY), ``GET /v2`` and each version's configuration
(``GET /v2/models/{m}/versions/{v}/config``, a few hundred bytes as Triton answers them). Then, alternated,
best of ``--rounds`` each (the machine is shared):

- ours: ``python -m exporter --once --interval 6 --nvml off`` with the ECS task metadata served too, as the
  task definition runs it (two scrapes 6 s apart, the window's EMF on stdout, the table on stderr). Not a
  shorter interval: the timeout is half of it, configuration reads get half of that, and below ~1.5 s a
  faster sidecar would read more configurations than a slower one in the same run (6 s: 200 a cycle, the cap);
- reference: a fresh interpreter that reads the same ``/metrics`` once over HTTP (urllib) and consumes every
  sample of prometheus_client's ``text_string_to_metric_families``.

The two do different work: ours pays its imports, the catalog, two scrapes (the first reads every label block
cold), the EMF and, in a thread, up to 200 configuration reads a cycle (a new version's configuration is read
once, over its own connection); the reference parses one body into objects. The table says how many requests
each of our runs made.

Figures are the child process's own CPU seconds (user + system, from ``wait4``: the server's work is this
process's, not the child's) and peak RSS. The sleep between the two scrapes costs no CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_CORE_CONFIG = {
    "name": "",
    "platform": "onnxruntime_onnx",
    "backend": "onnxruntime",
    "version_policy": {"latest": {"num_versions": 1}},
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16], "format": "FORMAT_NONE"}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16], "label_filename": ""}],
    "batch_input": [],
    "batch_output": [],
    "optimization": {"priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": True}},
    "dynamic_batching": {"preferred_batch_size": [8], "max_queue_delay_microseconds": 100},
    "instance_group": [{"name": "", "kind": "KIND_GPU", "count": 1, "gpus": [0]}],
    "default_model_filename": "model.onnx",
    "parameters": {},
}
_LLM_CONFIG = {
    **_CORE_CONFIG,
    "platform": "",
    "backend": "python",
    "max_batch_size": 0,
    "model_transaction_policy": {"decoupled": True},
    "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}],
    "output": [{"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]}],
    "default_model_filename": "model.py",
}
_TASK = {
    "Cluster": "bench",
    "TaskARN": "arn:aws:ecs:us-east-1:123456789012:task/bench/0123456789abcdef",
    "Family": "triton",
    "Revision": "7",
    "AvailabilityZone": "us-east-1a",
    "LaunchType": "EC2",
}


class ScriptedTriton:
    """Triton's HTTP endpoints for ``models`` READY models, scripted from bodies written under ``workdir``."""

    def __init__(self, models: int, workdir: Path, llm: bool = False, steps: int = 4) -> None:
        from demo.payloads import first_response_metrics, llm_metrics, model_names, triton_metrics

        names = model_names(models)
        self.bodies: list[Path] = []
        for step in range(1, steps + 1):
            text = triton_metrics(names, step=step, gpus=["GPU-0"])
            if llm:
                half = models // 2
                text += (
                    first_response_metrics(names, step)
                    + llm_metrics(names[:half], step, "vllm")
                    + llm_metrics(names[half:], step, "tensorrt_llm")
                )
            path = workdir / f"metrics-{step}.txt"
            path.write_text(text)
            self.bodies.append(path)
        self.index = json.dumps([{"name": n, "version": "1", "state": "READY"} for n in names]).encode()
        self.config = _LLM_CONFIG if llm else _CORE_CONFIG
        self.scrapes = 0
        self.counts: dict[str, int] = {}  # requests answered, by kind
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                kind = "config" if self.path.endswith("/config") else self.path
                with server.lock:
                    server.counts[kind] = server.counts.get(kind, 0) + 1
                if self.path == "/metrics":
                    with server.lock:
                        path = server.bodies[server.scrapes % len(server.bodies)]
                        server.scrapes += 1
                    self._send(path.read_bytes(), "text/plain; charset=utf-8; version=0.0.4")
                elif self.path == "/v2":
                    self._send(b'{"name":"triton","version":"2.51.0","extensions":["classification"]}')
                elif self.path.startswith("/v2/models/") and self.path.endswith("/config"):
                    name = self.path.split("/")[3]
                    self._send(json.dumps({**server.config, "name": name}).encode())
                elif self.path == "/task/task":
                    self._send(json.dumps(_TASK).encode())
                else:
                    self._send(b"{}", status=404)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with server.lock:
                    server.counts["POST " + self.path] = server.counts.get("POST " + self.path, 0) + 1
                if self.path == "/v2/repository/index":
                    self._send(server.index)
                else:
                    self._send(b"{}", status=404)

            def _send(self, body: bytes, content_type: str = "application/json", status: int = 200) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def ours_command(url: str) -> tuple[list[str], dict[str, str]]:
    """The sidecar's ``--once`` as the task definition would run it against ``url`` (run in the tree to measure:
    ``-m exporter`` finds the package in the working directory first)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EXPORTER_", "ECS_", "AWS_"))}
    env["ECS_CONTAINER_METADATA_URI_V4"] = url + "/task"
    argv = [sys.executable, "-m", "exporter", "--once", "--interval", "6", "--nvml", "off"]
    argv += ["--triton-metrics-url", url + "/metrics", "--triton-url", url]
    return argv, env


_REFERENCE = """
import sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
text = urllib.request.urlopen(sys.argv[1], timeout=30).read().decode()
print(sum(len(f.samples) for f in text_string_to_metric_families(text)))
"""


def reference_command(url: str) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-c", _REFERENCE, url + "/metrics"], dict(os.environ)


def measure(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> dict[str, float]:
    """Run ``argv`` to the end; its own CPU seconds (user, system) and peak RSS, from wait4."""
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} exited {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "rss_mb": usage.ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--llm", action="store_true", help="LLM-shaped bodies (first-response, vLLM, TensorRT-LLM)")
    parser.add_argument("--serve", action="store_true", help="serve until interrupted; print the URL")
    parser.add_argument("--before", type=Path, help="another checkout's sidecar, measured in the same rounds")
    args = parser.parse_args()
    trees = {"python -m exporter --once": ROOT}
    if args.before is not None:
        if not (args.before / "exporter" / "__main__.py").exists():
            raise SystemExit(f"--before {args.before}: no exporter/__main__.py there")
        trees = {"before: --once": args.before.resolve(), "after: --once": ROOT}
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in [*trees, "reference"]}
    requests: dict[str, list[dict[str, int]]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory() as tmp:
        triton = ScriptedTriton(args.models, Path(tmp), llm=args.llm)
        try:
            if args.serve:
                print(triton.url, flush=True)
                threading.Event().wait()
            for _ in range(args.rounds):
                for label, tree in trees.items():
                    with triton.lock:
                        before = dict(triton.counts)
                    runs[label].append(measure(*ours_command(triton.url), cwd=tree))
                    with triton.lock:
                        requests[label].append({k: v - before.get(k, 0) for k, v in triton.counts.items()})
                runs["reference"].append(measure(*reference_command(triton.url)))
        finally:
            triton.close()
        body_kb = triton.bodies[0].stat().st_size / 1024
    best_at = {label: min(range(len(rows)), key=lambda i: rows[i]["cpu_s"]) for label, rows in runs.items()}
    best = {label: runs[label][i] for label, i in best_at.items()}
    ref = best["reference"]
    shape = "llm" if args.llm else "core"
    print(
        f"whole process, {args.models} {shape} models, /metrics body {body_kb:.0f} KB "
        f"(least CPU of {args.rounds} alternated runs each; peak RSS of that run):"
    )
    for label, row in best.items():
        name = "prometheus_client, one parse" if label == "reference" else label
        ratio = (
            ""
            if label == "reference"
            else f"  ({row['cpu_s'] / ref['cpu_s']:.2f}x CPU, {row['rss_mb'] / ref['rss_mb']:.2f}x RSS)"
        )
        print(
            f"  {name:<30} {row['cpu_s']:>6.3f} s CPU (user {row['user_s']:.3f}, sys {row['sys_s']:.3f})  "
            f"peak RSS {row['rss_mb']:>6.1f} MB{ratio}"
        )
    for label, rows in requests.items():
        made = ", ".join(f"{kind} {n}" for kind, n in sorted(rows[best_at[label]].items()) if n)
        print(f"  requests made by the {label!r} run above: {made}")


if __name__ == "__main__":
    main()
