"""A faithful in-process stand-in for the ``pynvml`` calls the NVML source makes.

Why: no GPU exists where the tests and benchmarks run, and a mock that
returns whatever the test wants proves nothing. This fake keeps pynvml's
contract: the same function names and parameters (tests/unit/exporter/test_nvml.py checks
them against the installed pynvml), the same return types (pynvml's own
ctypes structures where pynvml returns one), and failures raised as the real
``pynvml.NVMLError`` subclasses built from the real error codes. Constants
and error classes are pynvml's own, forwarded unchanged.

Behaviour modelled on NVML's documentation: every call before ``nvmlInit``
raises Uninitialized; init is reference-counted; a lost GPU answers
GPU_IS_LOST to every device query; ``nvmlEventSetWait`` with nothing pending
raises Timeout; ``old_driver=True`` makes the newer entry points raise
FunctionNotFound as an older ``libnvidia-ml.so`` does, and
``newer_error=CODE`` makes them answer any other error (a driver that has the
symbol but answers ARGUMENT_VERSION_MISMATCH or NOT_SUPPORTED from it); per
GPU, ``FakeGpu.failing`` does the same for one function.

Faults and GPM: ``inject_xid`` queues an XID event, ``lose`` makes a GPU fall
off the bus, ``FakeGpu.recovery_action`` is the driver's recovery action
(field 230; None: a driver before the field, which answers NOT_SUPPORTED for
it), ``FakeGpu.remapped`` carries the row-remapping failure flag. ``FakeGpu.gpm``
(metric id -> percent; None: no GPM, as on GPUs before Hopper) drives GPM: a
sample is an opaque ``nvmlGpmSample_t`` pointer, as pynvml hands out, holding
the activity integrated up to the moment it was taken (``clock``, real time by
default), and ``nvmlGpmMetricsGet`` gives each metric's average between two
samples. Assumed, not seen on a GPU yet: a MIG-enabled parent answers
NOT_SUPPORTED to ``nvmlGpmSampleGet`` (tests/integration/test_nvml_real.py records what a
real one answers).

Scenarios are plain functions at the bottom (``two_healthy()`` ...).
``python -m tests.support.nvml_fake SCENARIO CONTROL [settings]`` runs the
exporter's own entry point on one of them, faults injected through the CONTROL
file while it runs (tests/integration/test_nvml_drain.py).
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
import types
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

_NOT_FORWARDED = (types.FunctionType, types.BuiltinFunctionType)


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeGpu:
    """One physical GPU's state. ``None`` for an optional field means the device does not support it."""

    uuid: str
    name: str = "NVIDIA A10G"
    pci_bus_id: str = "00000000:00:1E.0"
    util_gpu: int = 40
    util_mem: int = 20
    mem_total: int = 24 * 1024**3
    mem_used: int = 6 * 1024**3
    mem_reserved: int = 300 * 1024**2
    power_mw: int = 120_500
    power_limit_mw: int = 300_000
    energy_mj: int = 1_000_000
    temp_gpu: int = 55
    temp_mem: int | None = None  # HBM boards only; GDDR boards report NOT_SUPPORTED
    clock_sm: int = 1710
    clock_mem: int = 6251
    clock_reasons: int = 0
    ecc: tuple[int, int] | None = (0, 0)  # (corrected, uncorrected) volatile; None: ECC off
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # Ampere and later
    pcie_replay: int = 0
    mig: tuple[int, int] | None = None  # (current, pending); None: MIG not supported
    mig_devices: list[str] = field(default_factory=list)  # MIG device UUIDs when MIG is on
    lost: bool = False
    recovery_action: int | None = 0  # NVML_GPU_RECOVERY_ACTION_*; None: the driver does not know field 230
    gpm: dict[int, float] | None = None  # GPM metric id -> percent busy; None: no GPM (before Hopper)
    not_supported: set[str] = field(default_factory=set)  # function names answering NOT_SUPPORTED
    failing: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code


