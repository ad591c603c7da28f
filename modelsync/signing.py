"""Optional provenance (``--require-signature``): an OpenSSF model-signing signature, checked before install.

The signature is ``<key>.sig`` beside the artifact (``<prefix><model>.zip.sig``,
``<prefix><model>/manifest.json.sig``), as ``python -m model_signing sign key`` writes it: a Sigstore bundle
holding a DSSE envelope over an in-toto statement whose subject is the signed directory's name and whose
predicate lists every signed file with its sha256. It is verified with the EC public key pinned in the
settings (no network: no transparency log, no certificate), and then, before anything is installed:

- **the subject must be the model's own name**: the signature covers file contents, not the key they sit
  under, so one model's archive and ``.sig`` copied under another model's key verify by themselves;
  ``model_signing`` takes the subject from the name of the directory it signs (``models/resnet`` ->
  ``resnet``), which is what a CI job signs anyway;
- **the signed version may not be older than the rollout state's stable artifact**: the statement carries
  no version and no time, so the version compared is the model's own Triton version, the highest numeric
  top-level directory among the signed files (``3/model.plan`` -> 3), against the version directories of
  the stable artifact's store directory on this host (with ``--canary-fraction``; without a state there is
  no fleet record of what is newest, and a rollback on purpose is a re-upload of an older archive);
- **the signed per-file digests must be the installed files' digests**: compared with the digests computed
  while the bytes arrive (extraction of a zip hashes each entry as it is written; a directory model's files
  are each hashed by their download and checked against its manifest), never by reading the files again.

Refusals are :class:`~modelsync.errors.SignatureRefused` (``signature_refused``), logged and counted by the
reconcile like any failed attempt; nothing is installed and the host keeps serving what it serves.

``model_signing`` (and ``cryptography``, its verifier's) is imported only when the daemon requires
signatures: it costs about 0.45 s of import and 95 MB in the image (docs/modelsync.md "Signed models"). Its
public API (``verifying.Config().verify``) hashes the model directory itself, a second read of every file;
this module uses the package's own EC-key verifier and statement parser instead (its ``_signing`` modules,
pinned to 1.1.x in pyproject.toml) and compares the signed manifest with the digests it already has.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .archive import Limits
from .errors import DownloadError, SignatureRefused
from .manifest import TOKEN
from .s3 import S3, Archive
from .settings import Settings
from .store import Installed

SUFFIX = ".sig"
SIGNATURE_BYTES_BASE = 64 * 1024
SIGNATURE_BYTES_PER_ENTRY = 1536  # one signed file: its path, algorithm and hex digest, base64'd in the envelope
_VERSION = re.compile(r"^[0-9]+$")
BUNDLE_VALUES, BUNDLE_DEPTH = 1000, 16
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def max_signature_bytes(limits: Limits) -> int:
    """The largest ``.sig`` read: enough for ``--max-entries`` signed files; refused by size before parsing."""
    return limits.max_entries * SIGNATURE_BYTES_PER_ENTRY + SIGNATURE_BYTES_BASE


def signature_key(archive_key: str) -> str:
    return archive_key + SUFFIX


@dataclass(frozen=True)
class Signed:
    """What a verified signature says: the subject, every signed file's sha256, the model's version."""

    subject: str
    files: dict[str, str]  # path inside the model directory (POSIX) -> sha256 hex
    version: int | None  # the highest numeric top-level directory of the signed files
    key: str  # the .sig's S3 key
    etag: str


def version_of(paths: list[str]) -> int | None:
    """A model's Triton version: its highest numeric top-level directory (``3/model.plan`` -> 3)."""
    found = [int(p.split("/", 1)[0]) for p in paths if "/" in p and _VERSION.fullmatch(p.split("/", 1)[0])]
    return max(found) if found else None


