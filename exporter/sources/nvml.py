"""GPU telemetry from NVML: what dcgm-exporter shows and Triton's own GPU series do not.

The source reads each GPU through a narrow interface, the handful of
``pynvml`` functions named in :data:`NVML_CALLS`; in production that is the
``pynvml`` module (from ``nvidia-ml-py``), in tests
:class:`tests.support.nvml_fake.FakeNvml` (not shipped), which keeps the same contract.
Series are named ``nvml_*`` in SI units and keyed by ``gpu_uuid``: NVML's UUID
is the ``gpu_uuid`` label of Triton's DCGM series, so the catalog joins both
into one event per GPU (Triton's value first where both exist).

Degrade, never crash:
- NVML missing or failing as a whole: ``collect`` raises SourceError (the
  pipeline reports ``SourceUp{source=nvml}=0`` and logs the reason once);
  initialisation is retried every ``retry_interval`` seconds, not every cycle.
- One field a device does not support is left out for that device (and not
  asked again); one failing field never drops the device. Where NVML has a
  newer and an older entry point for a field, a newer one that answers
  FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH or NOT_SUPPORTED hands over to
  the older one (:meth:`NvmlSource._fallback`).
- A GPU that fell off the bus (NVML_ERROR_GPU_IS_LOST) is emitted as
  ``nvml_gpu_lost=1`` (and ``nvml_gpu_healthy=0``) and nothing else.

Every cycle each GPU gets a health verdict (``nvml_gpu_healthy``, 1 or 0) from
what this source saw: fatal XIDs, the driver's recovery action (field 230), a
lost GPU, a row-remapping failure; the rules and the action taken on a GPU that
turns unhealthy are :mod:`exporter.gpufaults`. On GPUs with GPM (Hopper and
newer) two GPM samples a cycle apart give SM activity, SM occupancy, tensor
activity and DRAM bandwidth utilization; where GPM is missing the GPU's event
says why (property ``gpm``), once logged.

Which GPUs, and the ``gpu`` dimension: see :func:`select` and docs/gpu.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telemetry.logs import get

from ..gpufaults import GpuHealth
from ..gpufaults.verdict import xid_reason
from ..series import EMPTY, Exposition, LabelSet
from . import Collected, GpuInfo, SourceError, SourceKind, SourceRequired

log = get("nvml")

NVML_CALLS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait",
    "nvmlEventSetFree",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlGpmSampleFree",
)
"""Every pynvml function the source calls: the whole interface a fake must provide."""

RETRY_INTERVAL = 300.0
"""Seconds between initialisation attempts while NVML is unavailable."""

MAX_EVENTS_PER_CYCLE = 10_000
"""Bound on XID events drained in one cycle, so an event storm cannot stall the loop."""

# NVML error codes (pynvml.NVML_ERROR_*; numbers are part of NVML's ABI, tests/unit/exporter/test_nvml.py checks them).
NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, DRIVER_NOT_LOADED, TIMEOUT = 3, 4, 6, 9, 10
UNINITIALIZED, LIBRARY_NOT_FOUND, FUNCTION_NOT_FOUND, GPU_IS_LOST, LIB_RM_VERSION_MISMATCH = 1, 12, 13, 15, 18
ARGUMENT_VERSION_MISMATCH = 25
_WHOLE_NVML = {UNINITIALIZED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, LIB_RM_VERSION_MISMATCH}
_PERMANENT = {NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH}
# Answers from a newer entry point that say "not this call" rather than "not this field": the library
# lacks the symbol, or has it but not the structure version pynvml passes, or the driver does not
# serve the versioned call on this device. The older entry point may still work.
_TRY_OLDER = {FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH, NOT_SUPPORTED}
_ABSENT = {LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED}

# Clock event ("throttle") reason bits, grouped as operators act on them.
THERMAL = 0x20 | 0x40  # SwThermalSlowdown | HwThermalSlowdown
POWER_CAP = 0x04  # SwPowerCap
HW_SLOWDOWN = 0x08 | 0x80  # HwSlowdown | HwPowerBrakeSlowdown

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
MEMORY_TEMP_FIELD = 82  # NVML_FI_DEV_MEMORY_TEMP
RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (replaces the deprecated fields 226 and 227)
MEMORY_V2 = 0x02000028  # nvmlMemory_v2
REMAP_FAILURE = "nvml_remapped_rows_failure"
_NONE: dict[str, float] = {}
GPM_METRICS_GET_VERSION = 1  # NVML_GPM_METRICS_GET_VERSION
# NVML_GPM_METRIC_* ids -> series, each 0-100 over the time between two samples (one cycle).
GPM_METRICS = (
    (2, "nvml_sm_active_percent"),  # SM_UTIL: percent of SMs busy
    (3, "nvml_sm_occupancy_percent"),  # SM_OCCUPANCY: active warps, percent of the theoretical maximum
    (5, "nvml_tensor_active_percent"),  # ANY_TENSOR_UTIL: percent of time the SMs ran any tensor operation
    (10, "nvml_dram_active_percent"),  # DRAM_BW_UTIL: DRAM bandwidth, percent of the theoretical maximum
)

_HINTS = {
    LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 is not in this container: on ECS set NVIDIA_VISIBLE_DEVICES on the "
    "exporter container so the NVIDIA runtime mounts the driver (docs/gpu.md)",
    DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded on this host",
    NO_PERMISSION: "no permission to open /dev/nvidiactl or /dev/nvidia*: the container was not given the devices",
    LIB_RM_VERSION_MISMATCH: "libnvidia-ml.so does not match the loaded kernel driver (library from another "
    "driver version baked into the image?)",
}


class NvmlUnavailable(SourceError):
    """NVML as a whole cannot be used (library, driver, permission); ``code`` is the NVML error."""

    def __init__(self, reason: str, code: int | None, retry_interval: float = RETRY_INTERVAL) -> None:
        super().__init__(f"{reason}; retrying every {retry_interval:g}s")
        self.reason = reason
        self.code = code


def _code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


@dataclass
class Gpm:
    """One GPU's GPM state: two sample buffers used in turn, and why GPM is not produced (when it is not)."""

    unsupported: str = ""  # the reason GPM is not produced on this GPU ("" while it may be)
    asked: bool = False  # nvmlGpmQueryDeviceSupport answered
    samples: list[Any] = field(default_factory=list)  # two nvmlGpmSample_t, allocated once
    previous: int = -1  # which of the two holds the last cycle's sample (-1: none yet)
    request: Any = None  # the nvmlGpmMetricsGet_t structure, reused


