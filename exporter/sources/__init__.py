"""Sources: one module per thing we scrape, behind one small interface.

A source's ``collect`` either returns what it read or raises
:class:`SourceError` with a one-line reason. The pipeline times each call
and turns the outcome into the ``SourceUp``/``SourceDuration`` metrics; one
failing source never stops the others (node_exporter's pattern).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from ..series import Exposition


class SourceError(Exception):
    """A source could not deliver this cycle. The message is one line, safe to log."""


class SourceRequired(Exception):
    """A source the settings make mandatory (``--nvml on``) cannot start, so the sidecar must not run.

    Raised while the sources are built; ``exporter.__main__`` turns it into
    one line on stderr and exit code 2. The message names the cause.
    """


@dataclass
class VersionState:
    """One row of Triton's repository index."""

    model: str
    version: str
    state: str
    reason: str = ""

    @property
    def unloaded_on_purpose(self) -> bool:
        # Triton reports a version unloaded through the API as UNAVAILABLE/"unloaded";
        # a model never asked to load (explicit mode) has no state at all.
        return self.state == "" or (self.state == "UNAVAILABLE" and self.reason == "unloaded")


@dataclass
class GpuInfo:
    """What a source knows about one GPU besides its series: the ``gpu`` dimension and properties."""

    uuid: str
    index: int | None = None
    properties: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What the exporter reads from one model version's configuration (``GET /v2/models/{m}/versions/{v}/config``).

    ``decoupled`` is the model's own ``model_transaction_policy.decoupled``
    (an ensemble declares its own). ``parameters`` are the string values of
    the config's ``parameters`` map (``REPORT_CUSTOM_METRICS`` of the vLLM
    backend). ``llm_api``: the model is TensorRT-LLM's LLM-API (PyTorch)
    backend, which publishes no metric family of its own.
    """

    decoupled: bool
    backend: str = ""
    platform: str = ""
    response_cache: bool = False
    parameters: tuple[tuple[str, str], ...] = ()
    llm_api: bool = False

    def parameter(self, key: str) -> str | None:
        return dict(self.parameters).get(key)


@dataclass
class Collected:
    samples: Exposition = field(default_factory=Exposition)
    index: list[VersionState] | None = None
    gpus: dict[str, GpuInfo] = field(default_factory=dict)
    properties: dict[str, object] = field(default_factory=dict)
    models: dict[str, dict[str, object]] = field(default_factory=dict)  # entity key -> properties of that model
    configs: dict[str, ModelConfig] = field(default_factory=dict)  # entity key -> that version's configuration
    server_version: str = ""  # Triton's version (GET /v2), "" while unknown


class SourceKind(StrEnum):
    """What a source is, for the decisions that depend on it (not its name)."""

    TRITON = "triton"  # Triton itself: TritonUp, and --once needs it
    GPU = "gpu"  # GPU telemetry beside Triton's own (NVML): kept to the GPUs Triton reports
    METADATA = "metadata"  # task identity: properties only
    TRACES = "traces"  # the trace relay: phase histograms, the slowest requests, its own counts


class Source(Protocol):
    name: str  # the ``source`` dimension of SourceUp/SourceDuration
    kind: SourceKind

    def collect(self, timeout: float) -> Collected:
        """Read the source within ``timeout`` seconds or raise SourceError."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Narrowable(Protocol):
    """A source that can read fewer of its series: the scrapes between full cycles read only the fast metrics'."""

    def narrowed(self, wanted: Iterable[str], selects: Mapping[str, tuple[str, frozenset[str]]]) -> Source:
        """The same source (its connection shared) keeping only the ``wanted`` samples."""
        ...