@dataclass(frozen=True)
class FakeHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns: opaque to the caller, hashable."""

    index: int
    mig: int | None = None  # MIG slot on the parent, for MIG device handles


@dataclass
class FakeEventData:
    """Same attributes as ``pynvml.c_nvmlEventData_t``."""

    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class _GpmSample:
    buffer: Any  # keeps the pointed-to memory alive
    index: int = -1  # the GPU sampled; -1: not taken yet
    at: float = 0.0
    busy: dict[int, float] = field(default_factory=dict)  # metric id -> integral of percent x seconds


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # gpu index -> event type mask
    pending: deque[FakeEventData] = field(default_factory=deque)
    freed: bool = False


class FakeNvml:
    """Module-like: use it wherever the ``pynvml`` module is expected."""

    NEW_FUNCTIONS = frozenset(
        {
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetTemperatureV",
            "nvmlDeviceGetMemoryInfo_v2",
        }
    )

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        library: bool = True,
        init_error: int | None = None,
        driver_version: str = "550.127.05",
        old_driver: bool = False,
        newer_error: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gpus = list(gpus or [])
        self.clock = clock
        self.gpm_samples: dict[int, _GpmSample] = {}  # address of an allocated sample -> its contents
        self._gpm_busy: dict[int, tuple[float, dict[int, float]]] = {}  # gpu index -> (at, integrals) so far
        self.library = library
        self.init_error = init_error
        self.driver_version = driver_version
        self.old_driver = old_driver
        self.newer_error = newer_error  # what every NEW_FUNCTIONS entry point answers (after the device checks)
        self.refcount = 0
        self.calls = 0
        self.called: Counter[str] = Counter()  # function name -> calls (every GPU)
        self.inits = 0
        self.shutdowns = 0
        self.event_sets: list[_EventSet] = []

    def __getattr__(self, name: str) -> Any:
        # Constants, structures and error classes are pynvml's own; functions are never forwarded,
        # so a function this fake lacks fails loudly instead of reaching the real library.
        value = getattr(pynvml, name)
        if isinstance(value, _NOT_FORWARDED):
            raise AttributeError(f"FakeNvml does not implement {name}")
        return value

    # --- scenario controls -------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Time passes under load: energy accumulates at the current power draw."""
        for g in self.gpus:
            g.energy_mj += int(g.power_mw * seconds)

    def lose(self, index: int) -> None:
        self.gpus[index].lost = True

    def set_recovery_action(self, index: int, action: int) -> None:
        """The driver decides the GPU needs ``action`` (NVML_GPU_RECOVERY_ACTION_*), as with its Xid 154."""
        self.gpus[index].recovery_action = action

    def fail_row_remapping(self, index: int) -> None:
        """Row remapping runs out of spare rows: the failure flag of ``nvmlDeviceGetRemappedRows`` goes up."""
        corr, unc, pending, _ = self.gpus[index].remapped or (0, 0, 0, 0)
        self.gpus[index].remapped = (corr, unc + 1, pending, 1)

    def set_gpm(self, index: int, **percent: float) -> None:
        """From now on, GPU ``index`` is this busy: sm=, occupancy=, tensor=, dram= (percent)."""
        self._integrate(index)
        ids = {"sm": pynvml.NVML_GPM_METRIC_SM_UTIL, "occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY}
        ids |= {"tensor": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "dram": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL}
        gpm = self.gpus[index].gpm
        if gpm is None:
            raise ValueError(f"GPU {index} has no GPM")
        gpm.update({ids[k]: v for k, v in percent.items()})

    def _integrate(self, index: int) -> tuple[float, dict[int, float]]:
        """Activity integrated up to now (percent x seconds per metric), as the GPU's counters would have it."""
        now = self.clock()
        at, busy = self._gpm_busy.get(index, (now, {}))
        gpm = self.gpus[index].gpm or {}
        busy = {m: busy.get(m, 0.0) + pct * (now - at) for m, pct in gpm.items()}
        self._gpm_busy[index] = (now, busy)
        return now, busy

    def inject_xid(self, index: int, xid: int, gpu_instance: int = 0xFFFFFFFF) -> None:
        """A critical XID on GPU ``index``: queued on every event set that registered for it."""
        for s in self.event_sets:
            if not s.freed and s.registered.get(index, 0) & pynvml.nvmlEventTypeXidCriticalError:
                s.pending.append(
                    FakeEventData(FakeHandle(index), pynvml.nvmlEventTypeXidCriticalError, xid, gpu_instance)
                )

    def reset_counters(self) -> None:
        """Driver reload or GPU reset: energy, volatile ECC and PCIe replay counters restart from zero."""
        for g in self.gpus:
            g.energy_mj = 0
            g.pcie_replay = 0
            if g.ecc is not None:
                g.ecc = (0, 0)

    def unload_driver(self) -> None:
        """The kernel module goes away: every call fails as NVML reports it."""
        self.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    def load_driver(self) -> None:
        self.init_error = None

    # --- plumbing ----------------------------------------------------------------------------

    def _enter(self, fn: str) -> None:
        self.calls += 1
        self.called[fn] += 1
        if not self.library:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        if self.old_driver and (fn in self.NEW_FUNCTIONS or fn.startswith("nvmlGpm")):
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if self.refcount == 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        if self.init_error is not None:  # driver went away after init
            raise _err(
                pynvml.NVML_ERROR_UNINITIALIZED
                if self.init_error == pynvml.NVML_ERROR_DRIVER_NOT_LOADED
                else self.init_error
            )

    def _gpu(self, handle: FakeHandle, fn: str) -> FakeGpu:
        self._enter(fn)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[handle.index]
        if g.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in g.failing:
            raise _err(g.failing[fn])
        if self.newer_error is not None and fn in self.NEW_FUNCTIONS:
            raise _err(self.newer_error)
        if fn in g.not_supported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g

    # --- library -----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls += 1
        if not self.library:
            raise _err(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.init_error is not None:
            raise _err(self.init_error)
        self.refcount += 1
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.calls += 1
        if self.refcount == 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        self.refcount -= 1
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if "nvmlDeviceGetHandleByIndex" in self.gpus[index].failing:
            raise _err(self.gpus[index].failing["nvmlDeviceGetHandleByIndex"])
        return FakeHandle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByUUID")
        for i, g in enumerate(self.gpus):
            if g.uuid == uuid:
                return FakeHandle(i)
            if uuid in g.mig_devices:
                return FakeHandle(i, g.mig_devices.index(uuid))
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: FakeHandle) -> FakeHandle:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        if migDevice.mig is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(migDevice.index)

    # --- identity ----------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        g = self._gpu(handle, "nvmlDeviceGetUUID")
        return g.mig_devices[handle.mig] if handle.mig is not None else g.uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        self._gpu(handle, "nvmlDeviceGetIndex")
        return handle.index

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> pynvml.nvmlPciInfo_t:
        g = self._gpu(handle, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        info.busId = g.pci_bus_id.encode()  # pynvml hands back bytes here (no str conversion)
        info.busIdLegacy = g.pci_bus_id.encode()
        return info

    def nvmlDeviceGetMigMode(self, device: FakeHandle) -> list[int]:
        g = self._gpu(device, "nvmlDeviceGetMigMode")
        if g.mig is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [g.mig[0], g.mig[1]]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeHandle) -> int:
        g = self._gpu(device, "nvmlDeviceGetMaxMigDeviceCount")
        if g.mig is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeHandle, index: int) -> FakeHandle:
        g = self._gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if g.mig is None or not g.mig[0]:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= index < len(g.mig_devices):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeHandle(device.index, index)

    # --- telemetry ---------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> pynvml.c_nvmlUtilization_t:
        g = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        if g.mig and g.mig[0]:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # NVML: not available on a MIG-enabled parent
        return pynvml.c_nvmlUtilization_t(gpu=g.util_gpu, memory=g.util_mem)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo")
        free = g.mem_total - g.mem_used - g.mem_reserved
        if not version:
            # v1 counts the driver's reservation as used
            return pynvml.c_nvmlMemory_t(total=g.mem_total, free=free, used=g.mem_used + g.mem_reserved)
        return pynvml.c_nvmlMemory_v2_t(
            version=version, total=g.mem_total, reserved=g.mem_reserved, free=free, used=g.mem_used
        )

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        g = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.temp_gpu

    def nvmlDeviceGetTemperatureV(
        self, handle: FakeHandle, sensor: int, version: int = pynvml.nvmlTemperature_v1
    ) -> int:
        g = self._gpu(handle, "nvmlDeviceGetTemperatureV")
        if version != pynvml.nvmlTemperature_v1:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g.temp_gpu

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, fieldIds: list[int]) -> Any:
        g = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for i, fid in enumerate(fieldIds):
            values[i].fieldId = fid
            if fid == pynvml.NVML_FI_DEV_MEMORY_TEMP and g.temp_mem is not None:
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = g.temp_mem
            elif fid == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and g.recovery_action is not None:
                values[i].nvmlReturn = pynvml.NVML_SUCCESS
                values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = g.recovery_action
            else:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED  # per-field status, call succeeds
        return values

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:
        g = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if type == pynvml.NVML_CLOCK_SM:
            return g.clock_sm
        if type == pynvml.NVML_CLOCK_MEM:
            return g.clock_mem
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, errorType: int, counterType: int) -> int:
        g = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if g.ecc is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if counterType != pynvml.NVML_VOLATILE_ECC:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # only volatile counters are modelled
        return g.ecc[0] if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else g.ecc[1]

    def nvmlDeviceGetRemappedRows(self, device: FakeHandle) -> tuple[int, int, int, int]:
        g = self._gpu(device, "nvmlDeviceGetRemappedRows")
        if g.remapped is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g.remapped

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    # --- events ------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        s = _EventSet()
        self.event_sets.append(s)
        return s

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, eventTypes: int, eventSet: _EventSet) -> None:
        self._gpu(handle, "nvmlDeviceRegisterEvents")
        eventSet.registered[handle.index] = eventSet.registered.get(handle.index, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> FakeEventData:
        self._enter("nvmlEventSetWait")
        if eventSet.freed:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not eventSet.pending:
            raise _err(pynvml.NVML_ERROR_TIMEOUT)  # with timeout 0: nothing waiting, returns at once
        return eventSet.pending.popleft()

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        eventSet.freed = True

    # --- GPM (Hopper and newer) --------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: FakeHandle) -> pynvml.c_nvmlGpmSupport_t:
        g = self._gpu(device, "nvmlGpmQueryDeviceSupport")
        return pynvml.c_nvmlGpmSupport_t(
            version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=0 if g.gpm is None else 1
        )

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buffer = ctypes.create_string_buffer(16)
        sample = ctypes.cast(buffer, pynvml.c_nvmlGpmSample_t)  # what pynvml returns: an opaque pointer
        self.gpm_samples[_address(sample)] = _GpmSample(buffer)
        return sample

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        if self.gpm_samples.pop(_address(gpmSample), None) is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmSampleGet(self, device: FakeHandle, gpmSample: Any) -> Any:
        g = self._gpu(device, "nvmlGpmSampleGet")
        sample = self.gpm_samples.get(_address(gpmSample))
        if sample is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if g.gpm is None or (g.mig and g.mig[0]):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # no GPM; MIG on: assumed, see the module's docstring
        sample.index = device.index
        sample.at, busy = self._integrate(device.index)
        sample.busy = dict(busy)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self.gpm_samples.get(_address(metricsGet.sample1))
        second = self.gpm_samples.get(_address(metricsGet.sample2))
        if first is None or second is None or first.index < 0 or first.index != second.index:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 < metricsGet.numMetrics <= pynvml.NVML_GPM_METRIC_MAX or second.at <= first.at:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        g = self.gpus[second.index]
        if g.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        span = second.at - first.at
        for i in range(metricsGet.numMetrics):
            m = metricsGet.metrics[i]
            if m.metricId in second.busy:
                m.value = (second.busy[m.metricId] - first.busy.get(m.metricId, 0.0)) / span
                m.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                m.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return metricsGet


def _address(sample: Any) -> int:
    if not isinstance(sample, pynvml.c_nvmlGpmSample_t):
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)