@dataclass
class Device:
    """One GPU the source reports, with what is known not to work on it."""

    handle: Any
    uuid: str
    nvml_index: int
    labels: LabelSet
    properties: dict[str, object]
    position: int  # the ``gpu`` dimension
    skip: set[str] = field(default_factory=set)  # readers that answered NOT_SUPPORTED
    xid: bool = False  # registered for XID events
    gpm: Gpm = field(default_factory=Gpm)
    recovery_action: int | None = None  # this cycle's field 230 (None: not read)


# --- which GPUs -------------------------------------------------------------------------------------


def _entries(value: str | None) -> list[str] | None:
    """A visible-devices list, or None when the variable does not restrict anything."""
    if value is None:
        return None
    value = value.strip()
    if value.lower() in ("", "all", "void", "none"):
        return None
    return [e.strip() for e in value.split(",") if e.strip()]


def select(
    found: list[tuple[int, str]],
    nvidia_visible: str | None,
    cuda_visible: str | None,
    parent_of: Callable[[str], str | None] = lambda uuid: None,
) -> list[str]:
    """UUIDs to report, in ``gpu`` dimension order, from NVML's (index, uuid) list and the two variables.

    - ``NVIDIA_VISIBLE_DEVICES`` (what the NVIDIA runtime gave this
      container) filters by UUID, or by index when NVML sees the whole host
      (more devices than listed); NVML's order is kept, as nvidia-smi shows it.
      ``all``, ``void``, ``none`` or empty do not filter: what NVML sees is
      what the runtime gave.
    - ``CUDA_VISIBLE_DEVICES`` (what a CUDA process here would use) then
      picks and orders devices as CUDA does: an index into the list so far, a
      UUID or unique UUID prefix, or a MIG UUID (its parent GPU); parsing
      stops at the first entry that matches nothing, as in CUDA. Empty is
      ignored: the exporter does not use CUDA.
    """
    uuids = [u for _, u in found]
    listed = _entries(nvidia_visible)
    if listed:
        heads = {e.split(":")[0] for e in listed}  # "0:1" is MIG instance 1 of GPU 0
        whole_host = len(found) > len(heads)  # the runtime did not restrict: indices are NVML's
        wanted = {parent_of(e) or e for e in heads if not e.isdigit()}
        wanted |= {u for i, u in found if whole_host and str(i) in heads}
        kept = [u for u in uuids if u in wanted]
        if kept:
            uuids = kept
    cuda = _entries(cuda_visible) if cuda_visible and cuda_visible.strip() else None
    if cuda:
        ordered: list[str] = []
        for e in cuda:
            match: str | None = None
            if e.lstrip("-").isdigit():
                i = int(e)
                match = uuids[i] if 0 <= i < len(uuids) else None
            elif e.startswith("MIG-"):
                match = parent_of(e)
            else:
                hits = [u for u in uuids if u.startswith(e)]
                match = hits[0] if len(hits) == 1 else None
            if match is None:
                break
            if match not in ordered:
                ordered.append(match)
        uuids = ordered
    return uuids


