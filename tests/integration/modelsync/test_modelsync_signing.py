"""--require-signature, outcome: the daemon against moto's S3 and a real Triton, signatures made here.

A signed model installs; an unsigned one, a tampered file, another model's signature, a signature by another
key are each refused with its reason (the attempt's EMF ``result=signature_refused``, one JSON log line), and
the version served before keeps serving: the link does not move and Triton answers as before.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.modelsigning import inside, keypair, sign_files
from tests.support.msync import (
    CONFIG,
    MODEL_PY,
    Env,
    leftovers,
    make_zip,
    model_files,
    module_env,
    module_triton,
    moto,  # noqa: F401 - a fixture
    sha,
    unique,
    upload,
)

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.triton]

served = module_triton("msyncsig")


@pytest.fixture
def env(moto, served, request) -> Env:  # noqa: F811 - the fixtures
    return module_env(moto, served, request)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    where = tmp_path_factory.mktemp("keys")
    return {"ci": keypair(where, "ci"), "other": keypair(where, "other")}


def files_of(model: str, add: float = 1.0) -> dict[str, bytes]:
    """A directory model's files, paths relative to the model directory."""
    return {"config.pbtxt": CONFIG.format(name=model).encode(), "1/model.py": MODEL_PY.format(add=add).encode()}


def manifest_of(files: dict[str, bytes]) -> bytes:
    return json.dumps({"files": [{"path": p, "size": len(d), "sha256": sha(d)} for p, d in files.items()]}).encode()


def put(env: Env, key: str, data: bytes | None) -> None:
    """Upload (or delete, with None) one object without sha256 metadata: a .sig."""
    s3 = env.moto.client("s3")
    if data is None:
        s3.delete_object(Bucket=env.bucket, Key=key)
    else:
        s3.put_object(Bucket=env.bucket, Key=key, Body=data)


def publish_zip(env: Env, model: str, files: dict[str, bytes], sig: bytes | None) -> None:
    """The order docs/modelsync.md gives: the .sig first, then the archive (with its sha256 metadata)."""
    put(env, f"{model}.zip.sig", sig)
    upload(env.moto, env.bucket, f"{model}.zip", make_zip(files))


def test_a_signed_zip_installs_and_each_bad_signature_is_refused_while_the_old_version_serves(env, keys) -> None:
    ci, other = keys["ci"][0], keys["other"][0]
    on = {"require_signature": True, "signature_public_key": keys["ci"][1]}
    m = unique("sig")
    v1 = model_files(m, add=1.0)
    publish_zip(env, m, v1, sign_files(m, inside(v1, m), ci))
    outcome = env.sync(**on).outcomes[m]
    assert outcome.in_sync, outcome
    assert env.infer(m) == 2.0
    served_dir = env.link(m)

    twin = unique("twin")  # another model whose signed files are byte for byte what m's key will hold
    tampered = model_files(m, add=3.0)
    cases = [
        ("unsigned", model_files(m, add=2.0), None, r"no signature: s3://[^ ]+\.zip\.sig does not exist"),
        (
            "tampered",
            {**tampered, f"{m}/1/model.py": b"import os\nos.system('id')\n"},
            sign_files(m, inside(tampered, m), ci),
            r"does not match its signature: 1 file\(s\) differ from the signature: 1/model.py",
        ),
        (
            "another model's signature",
            model_files(m, add=4.0),
            sign_files(twin, inside(model_files(m, add=4.0), m), ci),
            rf"signed for model '{twin}', not '{m}'",
        ),
        (
            "another key",
            model_files(m, add=5.0),
            sign_files(m, inside(model_files(m, add=5.0), m), other),
            "signed by another key than the pinned --signature-public-key",
        ),
    ]
    for what, files, sig, reason in cases:
        publish_zip(env, m, files, sig)
        outcome = env.sync(**on).outcomes[m]
        assert not outcome.in_sync, what
        attempt = env.attempts(m)[-1]
        assert attempt["result"] == "signature_refused", (what, attempt)
        assert re.search(reason, outcome.reason), (what, outcome.reason)
        assert env.link(m) == served_dir, what  # nothing installed
        assert env.infer(m) == 2.0, what  # and Triton keeps serving the signed version
        assert leftovers(env.store, env.repository) == [], what

    v6 = model_files(m, add=6.0)  # a signed upload afterwards installs: nothing is stuck
    publish_zip(env, m, v6, sign_files(m, inside(v6, m), ci))
    assert env.sync(**on).outcomes[m].in_sync
    assert env.infer(m) == 7.0


def test_a_directory_model_is_checked_against_its_signature_before_its_files_are_fetched(env, keys) -> None:
    on = {"require_signature": True, "signature_public_key": keys["ci"][1]}
    m = unique("sigdir")
    files = files_of(m, add=1.0)
    put(env, f"{m}/manifest.json.sig", sign_files(m, files, keys["ci"][0]))
    for path, data in files.items():
        upload(env.moto, env.bucket, f"{m}/{path}", data, digest=None)
    upload(env.moto, env.bucket, f"{m}/manifest.json", manifest_of(files))
    assert env.sync(**on).outcomes[m].in_sync
    assert env.infer(m) == 2.0
    served_dir = env.link(m)

    # A new model.py and a manifest that lists it, under the old signature: refused from the manifest alone.
    evil = {**files, "1/model.py": b"import os\nos.system('id')\n"}
    upload(env.moto, env.bucket, f"{m}/1/model.py", evil["1/model.py"], digest=None)
    manifest = manifest_of(evil)
    upload(env.moto, env.bucket, f"{m}/manifest.json", manifest)
    outcome = env.sync(**on).outcomes[m]
    assert "manifest.json does not match its signature: 1 file(s) differ from the signature: 1/model.py" in (
        outcome.reason
    )
    attempt = env.attempts(m)[-1]
    assert attempt["result"] == "signature_refused"
    assert attempt["SyncBytesDownloaded"] == len(manifest)  # no file was fetched
    assert env.link(m) == served_dir
    assert env.infer(m) == 2.0


def test_the_daemon_refuses_an_unsigned_model_with_one_json_line_and_serves_the_signed_one(env, keys) -> None:
    """``python -m modelsync --once`` configured as the task definition does (variables), on the same Triton."""
    signed, unsigned = unique("sigok"), unique("signo")
    good = model_files(signed)
    publish_zip(env, signed, good, sign_files(signed, inside(good, signed), keys["ci"][0]))
    publish_zip(env, unsigned, model_files(unsigned), None)
    where = ["--repository", str(env.repository), "--store", str(env.store), "--triton-url", env.triton.url]
    out = ["--output", f"file:{env.emf}", "--min-free-bytes", "0"]
    proc = subprocess.run(
        [sys.executable, "-m", "modelsync", "--once", "--bucket", env.bucket, *where, *out],
        cwd=ROOT,
        env={
            **env.moto.env(),
            "MODELSYNC_REQUIRE_SIGNATURE": "true",
            "MODELSYNC_SIGNATURE_PUBLIC_KEY": keys["ci"][1].replace("\n", "\\n"),  # one line, as in a task definition
        },
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    refusals = [rec for rec in lines if rec.get("result") == "signature_refused"]
    assert len(refusals) == 1, lines
    assert refusals[0]["model"] == unsigned and "no signature" in json.dumps(refusals[0])
    assert env.infer(signed) == 2.0
    assert not os.path.lexists(env.repository / unsigned)
