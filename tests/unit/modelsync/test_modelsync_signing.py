"""--require-signature's rules on real OpenSSF model-signing signatures made here with fresh EC keys.

Each rule has a test that fails without it: the signature must verify with the pinned key, its subject must
be the model's own name, its per-file digests must be the bytes installed (computed while extracting), and a
signed version older than the rollout state's stable artifact is refused. Without S3 or Triton: the outcome
tests are tests/integration/modelsync/test_modelsync_signing.py.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from modelsync.archive import Limits, extract, inspect
from modelsync.errors import Result, SignatureRefused
from modelsync.fsio import LocalFileSystem
from modelsync.settings import ConfigError, load
from modelsync.signing import Signatures, Signed, max_signature_bytes, version_of
from modelsync.store import Installed
from tests.support.modelsigning import inside, keypair, sign_files
from tests.support.msync import make_zip, model_files

LIMITS = Limits(max_entries=100, max_bytes=10 * 1024 * 1024, max_ratio=50)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    where = tmp_path_factory.mktemp("keys")
    return {"ci": keypair(where, "ci"), "other": keypair(where, "other")}


def add_files(add: float = 1.0, version: str = "1") -> dict[str, bytes]:
    return inside(model_files("add", add=add, version=version), "add")


def digests(files: dict[str, bytes]) -> dict[str, str]:
    return {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}


def verifier(keys: dict[str, tuple[Path, str]], ledger: Any = None) -> Signatures:
    return Signatures(keys["ci"][1], LIMITS, ledger)


# --- the signature itself -----------------------------------------------------------------------------


def test_a_signature_of_the_model_verifies_and_says_what_was_signed(keys) -> None:
    files = add_files()
    signed = verifier(keys).verify(sign_files("add", files, keys["ci"][0]), "add", "add.zip.sig")
    assert signed.subject == "add"
    assert signed.files == digests(files)  # the paths inside the model directory, as zip and manifest name them
    assert signed.version == 1


def test_the_subject_must_be_the_models_own_name(keys) -> None:
    """The signature covers contents, not keys: add's signature over a copy under "sub" verifies by itself."""
    sig = sign_files("add", add_files(), keys["ci"][0])
    with pytest.raises(SignatureRefused, match=r"signed for model 'add', not 'sub'"):
        verifier(keys).verify(sig, "sub", "sub.zip.sig")


def test_a_signature_by_another_key_is_refused(keys) -> None:
    sig = sign_files("add", add_files(), keys["other"][0])
    with pytest.raises(SignatureRefused, match="signed by another key") as info:
        verifier(keys).verify(sig, "add")
    assert info.value.result == Result.SIGNATURE_REFUSED and not info.value.transient


def test_another_key_without_its_hint_still_fails_the_cryptography(keys) -> None:
    """The key hint is only a hint: without it the ECDSA check itself refuses a foreign signature."""
    doc = json.loads(sign_files("add", add_files(), keys["other"][0]))
    del doc["verificationMaterial"]["publicKey"]["hint"]
    with pytest.raises(SignatureRefused, match="does not verify with the pinned"):
        verifier(keys).verify(json.dumps(doc).encode(), "add")


def test_an_altered_statement_is_refused(keys) -> None:
    """Rewriting the signed statement (here: its subject, to pass the name check) breaks the signature."""
    doc = json.loads(sign_files("add", add_files(), keys["ci"][0]))
    envelope = doc["dsseEnvelope"]
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["subject"][0]["name"] = "sub"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    with pytest.raises(SignatureRefused, match="does not verify with the pinned"):
        verifier(keys).verify(json.dumps(doc).encode(), "sub")


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"not json", "not a model-signing signature"),
        (b"{}", "not a model-signing signature"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 16"),
        (json.dumps({"x": list(range(5000))}).encode(), "more than 1000 JSON values"),
    ],
)
def test_what_is_not_a_signature_is_refused_before_it_is_parsed(keys, data: bytes, reason: str) -> None:
    with pytest.raises(SignatureRefused, match=reason):
        verifier(keys).verify(data, "add")


def test_a_signature_is_bounded_by_size_before_it_is_read(keys) -> None:
    most = max_signature_bytes(LIMITS)

    reads: list[int] = []

    class Body:
        def read(self, n: int) -> bytes:
            reads.append(n)
            return b"x" * n

        def close(self) -> None:
            pass

    client = SimpleNamespace(get_object=lambda **kw: {"Body": Body(), "ContentLength": most + 1, "ETag": '"e"'})
    s3 = SimpleNamespace(client=client, bucket="b")
    archive = SimpleNamespace(key="add.zip")
    with pytest.raises(SignatureRefused, match=f"more than the {most}"):
        verifier(keys).fetch(s3, archive, "add")  # type: ignore[arg-type]
    assert reads == []  # refused from its length: no byte read


def test_a_missing_signature_is_refused_and_says_where_it_belongs(keys) -> None:
    class NoSuchKey(Exception):
        response: ClassVar[dict[str, Any]] = {"Error": {"Code": "NoSuchKey"}}

    def get_object(**kw: str) -> dict[str, Any]:
        raise NoSuchKey()

    s3 = SimpleNamespace(client=SimpleNamespace(get_object=get_object), bucket="b")
    with pytest.raises(SignatureRefused, match=r"no signature: s3://b/m/add.zip.sig does not exist"):
        verifier(keys).fetch(s3, SimpleNamespace(key="m/add.zip"), "add")  # type: ignore[arg-type]


# --- the signed digests against the bytes installed ------------------------------------------------------