def installed_version(installed: Installed) -> int | None:
    """The version directories of an installed store directory, read from the directory itself (no file read)."""
    try:
        names = [e.name for e in os.scandir(installed.path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return None
    found = [int(n) for n in names if _VERSION.fullmatch(n)]
    return max(found) if found else None


def from_settings(settings: Settings, s3: S3, limits: Limits) -> Signatures | None:
    """The daemon's verifier with ``--require-signature``, else None (and model_signing is never imported)."""
    if not settings.require_signature:
        return None
    ledger = None
    if settings.rollouts_on:  # rollouts: the state's stable artifact bounds the signed version
        from .ledger import Ledger

        ledger = Ledger(s3.client, s3.bucket, s3.prefix)
    return Signatures(settings.signature_public_key, limits, ledger)


class Signatures:
    """The verifier a daemon builds once when ``--require-signature`` is on (the public key from settings)."""

    def __init__(self, public_key_pem: str, limits: Limits, ledger: Any = None) -> None:
        # Imported here, not at the module's top: only a daemon that requires signatures pays for the package.
        # model_signing imports OpenSSL (pyOpenSSL, which it does not declare) from its package's __init__:
        # imported first, so that its absence says so rather than failing inside model_signing.
        try:
            import OpenSSL  # noqa: F401
        except ImportError:  # pragma: no cover - pyproject.toml declares it
            raise RuntimeError("--require-signature needs pyOpenSSL (model-signing imports it)") from None
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from model_signing._signing import sign_ec_key

        key = serialization.load_pem_public_key(public_key_pem.encode("ascii"))
        if not isinstance(key, ec.EllipticCurvePublicKey):  # load_public_key checked it at start
            raise ValueError("--signature-public-key: not an elliptic-curve key")
        pinned: ec.EllipticCurvePublicKey = key

        class _KeyVerifier(sign_ec_key.Verifier):
            """model_signing's EC-key verifier, given the key itself rather than a path to it."""

            def __init__(self) -> None:
                self._public_key = pinned
                sign_ec_key._check_supported_ec_key(pinned)

        self._verifier = _KeyVerifier()
        self.limits = limits
        self.ledger = ledger  # modelsync.ledger.Ledger with --canary-fraction: the state's stable artifact

    # --- fetch and verify the .sig -----------------------------------------------------------------------

    def fetch(self, s3: S3, archive: Archive, model: str) -> Signed:
        """Read ``<key>.sig`` (bounded), verify it with the pinned key, check its subject is ``model``."""
        key = signature_key(archive.key)
        most = max_signature_bytes(self.limits)
        try:
            resp = s3.client.get_object(Bucket=s3.bucket, Key=key)
        except Exception as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                raise SignatureRefused(
                    f"no signature: s3://{s3.bucket}/{key} does not exist (--require-signature; upload the "
                    "model's .sig first, then the model)"
                ) from None
            raise DownloadError(f"GET s3://{s3.bucket}/{key}: {code or type(exc).__name__}: {exc}") from exc
        body = resp["Body"]
        try:
            if int(resp.get("ContentLength") or 0) > most:
                raise SignatureRefused(
                    f"s3://{s3.bucket}/{key} is {resp['ContentLength']} bytes, more than the {most} a signature "
                    f"of {self.limits.max_entries} files takes (--max-entries)"
                )
            data = body.read(most + 1)
        except SignatureRefused:
            raise
        except Exception as exc:
            raise DownloadError(f"GET s3://{s3.bucket}/{key}: {type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                body.close()
        if len(data) > most:
            raise SignatureRefused(f"s3://{s3.bucket}/{key} is more than {most} bytes (--max-entries)")
        return self.verify(data, model, key, str(resp.get("ETag") or ""))

    def verify(self, data: bytes, model: str, key: str = "model.sig", etag: str = "") -> Signed:
        """Verify the bytes of a ``.sig`` and read its statement; SignatureRefused naming the reason."""
        from model_signing._signing import sign_sigstore_pb

        where = f"{key}:"
        try:
            _bounded(data)
            doc = json.loads(data)
            signature = _read_bundle(sign_sigstore_pb, doc)
        except Exception as exc:  # json, pydantic's ValidationError, KeyError/TypeError on a wrong shape
            raise SignatureRefused(f"{where} not a model-signing signature: {_short(exc)}") from None
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints a warning for bundles without a key hint
                manifest = self._verifier.verify(signature)
        except Exception as exc:  # cryptography's InvalidSignature, ValueError (key mismatch, payload checks)
            text = _short(exc)
            if "Key mismatch" in text:
                reason = "signed by another key than the pinned --signature-public-key"
            elif type(exc).__name__ == "InvalidSignature":
                reason = "the signature does not verify with the pinned --signature-public-key (altered or forged)"
            else:
                reason = f"the signature does not verify: {text}"
            raise SignatureRefused(f"{where} {reason}") from None
        if manifest.model_name != model:
            raise SignatureRefused(
                f"{where} signed for model {manifest.model_name!r}, not {model!r}: a signature binds the name of "
                f"the directory signed (sign models/{model}/), and another model's signature is refused"
            )
        serialization = manifest.serialization_type
        if serialization.get("method") != "files" or serialization.get("hash_type") != "sha256":
            raise SignatureRefused(
                f"{where} signed with {serialization.get('method')}/{serialization.get('hash_type')}; only whole-file "
                "sha256 digests are compared (model_signing's default: sign without --use_shards or another hash)"
            )
        files: dict[str, str] = {}
        for rd in manifest.resource_descriptors():
            digest = rd.digest
            if digest.algorithm != "sha256" or not _HEX64.fullmatch(digest.digest_hex):
                raise SignatureRefused(f"{where} {rd.identifier!r} signed with {digest.algorithm}, not sha256")
            files[str(rd.identifier)] = digest.digest_hex
        return Signed(model, files, version_of(list(files)), key, etag)

    # --- the rules that need more than the signature -------------------------------------------------

    def check_version(self, signed: Signed, model: str, expected: str, on_host: list[Installed | None]) -> None:
        """Refuse a signed version older than the one of the rollout state's stable artifact (with rollouts).

        ``expected``: the sha256 being installed (the stable artifact itself is never refused: a rollback);
        ``on_host``: this host's store directories (served, previous), where the stable one's version is read."""
        if self.ledger is None:
            return
        state, _ = self.ledger.read(model)  # LedgerError is a DownloadError: retried, nothing installed
        stable = getattr(state, "stable", None)
        if stable is None or stable.sha256 == expected or signed.version is None:
            return
        have = next((i for i in on_host if i is not None and i.sha256 == stable.sha256), None)
        recorded = installed_version(have) if have is not None else None
        if recorded is not None and signed.version < recorded:
            raise SignatureRefused(
                f"{signed.key}: signed version {signed.version} of {model} is older than version {recorded} of the "
                f"stable artifact {stable.sha256[:12]} recorded in the rollout state (a replayed old signature?)"
            )

    @staticmethod
    def compare(signed: Signed, computed: Mapping[str, str], what: str) -> None:
        """The signed digests against the ones computed while the bytes arrived: the same paths, the same
        sha256 each; SignatureRefused naming the first differences."""
        extra = sorted(set(computed) - set(signed.files))
        missing = sorted(set(signed.files) - set(computed))
        differ = sorted(p for p in set(computed) & set(signed.files) if computed[p] != signed.files[p])
        if not (extra or missing or differ):
            return
        parts = []
        if differ:
            p = differ[0]
            parts.append(
                f"{len(differ)} file(s) differ from the signature: {p} is sha256 {computed[p][:12]}…, "
                f"signed {signed.files[p][:12]}…"
            )
        if extra:
            parts.append(f"{len(extra)} file(s) not signed: {', '.join(extra[:3])}")
        if missing:
            parts.append(f"{len(missing)} signed file(s) missing: {', '.join(missing[:3])}")
        raise SignatureRefused(f"{signed.key}: {what} does not match its signature: {'; '.join(parts)}")


def _read_bundle(sign_sigstore_pb: Any, doc: Any) -> Any:
    """model_signing's ``Signature.read`` on an already read document (it takes a path; ours is in memory)."""
    material = doc["verificationMaterial"]
    material.setdefault("tlogEntries", [])
    if "publicKey" in material:
        material["publicKey"].setdefault("hint", None)
        for k in ("rawBytes", "keyDetails"):
            material["publicKey"].pop(k, None)
    return sign_sigstore_pb.Signature(sign_sigstore_pb.bundle_pb.Bundle.from_dict(doc))


def _bounded(data: bytes) -> None:
    """Refuse, before json.loads builds anything, a bundle with more JSON values or nesting than one holds (a
    bundle is some twenty values: the signed statement is one base64 string in it, parsed only once verified)."""
    text = data.decode("utf-8")
    depth = values = 0
    for m in TOKEN.finditer(text):
        first = text[m.start()]
        if first in "]}":
            depth -= 1
            continue
        values += 1
        if values > BUNDLE_VALUES:
            raise ValueError(f"more than {BUNDLE_VALUES} JSON values (a bundle holds some twenty)")
        if first in "[{":
            depth += 1
            if depth > BUNDLE_DEPTH:
                raise ValueError(f"nested deeper than {BUNDLE_DEPTH}")


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]
