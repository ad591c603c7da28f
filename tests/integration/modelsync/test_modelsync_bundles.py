"""Bundles (modelsync/bundle.py): an ensemble and its steps in one zip, switched together on a real Triton.

The ensemble ``<bundle>`` runs pre -> mid -> post; step ``k`` of bundle
version ``v`` adds ``v * 10**k``, so the answer to 0 names the version of
every step that ran (111: all v1, 222: all v2, 121: a mix). One Triton for
the module; each test has its own bucket and model names.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from demo.triton import TritonServer
from modelsync import pbtxt
from modelsync.bundle import Part, is_bundle, switch_order
from tests.support.msync import (
    Env,
    FaultFileSystem,
    leftovers,
    make_zip,
    model_files,
    module_env,
    module_triton,
    moto,  # noqa: F401 - a fixture
    new_bucket,
    sha,
    unique,
    upload,
)
from tests.support.paths import REPO

ROOT = REPO
STEP_PY = """import time
import numpy as np
import triton_python_backend_utils as pb_utils
{fail}

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.003)
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x + {add}).astype(np.float32))]))
        return out
"""

ENSEMBLE = """name: "{name}"
platform: "ensemble"  # the daemon rewrites version_policy and the steps' model_version
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{pre}" model_version: -1
     input_map {{ key: "INPUT0" value: "INPUT0" }} output_map {{ key: "OUTPUT0" value: "t1" }} }},
  {{ model_name: "{mid}" model_version: -1
     input_map {{ key: "INPUT0" value: "t1" }} output_map {{ key: "OUTPUT0" value: "t2" }} }},
  {{ model_name: "{post}" model_version: -1
     input_map {{ key: "INPUT0" value: "t2" }} output_map {{ key: "OUTPUT0" value: "OUTPUT0" }} }}
] }}
"""


class Bundle:
    def __init__(self, name: str) -> None:
        self.name = name
        self.steps = [f"{name}-pre", f"{name}-mid", f"{name}-post"]
        self.key = f"{name}.zip"

    @property
    def models(self) -> list[str]:
        return [*self.steps, self.name]

    def zip(self, v: int, broken: str = "", extra: dict[str, bytes] | None = None) -> bytes:
        files: dict[str, bytes] = {}
        for k, step in enumerate(self.steps):
            files.update(model_files(step))
            fail = 'raise RuntimeError("boom: this build does not load")' if step == broken else ""
            files[f"{step}/1/model.py"] = STEP_PY.format(add=v * 10**k, fail=fail).encode()
        pre, mid, post = self.steps
        files[f"{self.name}/config.pbtxt"] = ENSEMBLE.format(name=self.name, pre=pre, mid=mid, post=post).encode()
        files[f"{self.name}/1/"] = b""
        return make_zip({**files, **(extra or {})})


served = module_triton("bundles")


@pytest.fixture
def env(moto, served, request) -> Env:  # noqa: F811 - the fixtures
    return module_env(moto, served, request)


def answer(env: Env, model: str) -> tuple[int, float | None]:
    status, body = env.triton.infer(model, [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}])
    return status, (body["outputs"][0]["data"][0] if status == 200 else None)  # type: ignore[index]


class Traffic:
    """A thread asking the ensemble every 20 ms; every answer kept."""

    def __init__(self, env: Env, model: str) -> None:
        self.env, self.model = env, model
        self.results: list[tuple[int, float | None]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.results.append(answer(self.env, self.model))
            time.sleep(0.02)

    def __enter__(self) -> Traffic:
        self.thread.start()
        time.sleep(0.3)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.3)
        self.stop.set()
        self.thread.join()

    def values(self) -> list[float | None]:
        return [v for _, v in self.results]

    def failures(self) -> list[tuple[int, float | None]]:
        return [r for r in self.results if r[0] != 200]


def put(env: Env, bundle: Bundle, data: bytes, **kw: object) -> None:
    upload(env.moto, env.bucket, bundle.key, data, **kw)  # type: ignore[arg-type]


def staging_empty(env: Env) -> bool:
    return leftovers(env.store, env.repository) == [] and not list(env.repository.parent.glob(".*modelsync/bundle-*"))


def served_versions(env: Env, model: str) -> set[str]:
    return {v["version"] for v in env.triton.index() if v["name"] == model and v.get("state") == "READY"}


# --- without Triton -----------------------------------------------------------------------------------


def test_pbtxt_rewrites_only_the_version_fields() -> None:
    text = ENSEMBLE.format(name="e", pre="a", mid="b", post="c") + "version_policy: { latest { num_versions: 2 } }\n"
    config = pbtxt.parse(text)
    config.set("version_policy", pbtxt.version_policy([3, 4]))
    for step in config.messages("ensemble_scheduling")[0].messages("step"):
        if step.scalar("model_name") in ("a", "c"):
            step.set("model_version", "4")
    again = pbtxt.parse(pbtxt.dump(config))
    assert pbtxt.dump(again) == pbtxt.dump(config)
    steps = again.messages("ensemble_scheduling")[0].messages("step")
    assert [s.scalar("model_version") for s in steps] == ["4", "-1", "4"]
    assert [s.messages("output_map")[0].scalar("value") for s in steps] == ["t1", "t2", "OUTPUT0"]
    policy = again.messages("version_policy")
    assert len(policy) == 1 and policy[0].messages("specific")[0].get("versions") == ["3", "4"]
    assert again.scalar("platform") == "ensemble" and again.scalar("max_batch_size") == "8"
    with pytest.raises(pbtxt.PbtxtError):
        pbtxt.parse("step { model_name: ")


def test_what_makes_a_zip_a_bundle() -> None:
    assert not is_bundle(["m/config.pbtxt", "m/1/model.py"], "m")
    assert is_bundle(["m/config.pbtxt", "pre/config.pbtxt"], "m")
    assert is_bundle(["a/config.pbtxt", "b/config.pbtxt"], "m")
    assert is_bundle(["other/config.pbtxt"], "m")
    assert not is_bundle(["m/config.pbtxt", "/etc/x"], "m")  # an absolute path: the model's checks refuse it
    assert not is_bundle(["m/config.pbtxt", "../x"], "m")
    assert not is_bundle(["m/config.pbtxt", "C:\\x"], "m")
    assert is_bundle(["m/config.pbtxt", "bad name/config.pbtxt"], "m")  # a bundle, whose model name is refused
    parts = {"e": Part("e", "1", True, ("a", "f")), "f": Part("f", "1", True, ("a",)), "a": Part("a", "1", False)}
    assert switch_order(parts) == ["a", "f", "e"]


# --- on a real Triton ----------------------------------------------------------------------------------


@pytest.mark.triton
def test_bundle_switches_under_traffic_without_mixing_and_rolls_back_together(env: Env) -> None:
    b = Bundle(unique("llm"))
    v1 = b.zip(1)
    put(env, b, v1)
    report = env.sync()
    assert report.outcomes[b.name].in_sync, report.outcomes[b.name]
    assert answer(env, b.name) == (200, 111.0)

    app = env.app()
    try:
        # v1 -> v2 under traffic: every answer from one generation, none failed, v2 at the end.
        v2 = b.zip(2)
        put(env, b, v2)
        with Traffic(env, b.name) as traffic:
            outcome = app.syncer.reconcile_all().outcomes[b.name]
        assert outcome.in_sync and outcome.result == "ok", outcome
        values = traffic.values()
        assert not traffic.failures() and len(values) > 20, traffic.failures()[:3]
        assert set(values) <= {111.0, 222.0}, sorted(set(values))
        assert values[0] == 111.0 and values[-1] == 222.0
        first_v2 = values.index(222.0)
        assert set(values[first_v2:]) == {222.0}, "once v2 answered, v1 never answered again"
        print(f"\nv1 -> v2: {len(values)} answers, {values.count(111.0)} v1, {values.count(222.0)} v2, 0 mixed")

        # On disk: each model a directory with one version (the generation) linked into the store.
        for m in b.models:
            d = env.repository / m
            assert d.is_dir() and not d.is_symlink()
            assert sorted(p.name for p in d.iterdir()) == ["2", "config.pbtxt"]
            assert (d / "2").is_symlink() and ".bundles" in os.readlink(d / "2")
            policy = pbtxt.parse((d / "config.pbtxt").read_text()).messages("version_policy")
            if m == b.name:  # the ensemble serves only the generation its steps are pinned to
                assert policy[0].messages("specific")[0].get("versions") == ["2"]
            else:  # a step serves the versions linked: both during the switch
                assert len(policy) == 1 and policy[0].messages("all")
            assert served_versions(env, m) == {"2"}
        steps = pbtxt.parse((env.repository / b.name / "config.pbtxt").read_text())
        pins = [s.scalar("model_version") for s in steps.messages("ensemble_scheduling")[0].messages("step")]
        assert pins == ["2", "2", "2"]

        # v3 whose middle step fails to load: all of it rolls back, v2 keeps answering, nothing fails.
        put(env, b, b.zip(3, broken=b.steps[1]))
        with Traffic(env, b.name) as traffic:
            outcome = app.syncer.reconcile_all().outcomes[b.name]
        assert outcome.result == "rolled_back" and "boom: this build does not load" in outcome.reason, outcome
        assert "generation 2" in outcome.reason
        assert not traffic.failures() and set(traffic.values()) == {222.0}, sorted(set(traffic.values()))
        assert answer(env, b.name) == (200, 222.0)
        for m in b.models:
            assert sorted(p.name for p in (env.repository / m).iterdir()) == ["2", "config.pbtxt"]
            assert served_versions(env, m) == {"2"}, (m, env.triton.index())
        assert staging_empty(env)
        loads = env.triton.log_text().count(f"loading: {b.steps[1]}:")
        assert app.syncer.reconcile_all().outcomes[b.name].failed  # remembered: not tried again
        assert env.triton.log_text().count(f"loading: {b.steps[1]}:") == loads
    finally:
        app.close()
    attempts = env.attempts(b.name)
    assert [a["result"] for a in attempts] == ["ok", "ok", "rolled_back"]  # one attempt per bundle
    assert attempts[1]["ModelArtifact"] == sha(v2) and attempts[2]["ModelArtifact"] == sha(v2)
    assert not any(env.attempts(m) for m in b.steps)


@pytest.mark.triton
def test_a_bundle_part_refused_changes_nothing(env: Env) -> None:
    b = Bundle(unique("rag"))
    put(env, b, b.zip(1))
    assert env.sync().outcomes[b.name].in_sync

    def unchanged() -> None:
        assert answer(env, b.name) == (200, 111.0)
        for m in b.models:
            assert sorted(p.name for p in (env.repository / m).iterdir()) == ["1", "config.pbtxt"]
        assert staging_empty(env)
        assert sorted(p.name for p in (env.store / ".bundles").glob(f"*/{b.name}/*")) == ["1", "state.json"]

    # A wrong hash: refused before anything is extracted.
    put(env, b, b.zip(2), digest="0" * 64)
    outcome = env.sync().outcomes[b.name]
    assert outcome.result == "hash_mismatch", outcome
    unchanged()
    # One part unsafe (a path out of its directory): the whole bundle is refused.
    put(env, b, b.zip(2, extra={f"{b.steps[2]}/1/../../../escaped": b"x"}))
    outcome = env.sync().outcomes[b.name]
    assert outcome.result == "unsafe_archive" and "'..' in the path" in outcome.reason, outcome
    unchanged()
    assert not list(env.root.parent.rglob("escaped"))
    # A part whose name Triton cannot serve verbatim.
    put(env, b, b.zip(2, extra={"bad name/config.pbtxt": b"", "bad name/1/model.py": b""}))
    outcome = env.sync().outcomes[b.name]
    assert outcome.result == "unsafe_archive" and "model name 'bad name' is not allowed" in outcome.reason, outcome
    unchanged()
    # A part with two versions: refused (the daemon chooses the version numbers).
    put(env, b, b.zip(2, extra={f"{b.steps[0]}/7/model.py": b""}))
    outcome = env.sync().outcomes[b.name]
    assert outcome.result == "unsafe_archive" and "exactly one version" in outcome.reason, outcome
    unchanged()
    # The bundle's key now holding a single model: refused, the bundle stays.
    put(env, b, make_zip(model_files(b.name, 9)))
    outcome = env.sync().outcomes[b.name]
    assert outcome.result == "unsafe_archive" and "installed as the bundle of" in outcome.reason, outcome
    unchanged()
    # The disk fills while the parts are extracted: nothing switched, nothing left in staging; retried.
    big = b.zip(2, extra={f"{b.steps[1]}/1/weights.bin": os.urandom(300_000)})
    put(env, b, big)
    outcome = env.sync(fs=FaultFileSystem(write_budget=len(big) + 150_000)).outcomes[b.name]
    assert outcome.result == "disk_full" and "No space left on device" in outcome.reason, outcome
    unchanged()
    # Not enough room for all the parts: refused before downloading.
    outcome = env.sync(fs=FaultFileSystem(free=len(big) + 4096), min_free_bytes=1 << 20).outcomes[b.name]
    assert outcome.result == "disk_full" and "headroom" in outcome.reason
    assert "SyncBytesDownloaded" not in env.attempts(b.name)[-1]
    unchanged()
    # Space is back: installed.
    assert env.sync().outcomes[b.name].in_sync
    assert answer(env, b.name) == (200, 222.0)

    # A model claimed twice: by another bundle, by a single-model archive.
    other = Bundle(unique("dup"))
    other.steps[0] = b.steps[0]
    put(env, other, other.zip(1))
    upload(env.moto, env.bucket, f"{b.steps[1]}.zip", make_zip(model_files(b.steps[1], 5)))
    report = env.sync()
    assert report.outcomes[other.name].result == "unsafe_archive"
    assert f"already belongs to bundle {b.name}" in report.outcomes[other.name].reason
    assert report.outcomes[b.steps[1]].failed and "belongs to bundle" in report.outcomes[b.steps[1]].reason
    assert not (env.repository / other.name).exists() and answer(env, b.name) == (200, 222.0)

    # A single model's key now holding a bundle: a key keeps its kind, so it is read as one model (no peek at
    # the zip's directory: an update costs no request more than its download) and refused after it.
    single = Bundle(unique("single"))
    upload(env.moto, env.bucket, f"{single.name}.zip", make_zip(model_files(single.name, 4)))
    assert env.sync().outcomes[single.name].in_sync
    link = os.readlink(env.repository / single.name)
    put(env, single, single.zip(1))
    outcome = env.sync().outcomes[single.name]
    assert outcome.result == "unsafe_archive" and f"is installed from {single.name}.zip as one model" in outcome.reason
    assert os.readlink(env.repository / single.name) == link and env.infer(single.name, 1.0) == 5.0
    assert not any((env.repository / m).exists() for m in single.steps) and staging_empty(env)


@pytest.mark.triton
def test_installed_before_triton_starts_then_restarted_daemon_and_triton_serve_the_new_generation(
    moto,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """Before the first sync Triton is not running: the bundle is written as it must load at Triton's start.
    After a switch, a new daemon and a restarted Triton on the same repository serve the new generation."""
    (tmp_path / "repo").mkdir()
    (tmp_path / "triton").mkdir()
    server = TritonServer(tmp_path / "repo", workdir=tmp_path / "triton")
    env = Env(moto, server, new_bucket(moto), tmp_path, tmp_path / "emf.log")
    b = Bundle(unique("restart"))
    put(env, b, b.zip(1))
    outcome = env.sync().outcomes[b.name]  # Triton is not running yet
    assert not outcome.in_sync and "loads it at its start" in outcome.reason, outcome
    try:
        server.start()
        assert answer(env, b.name) == (200, 111.0)
        assert env.sync().outcomes[b.name].in_sync
        put(env, b, b.zip(2))
        assert env.sync().outcomes[b.name].in_sync
        attempts = len(env.attempts(b.name))
        server.restart()  # --load-model=*: what the repository holds on disk
        for _ in range(20):
            assert answer(env, b.name) == (200, 222.0)
        for m in b.models:
            assert served_versions(env, m) == {"2"}
        report = env.sync()  # a new daemon on the same repository and store
        assert report.outcomes[b.name].in_sync and len(env.attempts(b.name)) == attempts
        # A daemon killed in the middle of the v3 switch (right at its first link): the next start undoes it,
        # v2 serves meanwhile, and v3 goes in as the next generation.
        put(env, b, b.zip(3))
        args = ["--bucket", env.bucket, "--repository", str(env.repository), "--store", str(env.store),
                "--triton-url", server.url, "--output", f"file:{env.emf}", "--min-free-bytes", "0"]  # fmt: skip
        crash = ROOT / "tests" / "support" / "modelsync_crash.py"
        proc = subprocess.run([sys.executable, str(crash), *args], cwd=ROOT, env=moto.env(), capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 137, proc.stderr
        assert list(env.store.glob(f".bundles/*/{b.name}/pending.json"))
        assert answer(env, b.name) == (200, 222.0)
        app = env.app()
        try:
            assert any(f"bundle {b.name}: undid the interrupted switch" in line for line in app.syncer.recover())
            assert not list(env.store.glob(f".bundles/*/{b.name}/pending.json")) and staging_empty(env)
            assert app.syncer.reconcile_all().outcomes[b.name].in_sync
        finally:
            app.close()
        assert answer(env, b.name) == (200, 333.0)
        for m in b.models:
            assert served_versions(env, m) == {"4"}  # above the 3 the killed daemon had used
            assert sorted(p.name for p in (env.repository / m).iterdir()) == ["4", "config.pbtxt"]

        # Removed from S3: kept and reported, then unloaded and deleted with --delete-removed.
        env.moto.client("s3").delete_object(Bucket=env.bucket, Key=b.key)
        outcome = env.sync().outcomes[b.name]
        assert not outcome.in_sync and "--delete-removed" in outcome.reason
        assert answer(env, b.name) == (200, 333.0)
        assert env.sync(delete_removed=True).outcomes[b.name].gone
        assert not any((env.repository / m).exists() for m in b.models) and not list(env.store.glob(".bundles/*/*"))
        assert all(not served_versions(env, m) for m in b.models)
    finally:
        server.stop()
