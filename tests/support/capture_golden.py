"""Capture the LLM golden cases from a real Triton (the nvidia-pytriton wheel's 2.51):

    .venv/bin/python -m tests.support.capture_golden [vllm] [tensorrt_llm] [response_cache]
    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/exporter/test_golden.py   # then review expected.jsonl

For each case: a fresh server with only that sample model, a known warm-up
(so the baseline is not all zeros), ``metrics-1.txt``, the case's known
traffic, ``metrics-2.txt`` and ``index.json`` into
tests/fixtures/golden/<case>/. The traffic is below; tests/unit/exporter/test_golden.py
checks the emitted values against it by hand. Durations, CPU figures and
the TensorRT-LLM timestamp differ from run to run; nothing the hand checks
read does.

``response_cache`` is Triton's own families with the response cache on
(``--cache-config local,...`` and ``response_cache { enable: true }`` in the
sample model ``add``): per-model hits and misses, the queue summary, the CPU
and pinned-pool gauges, and no request summary (Triton never creates it for
a cached model).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from demo.llm import TRT, VLLM, trt, vllm, wait_counted
from demo.triton import TritonServer, _pytriton_root, copy_models

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "golden"


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


# (prompt words, max_tokens, ttft ms, itl ms) per vllm_model request
VLLM_WARMUP = [(4, 8, 25, 30)] * 3
VLLM_WINDOW = [
    (3, 8, 25, 30),
    (5, 20, 25, 30),
    (12, 1, 65, 30),
    (40, 64, 120, 30),
    (7, 16, 300, 80),
    (120, 200, 45, 30),
]
# one list of (prompt words, max_tokens) per tensorrt_llm request; the last request sets the gauges
TRT_WARMUP = [[(10, 20), (10, 20)]]
TRT_WINDOW = [[(200, 100), (30, 1500), (600, 5)], [(5, 10), (60, 20), (100, 30), (20, 40), (7, 50), (3, 60)]]


def _vllm_traffic(server: TritonServer, requests: list[tuple[int, int, int, int]], tag: str) -> None:
    for n, (prompt, max_tokens, ttft, itl) in enumerate(requests):
        vllm(server, words(prompt, f"{tag}{n}-"), max_tokens=max_tokens, ttft_ms=ttft, itl_ms=itl)


def _trt_traffic(server: TritonServer, requests: list[list[tuple[int, int]]], tag: str) -> None:
    for n, rows in enumerate(requests):
        trt(server, [words(p, f"{tag}{n}-") for p, _ in rows], [m for _, m in rows])


# (request values, how many times) per add request group: a repeated input is a response cache hit
CACHE_WARMUP = [((1.0, 2.0), 2)]
CACHE_WINDOW = [((1.0, 2.0), 3), ((3.0, 4.0), 2), ((5.0, 6.0), 1)]


def _add_traffic(server: TritonServer, requests: list[tuple[tuple[float, ...], int]]) -> None:
    for values, n in requests:
        server.infer_add(n, values=values)


CASES = {
    "vllm": (VLLM, lambda s: _vllm_traffic(s, VLLM_WARMUP, "a"), lambda s: _vllm_traffic(s, VLLM_WINDOW, "b")),
    "tensorrt_llm": (TRT, lambda s: _trt_traffic(s, TRT_WARMUP, "a"), lambda s: _trt_traffic(s, TRT_WINDOW, "b")),
    "response_cache": ("add", lambda s: _add_traffic(s, CACHE_WARMUP), lambda s: _add_traffic(s, CACHE_WINDOW)),
}
CACHE_ARGS = ["--cache-config", "local,size=1048576"]


def _server(case: str, model: str, work: Path) -> TritonServer:
    repo = copy_models([model], work / "models")
    if case != "response_cache":
        return TritonServer(repo, workdir=work)
    config = repo / model / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    caches = ["--cache-directory", str(_pytriton_root() / "caches")]
    return TritonServer(repo, workdir=work, extra_args=[*caches, *CACHE_ARGS])


def capture(case: str, dest: Path = GOLDEN) -> Path:
    model, warmup, window = CASES[case]
    work = Path(tempfile.mkdtemp(prefix=f"golden-{case}-"))
    server = _server(case, model, work)
    out = dest / case
    out.mkdir(parents=True, exist_ok=True)
    try:
        server.start()
        warmup(server)
        wait_counted(server)  # Triton's own counters lag the responses a little
        time.sleep(0.5 if case == "response_cache" else 0)  # no second count of add's requests to wait on
        (out / "metrics-1.txt").write_text(server.metrics_text())
        window(server)
        wait_counted(server)
        time.sleep(0.5 if case == "response_cache" else 0)
        (out / "metrics-2.txt").write_text(server.metrics_text())
        (out / "index.json").write_text(json.dumps(server.index()))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str]) -> int:
    cases = argv or sorted(CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        sys.stderr.write(f"unknown case(s) {unknown}; one of {sorted(CASES)}\n")
        return 2
    for case in cases:
        print(f"captured {capture(case)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
