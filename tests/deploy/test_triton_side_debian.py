"""The probe and the start-up check under Debian's Python 3.9, 3.11 and 3.13 (bullseye, bookworm, trixie images built
as the container rehearsal builds its base): the same exit codes and lines as on this machine."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from demo.triton import TritonServer
from tests.support import debian, fakes, rehearsal
from tests.unit.triton_side.test_triton_side import CHUNKED, HEAVY, importtime_names, install_copy, json_answer, routes

# --- under Debian's Python 3.9, 3.11 and 3.13 -------------------------------------------------------

HOSTILE = {  # answers a broken or hostile listener gives: each must be one FAIL line on every Python
    "deep-json": {"POST /v2/repository/index": json_answer(b"[" * 100_000 + b"]" * 100_000)},
    "huge-content-length": {"POST /v2/repository/index": fakes.head(200, "application/json", 10**12)},
    "negative-chunk": {"POST /v2/repository/index": fakes.head(200, "application/json", extra=CHUNKED) + b"-5\r\n"},
    "not-http": {"GET /v2/health/live": b"SSH-2.0-OpenSSH_9.2p1\r\n\r\n"},
}
FAILED_INDEX = [{"name": f"m{i}", "version": "1", "state": "UNAVAILABLE", "reason": "boom\n" * 20} for i in range(1000)]
FAKES = {**HOSTILE, "many-failed": {"POST /v2/repository/index": json_answer(json.dumps(FAILED_INDEX).encode())}}


def probe_cases(folder: Path, triton_url: str, hostile: Mapping[str, str]) -> dict[str, list[str]]:
    """The probe's commands against a real Triton (add, slow, text, fails READY; broken failed) and fakes."""
    health = [debian.PYTHON, "-I", "-S", str(folder / "health.py")]
    port = triton_url.rsplit(":", 1)[1]
    cases = {
        "python": [debian.PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        "a model failed to load": [*health, "--triton-url", triton_url],
        "healthy once it is ignored": [*health, "--triton-url", triton_url, "--ignore", "broken"],
        "quiet when healthy": [*health, "--triton-url", triton_url, "--ignore", "broken", "--quiet"],
        "localhost": [*health, "--triton-url", f"http://localhost:{port}", "--models", "add,text/1"],
        "smoke inference fails": [*health, "--triton-url", triton_url, "--ignore", "broken", "--smoke"],
        "smoke inference ok": [*health, "--triton-url", triton_url, "--ignore", "broken,fails", "--smoke"],
        "json": [*health, "--triton-url", triton_url, "--models", "add,fails", "--smoke", "add", "--json"],
        "unknown model": [*health, "--triton-url", triton_url, "--models", "nope"],
        "nothing listening": [*health, "--triton-url", "http://127.0.0.1:9"],
        "usage error": [*health, "--deadline", "soon"],
        "help": [*health, "--help"],
        "imports": [debian.PYTHON, "-X", "importtime", *health[1:], "--triton-url", triton_url, "--ignore", "broken"],
    }
    cases |= {f"hostile {name}": [*health, "--triton-url", url] for name, url in hostile.items()}
    return cases


def startup_cases(folder: Path, gpus: Path) -> dict[str, list[str]]:
    """The start-up check against its GPU stand-ins: fake nvidia-smi binaries and /dev folders."""
    from tests.unit.triton_side.test_startup_check import (
        A10G_QUERY,
        A10G_TABLE,
        L40S_QUERY,
        L40S_TABLE,
        NO_DRIVER,
        fake_dev,
        fake_smi,
    )

    stand_ins = {
        "a10g": (A10G_QUERY, A10G_TABLE, 0, 0.0),
        "l40s": (L40S_QUERY, L40S_TABLE, 0, 0.0),
        "no-driver": (NO_DRIVER, NO_DRIVER, 9, 0.0),
        "hung": (A10G_QUERY, A10G_TABLE, 0, 30.0),
    }
    for name, (query, table, code, sleep) in stand_ins.items():
        fake_smi(gpus / name, query, table, code, sleep)
        fake_dev(gpus / name)
    (gpus / "no-devices").mkdir()
    fake_dev(gpus / "no-devices", ())

    def check(stand_in: str, *args: str, dev: str = "") -> list[str]:
        where = [
            "--nvidia-smi",
            str(gpus / stand_in / "bin" / "nvidia-smi"),
            "--dev-dir",
            str(gpus / (dev or stand_in) / "dev"),
        ]
        return [debian.PYTHON, "-I", "-S", str(folder / "startup_check.py"), *where, *args]

    return {
        "start-up: the GPU expected": check("a10g", "--expect-gpu", "A10G|L4"),
        "start-up: L40S is not L4": check("l40s", "--expect-gpu", "A10G|L4"),
        "start-up: driver too old": check("a10g", "--min-cuda", "12.4"),
        "start-up: no driver": check("no-driver"),
        "start-up: too few GPUs": check("a10g", "--min-gpus", "2"),
        "start-up: hung driver": check("hung", "--timeout", "0.5"),
        "start-up: no device nodes": check("a10g", dev="no-devices"),
        "start-up: usage error": check("a10g", "--min-gpus", "0"),
    }


def verdict(case: str, result: debian.Result) -> tuple[int, object]:
    """What must be the same on every Python: the exit code and the output, timings taken out."""
    text = result.out + result.err
    if case == "help":
        return result.code, text.startswith("usage: health.py ")  # argparse's layout changes between versions
    if case == "imports":
        return result.code, sorted(importtime_names(result.err) & HEAVY)
    if case == "json":
        doc = json.loads(result.out)
        for check in doc["checks"]:
            check.pop("duration_s")
            check["detail"] = re.sub(r"in \d+ ms", "in N ms", check["detail"])
        doc.pop("duration_s")
        doc["summary"] = re.sub(r"; [\d.]+ s$", "", doc["summary"])
        return result.code, doc
    text = re.sub(r"; [\d.]+ s$", "", text, flags=re.MULTILINE)
    return result.code, re.sub(r"in \d+ ms", "in N ms", text)


class DebianRuns:
    """The cases' results on this machine's Python (``here``) and in each suite's container (``there``)."""

    def __init__(self, here: dict[str, debian.Result], there: dict[str, dict[str, debian.Result]]) -> None:
        self.here = here
        self.there = there


@pytest.fixture(scope="module")
def debian_runs(triton: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DebianRuns]:
    """Every case, on this machine's Python and in a container of each suite (in parallel), once per module."""
    reason = rehearsal.unavailable()
    if reason:
        pytest.skip(f"Debian's Pythons run on the container rehearsal's engine, which {reason}")
    work = tmp_path_factory.mktemp("debian")
    folder = install_copy(work)
    servers = {name: fakes.FakeHttp(routes(answers)) for name, answers in FAKES.items()}
    try:
        cases = probe_cases(folder, triton.url, {name: s.url for name, s in servers.items()})
        cases |= startup_cases(folder, work / "gpus")
        with rehearsal.shared_engine("debian-pythons") as docker, ThreadPoolExecutor(len(debian.SUITES) + 1) as pool:
            on_host = pool.submit(debian.run_on_host, sys.executable, list(cases.values()))
            log = lambda line: print(line, flush=True)  # noqa: E731
            images = {suite: debian.python_image(docker, suite, log) for suite in debian.SUITES}
            futures = {
                suite: pool.submit(debian.run_commands, docker, image, list(cases.values()), [work], work / suite)
                for suite, image in images.items()
            }
            there = {suite: dict(zip(cases, future.result())) for suite, future in futures.items()}
            here = dict(zip(cases, on_host.result()))
    finally:
        for server in servers.values():
            server.close()
    yield DebianRuns(here, there)


@pytest.mark.rehearsal
@pytest.mark.triton
@pytest.mark.timeout(1500)  # a cold build: about two minutes of mmdebstrap per suite
@pytest.mark.parametrize("suite", list(debian.SUITES))
def test_verdicts_under_debian_python(suite: str, debian_runs: DebianRuns) -> None:
    """The probe against a real Triton, and the start-up check against its stand-ins, under ``suite``'s
    python3: the same exit codes and lines as on this machine, and the same lean imports."""
    there = debian_runs.there[suite]
    assert there["python"].out.strip() == debian.SUITES[suite]
    for case, result in there.items():
        if case == "python":
            continue
        assert verdict(case, result) == verdict(case, debian_runs.here[case]), (case, result)
    # and the verdicts are the right ones (not the same failure everywhere)
    codes = {case: result.code for case, result in there.items()}
    assert codes["a model failed to load"] == 1 and codes["healthy once it is ignored"] == 0
    assert there["quiet when healthy"] == debian.Result(0, "", "")
    assert codes["localhost"] == 0 and "add/1, text/1" in there["localhost"].out
    assert codes["smoke inference ok"] == 0 and "smoke inference ok for 3" in there["smoke inference ok"].out
    assert codes["smoke inference fails"] == 1 and "'fails'" in there["smoke inference fails"].out
    assert codes["usage error"] == 2 and codes["help"] == 0 and verdict("imports", there["imports"]) == (0, [])
    for name in HOSTILE:
        lines = there[f"hostile {name}"].out.splitlines()
        assert codes[f"hostile {name}"] == 1 and len(lines) == 2 and lines[0].startswith("FAIL "), lines
    lines = there["hostile many-failed"].out.splitlines()  # a 100 KB index: json.loads reads it, 20 FAIL lines
    assert codes["hostile many-failed"] == 1 and len(lines) == 22 and "+980 more failed" in lines[-2], lines
    assert [codes[c] for c in there if c.startswith("start-up:")] == [0, 5, 6, 3, 4, 3, 3, 2]
