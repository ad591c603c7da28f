"""The install protocol: what the reconcile asks of every kind of artifact, so it has one path for all.

Three kinds, two implementations:

- a model from a zip (``<prefix><model>.zip``, zipmodel.py) or from a directory with a manifest
  (``<prefix><model>/manifest.json``, dirmodel.py): :class:`modelsync.models.Models`, one repository link
  per model, the two differing only in how the store directory is fetched;
- a bundle (one zip of several models switched together): :class:`modelsync.bundle.Bundles`.

Each answers the same five questions under one name (a model's, or a bundle's): what is served
(:meth:`Installer.current`), install this object (:meth:`Installer.install`), is it served by Triton
(:meth:`Installer.ready`), load it again (:meth:`Installer.ensure_loaded`), and remove it
(:meth:`Installer.remove`). Everything else (the memo of failed archives, Triton being down, the first
sync, the metrics, the rollouts) is the reconcile's, written once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .metrics import Attempt
from .s3 import Archive

ExpectedHash = Callable[[Archive], tuple[str, str]]  # the object -> (sha256 it must have or "", where from)


@dataclass(frozen=True)
class Served:
    """What this repository serves under one name: the artifact (sha256) and the S3 object it came from."""

    name: str
    sha256: str
    etag: str
    version_id: str
    key: str


class Installer(Protocol):
    """One kind of artifact. Every method raises only :class:`modelsync.errors.SyncError` for what it could
    not do; the reconcile turns that into an outcome."""

    #: the log line of a removal (--delete-removed), with %s for the name
    removal: str

    def current(self, name: str) -> Served | None:
        """What is installed under ``name``, None when nothing of this kind is."""
        ...

    def install(self, name: str, archive: Archive, attempt: Attempt, expected_hash: ExpectedHash, load: bool) -> bool:
        """Download, verify, extract and switch to ``archive`` (and load it when ``load``). False when the
        object is new but its content is what is installed: only its record changed. A failed load leaves
        the previous artifact serving (RolledBack) or nothing (LoadFailed)."""
        ...

    def ready(self, served: Served) -> bool:
        """Triton serves what is installed; raises when Triton cannot be asked."""
        ...

    def ensure_loaded(self, served: Served) -> None:
        """Load what is installed (after a Triton restart, a failed load, an unload by hand)."""
        ...

    def remove(self, name: str) -> None:
        """Unload and delete; raises when Triton refuses the unload (nothing is deleted then)."""
        ...