def gpu_hints(environ: Mapping[str, str], dev: Path = Path("/dev")) -> bool:
    """Signs that this container was meant to see a GPU: a device node, or a GPU list for the runtime."""
    visible = environ.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower()
    return (dev / "nvidiactl").exists() or visible not in ("", "void", "none")


# --- the source -------------------------------------------------------------------------------------


class NvmlSource:
    """Per-GPU NVML series, initialised once and shut down by :meth:`close`."""

    name = "nvml"
    kind = SourceKind.GPU

    def __init__(
        self,
        api: Any,
        environ: Mapping[str, str] | None = None,
        retry_interval: float = RETRY_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        health: GpuHealth | None = None,
    ) -> None:
        self.api = api
        self.environ = dict(os.environ if environ is None else environ)
        self.retry_interval = retry_interval
        self.clock = clock
        self.health = health or GpuHealth()  # kept across re-initialisation: an unhealthy GPU stays so
        self.devices: list[Device] = []
        self.ready = False
        self.error: NvmlUnavailable | None = None
        self.next_try = 0.0
        self.xid_counts: dict[str, int] = {}  # kept across re-initialisation: the series never goes down
        self.last_xid: dict[str, int] = {}
        self._cycle_xids: dict[str, list[int]] = {}  # uuid -> the XIDs drained this cycle
        self._event_set: Any = None
        self._by_handle: dict[Any, Device] = {}
        self._variant: dict[tuple[str, Any], int] = {}  # (reader, device) -> which entry point works there

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Initialise NVML and discover the GPUs; raises NvmlUnavailable (and schedules the next try)."""
        self.next_try = self.clock() + self.retry_interval
        api = self.api
        if api is None:
            self.error = NvmlUnavailable(
                "NVML: nvidia-ml-py (pynvml) is not installed in this image", LIBRARY_NOT_FOUND, self.retry_interval
            )
            raise self.error
        try:
            api.nvmlInit()
        except api.NVMLError as exc:
            self.error = self._unavailable("cannot initialise", exc)
            raise self.error from None
        try:
            self._discover()
        except api.NVMLError as exc:
            self._stop()
            self.error = self._unavailable("initialised but cannot list GPUs", exc)
            raise self.error from None
        if not self.devices:
            self._stop()
            visible = self.environ.get("NVIDIA_VISIBLE_DEVICES")
            self.error = NvmlUnavailable(
                f"NVML: no GPU visible to this container (NVIDIA_VISIBLE_DEVICES={visible!r})",
                None,
                self.retry_interval,
            )
            raise self.error
        self.ready, self.error = True, None
        log.info(
            "NVML ready: %d GPU(s)",
            len(self.devices),
            extra={
                "fields": {
                    "gpus": [d.uuid for d in self.devices],
                    "driver_version": self.devices[0].properties.get("driver_version"),
                }
            },
        )

    def _unavailable(self, what: str, exc: BaseException) -> NvmlUnavailable:
        code = _code(exc)
        hint = _HINTS.get(code or -1, "")
        return NvmlUnavailable(
            f"NVML {what}: {exc} (NVML error {code}){'; ' + hint if hint else ''}", code, self.retry_interval
        )

    def _discover(self) -> None:
        api = self.api
        driver = api.nvmlSystemGetDriverVersion()
        found: list[tuple[int, str, Any]] = []
        for i in range(api.nvmlDeviceGetCount()):
            try:
                handle = api.nvmlDeviceGetHandleByIndex(i)
                found.append((i, api.nvmlDeviceGetUUID(handle), handle))
            except api.NVMLError as exc:
                if _code(exc) in _WHOLE_NVML:
                    raise
                # NO_PERMISSION: a device of the host this container was not given (nvmlDeviceGetCount_v2
                # counts them). GPU_IS_LOST here leaves no UUID to report it under.
                log.warning("NVML index %d unreadable: %s", i, exc, extra={"fields": {"nvml_error": _code(exc)}})
        chosen = select(
            [(i, u) for i, u, _ in found],
            self.environ.get("NVIDIA_VISIBLE_DEVICES"),
            self.environ.get("CUDA_VISIBLE_DEVICES"),
            self._parent_of,
        )
        handles = {u: (i, h) for i, u, h in found}
        self.devices = []
        for position, uuid in enumerate(chosen):
            i, handle = handles[uuid]
            props: dict[str, object] = {"driver_version": driver, "nvml_index": i}
            props.update(self._identity(handle))
            self.devices.append(Device(handle, uuid, i, LabelSet.of(gpu_uuid=uuid), props, position))
        self._by_handle = {_handle_key(d.handle): d for d in self.devices}
        self._register_events()

    def _parent_of(self, uuid: str) -> str | None:
        """The parent GPU's UUID of a MIG device UUID (None when it is not one NVML knows)."""
        api = self.api
        try:
            handle = api.nvmlDeviceGetHandleByUUID(uuid)
            return str(api.nvmlDeviceGetUUID(api.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)))
        except api.NVMLError:
            return None

    def _identity(self, handle: Any) -> dict[str, object]:
        api = self.api
        props: dict[str, object] = {}
        for key, read in (
            ("gpu_name", lambda: api.nvmlDeviceGetName(handle)),
            ("pci_bus_id", lambda: _text(api.nvmlDeviceGetPciInfo(handle).busId)),
            ("mig_mode", lambda: _mig_mode(api.nvmlDeviceGetMigMode(handle))),
        ):
            try:
                props[key] = read()
            except api.NVMLError as exc:
                if _code(exc) in _WHOLE_NVML:
                    raise
        if props.get("mig_mode") == "enabled":
            props["mig_devices"] = self._mig_count(handle)
        return props

    def _mig_count(self, handle: Any) -> int:
        api = self.api
        count = 0
        try:
            for slot in range(api.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    api.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                    count += 1
                except api.NVMLError as exc:
                    if _code(exc) != NOT_FOUND:
                        raise
        except api.NVMLError as exc:
            if _code(exc) in _WHOLE_NVML:
                raise
        return count

    def _register_events(self) -> None:
        api = self.api
        try:
            self._event_set = api.nvmlEventSetCreate()
        except api.NVMLError as exc:
            if _code(exc) in _WHOLE_NVML:
                raise
            log.warning("NVML event set unavailable, no XID counts: %s", exc)
            self._event_set = None
            return
        for d in self.devices:
            try:
                api.nvmlDeviceRegisterEvents(d.handle, XID_EVENT, self._event_set)
                d.xid = True
                self.xid_counts.setdefault(d.uuid, 0)
            except api.NVMLError as exc:
                if _code(exc) in _WHOLE_NVML:
                    raise
                log.info("GPU %s: XID events not available: %s", d.uuid, exc)

    def _stop(self) -> None:
        api = self.api
        for d in self.devices:  # GPM buffers belong to this NVML session
            for sample in d.gpm.samples:
                with contextlib.suppress(api.NVMLError):
                    api.nvmlGpmSampleFree(sample)
            d.gpm.samples = []
        if self._event_set is not None:
            with contextlib.suppress(api.NVMLError):
                api.nvmlEventSetFree(self._event_set)
            self._event_set = None
        with contextlib.suppress(api.NVMLError):  # already gone with the driver
            api.nvmlShutdown()
        self.ready = False
        self.devices = []
        self._by_handle = {}
        self._variant = {}  # handles are not valid after nvmlShutdown

    def close(self) -> None:
        if self.ready:
            self._stop()
        self.health.action.close()

    # --- one cycle ----------------------------------------------------------------------------

    def collect(self, timeout: float) -> Collected:
        if not self.ready:
            if self.clock() < self.next_try and self.error is not None:
                raise self.error
            self.start()
        try:
            return self._read(self.clock() + timeout)
        except self.api.NVMLError as exc:  # only whole-NVML failures get here
            self._stop()
            self.error = self._unavailable("stopped answering", exc)
            self.next_try = self.clock() + self.retry_interval
            raise self.error from None

    def _read(self, deadline: float) -> Collected:
        self._cycle_xids = {}
        self._drain_events()
        out = Exposition()
        gpus: dict[str, GpuInfo] = {}
        skipped = 0
        for d in self.devices:
            if self.clock() > deadline:
                skipped += 1
                continue
            lost = False
            d.recovery_action = None
            for name, reader in READERS:
                if name in d.skip:
                    continue
                try:
                    for series, value in reader(self, d):
                        out.add(series, d.labels, value)
                except self.api.NVMLError as exc:
                    code = _code(exc)
                    if code == GPU_IS_LOST:
                        lost = True
                        break
                    if code in _WHOLE_NVML:
                        raise
                    if code in _PERMANENT:
                        d.skip.add(name)
                        if name == "gpm":
                            self._gpm_unsupported(d, code)
                    else:
                        log.debug("GPU %s: %s failed: %s", d.uuid, name, exc)
            out.add("nvml_gpu_lost", d.labels, 1.0 if lost else 0.0)
            if d.xid and not lost:
                out.add("nvml_xid_errors_total", d.labels, float(self.xid_counts.get(d.uuid, 0)))
            fault = self.health.judge(
                d.uuid,
                d.position,
                d.nvml_index,
                xids=self._cycle_xids.get(d.uuid, ()),
                recovery_action=None if lost else d.recovery_action,
                lost=lost,
                remap_failure=out.samples.get(REMAP_FAILURE, _NONE).get(d.labels.key) == 1.0,
            )
            out.add("nvml_gpu_healthy", d.labels, 0.0 if fault else 1.0)
            props = dict(d.properties)
            if d.uuid in self.last_xid:
                props["last_xid"] = self.last_xid[d.uuid]
            props["health"] = f"unhealthy: {fault.reason}" if fault else "healthy"
            if d.gpm.unsupported:
                props["gpm"] = f"not produced: {d.gpm.unsupported}"
            gpus[d.uuid] = GpuInfo(d.uuid, d.position, props)
        self.health.poll()
        for name, value in self.health.action.series():
            out.add(name, EMPTY, value)
        if skipped:
            log.warning("NVML read exceeded the source timeout; %d GPU(s) left out this cycle", skipped)
        return Collected(samples=out, gpus=gpus)

    def _gpm_unsupported(self, d: Device, code: int | None) -> None:
        """GPM will not be produced on this GPU: say why once (the GPU's event carries it every cycle)."""
        if d.gpm.unsupported:
            return
        if code == FUNCTION_NOT_FOUND:
            why = "this driver's NVML has no GPM (an older driver)"
        elif d.gpm.asked and not d.gpm.samples:  # the support query said no
            why = "this GPU has no GPM (Hopper and newer have)"
        elif d.properties.get("mig_mode") == "enabled":
            why = "MIG mode is on and NVML gives no GPM sample of the whole GPU (per-instance GPM is not collected)"
        else:
            why = f"NVML answers {'NOT_SUPPORTED' if code == NOT_SUPPORTED else f'error {code}'} for GPM"
        d.gpm.unsupported = why
        log.info(
            "GPU %s: GpuSmActive, GpuSmOccupancy, GpuTensorActive, GpuDramActive not produced: %s",
            d.uuid,
            why,
            extra={"fields": {"gpu_uuid": d.uuid, "gpm": why}},
        )

    def _drain_events(self) -> None:
        """Take every pending XID event without blocking (timeout 0)."""
        if self._event_set is None:
            return
        api = self.api
        for _ in range(MAX_EVENTS_PER_CYCLE):
            try:
                data = api.nvmlEventSetWait(self._event_set, 0)
            except api.NVMLError as exc:
                if _code(exc) in _WHOLE_NVML:
                    raise
                return  # TIMEOUT: nothing pending (anything else: try again next cycle)
            if not data.eventType & XID_EVENT:
                continue
            device = self._by_handle.get(_handle_key(data.device))
            uuid = device.uuid if device else self._uuid_of(data.device)
            if uuid is None:
                continue
            self.xid_counts[uuid] = self.xid_counts.get(uuid, 0) + 1
            self.last_xid[uuid] = int(data.eventData)
            self._cycle_xids.setdefault(uuid, []).append(int(data.eventData))
            log.warning(
                "GPU %s: %s",
                uuid,
                xid_reason(int(data.eventData)),
                extra={
                    "fields": {"gpu_uuid": uuid, "xid": int(data.eventData), "gpu_instance": int(data.gpuInstanceId)}
                },
            )

    def _uuid_of(self, handle: Any) -> str | None:
        try:
            return str(self.api.nvmlDeviceGetUUID(handle))
        except self.api.NVMLError:
            return None

    def _fallback(self, handle: Any, key: str, *calls: Callable[[], Any]) -> Any:
        """Call the newest entry point that works on this device (newest first); remember which one did.

        A newer call that answers FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH or
        NOT_SUPPORTED hands over to the next older one; only the oldest one's
        error reaches the caller (and NOT_SUPPORTED there marks the field
        unsupported). Remembered per device, so the newer call is not asked again.
        """
        where = (key, _handle_key(handle))
        start = self._variant.get(where, 0)
        for n in range(start, len(calls)):
            try:
                result = calls[n]()
            except self.api.NVMLError as exc:
                if _code(exc) in _TRY_OLDER and n + 1 < len(calls):
                    continue
                raise
            self._variant[where] = n
            return result
        raise AssertionError("unreachable")  # pragma: no cover


# --- readers: one per NVML query, each yields (series, value) ---------------------------------------

Pairs = Iterator[tuple[str, float]]


def _utilization(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    u = s.api.nvmlDeviceGetUtilizationRates(h)
    yield "nvml_gpu_utilization_percent", float(u.gpu)
    yield "nvml_memory_utilization_percent", float(u.memory)


def _memory(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    api = s.api
    m = s._fallback(
        h, "memory", lambda: api.nvmlDeviceGetMemoryInfo(h, version=MEMORY_V2), lambda: api.nvmlDeviceGetMemoryInfo(h)
    )
    yield "nvml_memory_total_bytes", float(m.total)
    yield "nvml_memory_used_bytes", float(m.used)
    if hasattr(m, "reserved"):  # v2 only; v1's "used" includes the reservation
        yield "nvml_memory_reserved_bytes", float(m.reserved)


def _power(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    yield "nvml_power_usage_watts", s.api.nvmlDeviceGetPowerUsage(h) / 1000.0


def _power_limit(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    yield "nvml_power_limit_watts", s.api.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0


def _energy(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    yield "nvml_energy_joules", s.api.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0


def _temperature(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    api = s.api
    gpu = 0  # NVML_TEMPERATURE_GPU
    yield (
        "nvml_temperature_gpu_celsius",
        float(
            s._fallback(
                h,
                "temperature",
                lambda: api.nvmlDeviceGetTemperatureV(h, gpu),
                lambda: api.nvmlDeviceGetTemperature(h, gpu),
            )
        ),
    )


def _memory_temperature(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    v = s.api.nvmlDeviceGetFieldValues(h, [MEMORY_TEMP_FIELD])[0]
    if v.nvmlReturn != 0:
        raise s.api.NVMLError(v.nvmlReturn)  # per-field status, e.g. NOT_SUPPORTED on GDDR boards
    value = _field_value(v)
    if value > 0:  # 0 is "no sensor" on boards that answer SUCCESS anyway
        yield "nvml_temperature_memory_celsius", value


def _clocks(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    yield "nvml_clock_sm_mhz", float(s.api.nvmlDeviceGetClockInfo(h, 1))  # NVML_CLOCK_SM
    yield "nvml_clock_memory_mhz", float(s.api.nvmlDeviceGetClockInfo(h, 2))  # NVML_CLOCK_MEM


def _throttle(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    api = s.api
    reasons = s._fallback(
        h,
        "throttle",
        lambda: api.nvmlDeviceGetCurrentClocksEventReasons(h),
        lambda: api.nvmlDeviceGetCurrentClocksThrottleReasons(h),
    )
    yield "nvml_throttle_thermal", 1.0 if reasons & THERMAL else 0.0
    yield "nvml_throttle_power_cap", 1.0 if reasons & POWER_CAP else 0.0
    yield "nvml_throttle_hw_slowdown", 1.0 if reasons & HW_SLOWDOWN else 0.0


def _ecc(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    # NVML_MEMORY_ERROR_TYPE_CORRECTED=0 / UNCORRECTED=1, NVML_VOLATILE_ECC=0 (since the last driver load)
    yield "nvml_ecc_corrected_total", float(s.api.nvmlDeviceGetTotalEccErrors(h, 0, 0))
    yield "nvml_ecc_uncorrected_total", float(s.api.nvmlDeviceGetTotalEccErrors(h, 1, 0))


def _remapped(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    corr, unc, pending, failure = s.api.nvmlDeviceGetRemappedRows(h)
    yield "nvml_remapped_rows_correctable", float(corr)
    yield "nvml_remapped_rows_uncorrectable", float(unc)
    yield "nvml_remapped_rows_pending", 1.0 if pending else 0.0
    yield REMAP_FAILURE, 1.0 if failure else 0.0


def _pcie(s: NvmlSource, d: Device) -> Pairs:
    h = d.handle
    yield "nvml_pcie_replay_total", float(s.api.nvmlDeviceGetPcieReplayCounter(h))


def _recovery_action(s: NvmlSource, d: Device) -> Pairs:
    """The driver's recovery action (field 230), kept on the device for the verdict (no series of its own);
    NOT_SUPPORTED (drivers before the field) marks it unsupported, which is no fault."""
    v = s.api.nvmlDeviceGetFieldValues(d.handle, [RECOVERY_ACTION_FIELD])[0]
    if v.nvmlReturn != 0:
        raise s.api.NVMLError(v.nvmlReturn)
    d.recovery_action = int(_field_value(v))
    return iter(())


def _gpm(s: NvmlSource, d: Device) -> Pairs:
    """GPM over the last cycle: a sample now, the metrics between it and last cycle's (nothing on the first).

    NOT_SUPPORTED or FUNCTION_NOT_FOUND anywhere marks GPM unsupported on the GPU (the reader is then skipped and
    the reason kept); any other error drops the pair, so the next two samples start afresh.
    """
    api, g = s.api, d.gpm
    if not g.asked:
        support = api.nvmlGpmQueryDeviceSupport(d.handle)
        g.asked = True
        if not support.isSupportedDevice:
            raise api.NVMLError(NOT_SUPPORTED)
    if not g.samples:
        g.samples = [api.nvmlGpmSampleAlloc(), api.nvmlGpmSampleAlloc()]
        g.request = api.c_nvmlGpmMetricsGet_t()
    current = 0 if g.previous == 1 else 1
    try:
        api.nvmlGpmSampleGet(d.handle, g.samples[current])
    except api.NVMLError:
        g.previous = -1
        raise
    previous, g.previous = g.previous, current
    if previous < 0:
        return
    request = g.request
    request.version = GPM_METRICS_GET_VERSION
    request.numMetrics = len(GPM_METRICS)
    request.sample1 = g.samples[previous]
    request.sample2 = g.samples[current]
    for i, (metric, _) in enumerate(GPM_METRICS):
        request.metrics[i].metricId = metric
    api.nvmlGpmMetricsGet(request)
    for i, (_, series) in enumerate(GPM_METRICS):
        m = request.metrics[i]
        if m.nvmlReturn == 0 and 0.0 <= m.value <= 100.0:
            yield series, float(m.value)


READERS: tuple[tuple[str, Callable[[NvmlSource, Device], Pairs]], ...] = (
    ("utilization", _utilization),
    ("memory", _memory),
    ("power", _power),
    ("power_limit", _power_limit),
    ("energy", _energy),
    ("temperature", _temperature),
    ("memory_temperature", _memory_temperature),
    ("clocks", _clocks),
    ("throttle", _throttle),
    ("ecc", _ecc),
    ("remapped_rows", _remapped),
    ("pcie_replay", _pcie),
    ("recovery_action", _recovery_action),
    ("gpm", _gpm),
)


def _field_value(v: Any) -> float:
    kind = int(v.valueType)
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind, "uiVal")
    return float(getattr(v.value, attr))


def _text(value: bytes | str) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def _mig_mode(mode: list[int]) -> str:
    current, pending = mode[0], mode[1]
    state = "enabled" if current else "disabled"
    return state if current == pending else f"{state} (pending {'enabled' if pending else 'disabled'})"


def _handle_key(handle: Any) -> Any:
    """Handles from different calls are distinct ctypes objects: key them by address (fakes: by value)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


# --- factory used by exporter.__main__ --------------------------------------------------------------


def load_api() -> Any:
    """The pynvml module, or None when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def make_nvml_source(
    mode: str,
    api: Any = None,
    environ: Mapping[str, str] | None = None,
    dev: Path = Path("/dev"),
    health: GpuHealth | None = None,
) -> NvmlSource | None:
    """The NVML source for the ``--nvml`` mode: ``auto``, ``on`` or ``off`` (None).

    ``on``: NVML is required; when it cannot start, :class:`SourceRequired`
    names the cause and the sidecar does not run (a GPU task deployed without
    the driver mounted is a deployment error to see at once, not a gap on a
    dashboard). Once started, a later NVML failure is handled as under ``auto``.

    ``auto``: when NVML cannot start, the source is kept: one warning at
    start, ``SourceUp{source=nvml}=0`` with the reason every cycle, and a
    slow retry; Triton's metrics keep flowing. On a host that has no GPU at
    all (no library or driver and nothing in /dev or NVIDIA_VISIBLE_DEVICES
    saying one was meant to be there) the warning says so and points at
    ``--nvml off``: a GPU task whose sidecar was not given the driver looks
    the same from inside, and that is the case this must not hide.
    """
    if mode == "off":
        return None
    environ = os.environ if environ is None else environ
    api = load_api() if api is None else api
    source = NvmlSource(api, environ, health=health)
    try:
        source.start()
    except NvmlUnavailable as exc:
        if mode == "on":
            raise SourceRequired(
                f"--nvml on (EXPORTER_NVML=on) needs NVML, which is unavailable: {exc.reason}; "
                "--nvml auto runs without it and retries"
            ) from None
        if exc.code in _ABSENT and not gpu_hints(environ, dev):
            log.warning(
                "NVML unavailable (%s) and no GPU device or NVIDIA_VISIBLE_DEVICES in this container: "
                "GPU telemetry from NVML is off until it appears (retrying every %gs); on a CPU-only "
                "host, --nvml off (EXPORTER_NVML=off) silences this",
                exc.reason,
                RETRY_INTERVAL,
            )
        # collect() raises this error, so the pipeline reports SourceUp=0 with the reason.
    return source
