"""Real OpenSSF model-signing signatures made at test time (modelsync --require-signature's tests).

A fresh EC key per call of :func:`keypair`, and model_signing's own signer (``python -m model_signing sign key``
in-process): the subject is the signed directory's name, as a CI job's would be.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


def keypair(where: Path, name: str = "signer") -> tuple[Path, str]:
    """(the private key's PEM file, the public key's PEM text) of a new P-256 key."""
    key = ec.generate_private_key(ec.SECP256R1())
    private = where / f"{name}.key.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public.decode()


def sign_files(name: str, files: dict[str, bytes], private_key: Path) -> bytes:
    """The ``.sig`` of a model directory named ``name`` holding ``files`` (paths inside the directory)."""
    from model_signing import signing

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / name
        for path, data in files.items():
            (model / path).parent.mkdir(parents=True, exist_ok=True)
            (model / path).write_bytes(data)
        out = Path(tmp) / "model.sig"
        signing.Config().use_elliptic_key_signer(private_key=private_key).sign(model, out)
        return out.read_bytes()


def inside(files: dict[str, bytes], model: str) -> dict[str, bytes]:
    """``{"add/1/model.py": ...}`` (a zip's entries) -> ``{"1/model.py": ...}`` (the model directory's files)."""
    return {k[len(model) + 1 :]: v for k, v in files.items() if k.startswith(model + "/")}