def test_extraction_computes_each_files_digest_as_it_writes_it(tmp_path: Path) -> None:
    files = model_files("add")
    zf = zipfile.ZipFile(io.BytesIO(make_zip(files)))
    plan = inspect(zf, 10_000, "add", LIMITS)
    dest = tmp_path / "add"
    dest.mkdir()
    got: dict[str, str] = {}
    extract(zf, plan, dest, LocalFileSystem(), digests=got)
    assert got == digests(inside(files, "add"))


def test_a_tampered_file_an_extra_one_or_a_missing_one_is_refused(keys) -> None:
    files = add_files()
    signed = verifier(keys).verify(sign_files("add", files, keys["ci"][0]), "add", "add.zip.sig")
    Signatures.compare(signed, digests(files), "add.zip")  # the same bytes: nothing to say
    tampered = digests({**files, "1/model.py": b"import os; os.system('id')\n"})
    with pytest.raises(SignatureRefused, match=r"add.zip does not match its signature: 1 file\(s\) differ.*1/model.py"):
        Signatures.compare(signed, tampered, "add.zip")
    with pytest.raises(SignatureRefused, match=r"1 file\(s\) not signed: 1/extra.py"):
        Signatures.compare(signed, digests({**files, "1/extra.py": b"x"}), "add.zip")
    with pytest.raises(SignatureRefused, match=r"1 signed file\(s\) missing: config.pbtxt"):
        Signatures.compare(signed, digests({"1/model.py": files["1/model.py"]}), "add.zip")


# --- the signed version against the rollout state ---------------------------------------------------


def stable_on_host(tmp_path: Path, sha: str, versions: list[str]) -> Installed:
    path = tmp_path / "store" / "add" / sha
    for v in versions:
        (path / v).mkdir(parents=True)
    return Installed("add", sha, path, {})


class Ledger:
    def __init__(self, stable_sha: str | None) -> None:
        self.stable_sha = stable_sha

    def read(self, model: str) -> tuple[Any, str]:
        stable = SimpleNamespace(sha256=self.stable_sha) if self.stable_sha else None
        return SimpleNamespace(stable=stable), '"etag"'


def signed_version(version: int | None) -> Signed:
    return Signed("add", {}, version, "add.zip.sig", "")


def test_an_older_signed_version_than_the_states_stable_one_is_refused(keys, tmp_path: Path) -> None:
    stable = stable_on_host(tmp_path, "a" * 64, ["1", "3"])
    check = verifier(keys, Ledger("a" * 64)).check_version
    with pytest.raises(SignatureRefused, match=r"signed version 2 of add is older than version 3 of the stable"):
        check(signed_version(2), "add", "b" * 64, [stable, None])
    check(signed_version(3), "add", "b" * 64, [stable, None])  # the same version: a new build of it
    check(signed_version(4), "add", "b" * 64, [stable, None])
    check(signed_version(1), "add", "a" * 64, [stable, None])  # the stable artifact itself: a rollback
    verifier(keys, Ledger(None)).check_version(signed_version(1), "add", "b" * 64, [stable])  # no stable yet
    verifier(keys, None).check_version(signed_version(1), "add", "b" * 64, [stable])  # rollouts off: no state


def test_the_version_is_the_highest_numeric_directory_signed() -> None:
    assert version_of(["config.pbtxt", "1/model.py", "12/model.plan", "2/x"]) == 12
    assert version_of(["config.pbtxt"]) is None


# --- settings, and what it costs when off -------------------------------------------------------------


def test_settings_require_a_key_with_the_switch_and_the_switch_with_a_key(keys, tmp_path: Path) -> None:
    pem = keys["ci"][1]
    with pytest.raises(ConfigError, match="needs --signature-public-key"):
        load(["--bucket", "models", "--require-signature"], {})
    with pytest.raises(ConfigError, match="but --require-signature is not"):
        load(["--bucket", "models"], {"MODELSYNC_SIGNATURE_PUBLIC_KEY": pem})
    env = {"MODELSYNC_REQUIRE_SIGNATURE": "true", "MODELSYNC_SIGNATURE_PUBLIC_KEY": pem}
    as_text = load(["--bucket", "models"], env)
    escaped = pem.replace("\n", "\\n")  # a task definition's one-line value
    (tmp_path / "pub.pem").write_text(pem)
    for value in (escaped, str(tmp_path / "pub.pem")):
        other = load(["--bucket", "models", "--require-signature", "--signature-public-key", value], {})
        assert other.signature_public_key == as_text.signature_public_key
    with pytest.raises(ConfigError, match="not a PEM public key"):
        load(["--bucket", "models", "--require-signature", "--signature-public-key", str(keys["ci"][0])], {})
    with pytest.raises(ConfigError, match="absolute path"):
        load(["--bucket", "models", "--require-signature", "--signature-public-key", "pub.pem"], {})


def test_model_signing_is_imported_only_when_signatures_are_required(keys, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from modelsync.models import Models\n"
        "from modelsync.settings import Settings\n"
        "from modelsync.archive import Limits\n"
        "from types import SimpleNamespace as N\n"
        "for on in (False, True):\n"
        f"    s = Settings(bucket='b', require_signature=on, signature_public_key={keys['ci'][1]!r} if on else '')\n"
        "    m = Models(s, N(client=None, bucket='b', prefix=''), None, None, None, None, Limits(1, 1, 1))\n"
        "    print(on, m.signatures is not None, 'model_signing' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[:2] == ["False False False", "True True True"], out.stderr
