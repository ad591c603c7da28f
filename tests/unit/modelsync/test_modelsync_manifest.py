"""Directory-model manifests without S3 or Triton: the checks of modelsync/manifest.py, the keys that name a
model (archive or manifest), and ``python -m modelsync.manifest`` that writes one for a local directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelsync.archive import Limits
from modelsync.errors import UnsafeArchive
from modelsync.events import EventFilter, ObjectEvent
from modelsync.manifest import main, parse
from modelsync.s3 import model_of
from tests.support.paths import REPO

LIMITS = Limits(max_entries=10, max_bytes=1000, max_ratio=100)
H = "a" * 64


def doc(*entries: dict[str, object]) -> bytes:
    base = [{"path": "config.pbtxt", "size": 10, "sha256": H}, {"path": "1/model.py", "size": 10, "sha256": H}]
    return json.dumps({"files": [*base, *entries]}).encode()


def test_a_valid_manifest_is_planned() -> None:
    m = parse(doc({"path": "1/sub//./w.bin", "size": 5, "sha256": "B" * 64}), LIMITS)
    assert [f.path.as_posix() for f in m.files] == ["config.pbtxt", "1/model.py", "1/sub/w.bin"]
    assert [d.as_posix() for d in m.dirs] == ["1", "1/sub"] and m.total_bytes == 25
    assert m.files[-1].sha256 == "b" * 64  # hex compared lower-case


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (doc()[:-7], "not valid JSON (truncated?)"),
        (b"[]", 'an object with a "files" list'),
        (doc({"path": "../escaped", "size": 1, "sha256": H}), "'..' in the path"),
        (doc({"path": "1/../../escaped", "size": 1, "sha256": H}), "'..' in the path"),
        (doc({"path": "/etc/passwd", "size": 1, "sha256": H}), "absolute path"),
        (doc({"path": "C:/x", "size": 1, "sha256": H}), "absolute path"),
        (doc({"path": "1\\x", "size": 1, "sha256": H}), "backslash"),
        (doc({"path": "1/x\x00", "size": 1, "sha256": H}), "NUL"),
        (doc({"path": "./", "size": 1, "sha256": H}), "empty path"),
        (doc({"path": 7, "size": 1, "sha256": H}), "'path' must be a string"),
        (doc({"path": "1/model.py", "size": 10, "sha256": H}), "appears twice"),
        (doc({"path": "1/./model.py", "size": 10, "sha256": H}), "appears twice"),
        (doc({"path": "1/passwd", "type": "symlink", "size": 1, "sha256": H}), "only regular files"),
        (doc({"path": "1/dev", "type": "char", "size": 0, "sha256": H}), "only regular files"),
        (doc({"path": "1/l", "target": "/etc/passwd", "size": 1, "sha256": H}), "unknown fields 'target'"),
        (doc({"path": "1/model.py/x", "size": 1, "sha256": H}), "is a file and also a directory"),
        (doc({"path": "1/w", "size": -1, "sha256": H}), "non-negative integer"),
        (doc({"path": "1/w", "size": True, "sha256": H}), "non-negative integer"),
        (doc({"path": "1/w", "size": 1, "sha256": "zz"}), "64 hex digits"),
        (doc({"path": "manifest.json", "size": 1, "sha256": H}), "cannot list itself"),
        (doc({"path": "weights/w", "size": 1, "sha256": H}), "numeric versions, found weights"),
        (doc({"path": "1/w", "size": 990, "sha256": H}), "more than 1000 bytes"),
        (doc(*({"path": f"1/{i}", "size": 1, "sha256": H} for i in range(9))), "more than the limit of 10"),
        (json.dumps({"files": [{"path": "1/model.py", "size": 1, "sha256": H}]}).encode(), "no config.pbtxt"),
        (json.dumps({"files": [{"path": "config.pbtxt", "size": 1, "sha256": H}]}).encode(), "no file in a numeric"),
    ],
)
def test_unsafe_manifests_are_refused(data: bytes, needle: str) -> None:
    with pytest.raises(UnsafeArchive) as exc:
        parse(data, LIMITS)
    assert needle in str(exc.value)


def test_keys_that_name_a_model() -> None:
    assert model_of("p/add.zip", "p/") == "add"
    assert model_of("p/add/manifest.json", "p/") == "add"
    for other in ("p/add/1/model.py", "p/add/config.pbtxt", "p/a/b/manifest.json", "p//manifest.json", "p/x.txt"):
        assert model_of(other, "p/") is None, other
    filt = EventFilter("b", "p/")
    assert filt.accept(ObjectEvent("b", "p/add/manifest.json", False, "01")) == "add"
    assert filt.accept(ObjectEvent("b", "p/add/1/model.py", False, "02")) is None  # a file of the model: no event


def write_model(root: Path) -> Path:
    model = root / "add"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "add"\n')
    (model / "1" / "model.py").write_bytes(b"print('hi')\n")
    (model / "1" / "weights.bin").write_bytes(os.urandom(3000))
    return model


def test_manifest_command_prints_what_the_daemon_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import hashlib

    model = write_model(tmp_path)
    assert main([str(model)]) == 0
    out = json.loads(capsys.readouterr().out)
    files = {f["path"]: f for f in out["files"]}
    assert sorted(files) == ["1/model.py", "1/weights.bin", "config.pbtxt"]
    data = (model / "1" / "weights.bin").read_bytes()
    assert files["1/weights.bin"] == {"path": "1/weights.bin", "size": 3000, "sha256": hashlib.sha256(data).hexdigest()}
    assert len(parse(json.dumps(out).encode(), Limits(10, 10_000, 100)).files) == 3
    # As users run it: a module of the package, output to a file beside the model.
    done = subprocess.run(
        [sys.executable, "-m", "modelsync.manifest", str(model)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert json.loads(done.stdout) == out


def test_manifest_command_refuses_links(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_model(tmp_path)
    (model / "1" / "passwd").symlink_to("/etc/passwd")
    assert main([str(model)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a regular file" in err
    assert main([]) == 2 and "usage" in capsys.readouterr().err