# --- scenarios -----------------------------------------------------------------------------------

UUIDS = [f"GPU-{i:08x}-1111-2222-3333-44445555{i:04x}" for i in range(16)]


def gpus(n: int) -> list[FakeGpu]:
    return [
        FakeGpu(UUIDS[i], pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", util_gpu=10 + i, temp_gpu=40 + i)
        for i in range(n)
    ]


def two_healthy() -> FakeNvml:
    return FakeNvml(gpus(2))


def eight_gpus() -> FakeNvml:
    return FakeNvml(gpus(8))


def field_not_supported() -> FakeNvml:
    """GPU 1 has no power readings and ECC off (a GDDR board); GPU 0 is complete."""
    fake = FakeNvml(gpus(2))
    fake.gpus[1].not_supported |= {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"}
    fake.gpus[1].ecc = None
    fake.gpus[1].remapped = None
    return fake


def gpu_lost() -> FakeNvml:
    """Two GPUs; call ``fake.lose(1)`` to make GPU 1 fall off the bus."""
    return FakeNvml(gpus(2))


def library_missing() -> FakeNvml:
    return FakeNvml(gpus(2), library=False)


def xid_events() -> FakeNvml:
    """Two GPUs; call ``fake.inject_xid(i, code)`` for each event."""
    return FakeNvml(gpus(2))


def driver_reload() -> FakeNvml:
    """Two GPUs with counters that have run a while; ``reset_counters()`` models the reload."""
    fake = FakeNvml(gpus(2))
    for g in fake.gpus:
        g.energy_mj = 50_000_000
        g.ecc = (7, 0)
        g.pcie_replay = 3
    return fake


def hopper(n: int = 2) -> FakeNvml:
    """``n`` H100s: HBM, GPM, a driver that knows the recovery-action field."""
    fake = FakeNvml(gpus(n))
    for i, g in enumerate(fake.gpus):
        g.name, g.temp_mem, g.mem_total = "NVIDIA H100 80GB HBM3", 50, 80 * 1024**3
        g.gpm = {
            pynvml.NVML_GPM_METRIC_SM_UTIL: 60.0 + i,
            pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 30.0 + i,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 20.0 + i,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 40.0 + i,
        }
    return fake


def mig_enabled() -> FakeNvml:
    """GPU 0 an A100 in MIG mode with two instances; GPU 1 an A100 with MIG off."""
    fake = FakeNvml(gpus(2))
    for g in fake.gpus:
        g.name, g.temp_mem, g.mem_total = "NVIDIA A100-SXM4-40GB", 48, 40 * 1024**3
    fake.gpus[0].mig = (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)
    fake.gpus[0].mig_devices = ["MIG-aaaaaaaa-0000-0000-0000-000000000001", "MIG-aaaaaaaa-0000-0000-0000-000000000002"]
    fake.gpus[1].mig = (0, 0)
    return fake


# --- the exporter as a process, on this fake ----------------------------------------------------------------

SCENARIOS = {"two_healthy": two_healthy, "hopper": hopper, "xid_events": xid_events}
_FAULTS = {
    "xid": lambda f, gpu, value: f.inject_xid(gpu, value),
    "recovery_action": lambda f, gpu, value: f.set_recovery_action(gpu, value),
    "lose": lambda f, gpu, value: f.lose(gpu),
    "remap_failure": lambda f, gpu, value: f.fail_row_remapping(gpu),
}


def _apply(fake: FakeNvml, line: bytes) -> None:
    """One control line: ``{"fault": "xid", "gpu": 1, "value": 79}``."""
    cmd = json.loads(line)
    _FAULTS[cmd["fault"]](fake, int(cmd["gpu"]), int(cmd.get("value", 0)))


def _follow(fake: FakeNvml, control: Path, offset: int) -> None:
    while True:
        data = control.read_bytes() if control.exists() else b""
        end = data.rfind(b"\n", offset) + 1
        for line in data[offset:end].splitlines():
            if line.strip():
                _apply(fake, line)
        offset = max(offset, end)
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    """``python -m tests.support.nvml_fake SCENARIO CONTROL [exporter settings...]``: the exporter's entry point
    with this fake as pynvml. Lines appended to CONTROL (JSON, one per line) inject faults while it runs; lines
    there at start are applied before the first cycle."""
    import exporter.sources.nvml as nvml_source
    from exporter.__main__ import main as exporter_main

    fake = SCENARIOS[argv[0]]()
    control = Path(argv[1])
    data = control.read_bytes() if control.exists() else b""
    offset = data.rfind(b"\n") + 1
    for line in data[:offset].splitlines():
        if line.strip():
            _apply(fake, line)
    threading.Thread(target=_follow, args=(fake, control, offset), name="nvml-fake-control", daemon=True).start()
    nvml_source.load_api = lambda: fake  # type: ignore[assignment]
    return exporter_main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
