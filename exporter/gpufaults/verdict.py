"""The health verdict per GPU: which faults make a GPU unhealthy, kept as data, and the sticky state.

A GPU is unhealthy, for the rest of the process's life, once any of these is seen (docs/gpu.md, "GPU
health"):

- an XID of :data:`FATAL_XIDS` through NVML's XID event set;
- a driver recovery action other than NONE (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, field 230;
  :data:`RECOVERY_ACTIONS`) read twice in a row (one misread is no verdict); a driver that does not know the
  field answers NOT_SUPPORTED, which is no fault;
- the GPU lost (``NVML_ERROR_GPU_IS_LOST``);
- row remapping reporting a failure (``nvmlDeviceGetRemappedRows``' failure flag).

Some of these are report-only (:attr:`Fault.drains` False): XID 63 and 142 (:data:`REPORT_ONLY_XIDS`) and the
recovery action DRAIN_P2P. They set GpuHealthy to 0 and log, but never ask the action (no drain); a draining
fault seen later on the same GPU still does. The controller applies the same rule to what it is told
(controller/reports.py), whatever a host concluded.

Any other XID (:data:`APPLICATION_XIDS` among them: an application's fault) is counted as before and leaves the
GPU healthy. A GPU never turns healthy again within the process: the faults above need a GPU reset or a new
instance, and an unhealthy GPU that looked healthy a cycle later would undo the action taken.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from telemetry.logs import get

log = get("gpu_health")


@dataclass(frozen=True)
class Xid:
    meaning: str  # NVIDIA's description in its Xid catalogue
    nvidia_action: str  # the catalogue's resolution bucket (immediate action)


# The XIDs the EKS node monitoring agent treats as fatal (its DCGM policies, as of 2026), with their meaning and
# immediate action from NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).
# Changing this set changes which faults make a GPU unhealthy and, but for REPORT_ONLY_XIDS, which ones the
# controller is asked to drain for (controller/reports.py holds the same rule): docs/gpu.md lists it,
# tests/unit/exporter/test_nvml_health.py holds both.
FATAL_XIDS: Mapping[int, Xid] = {
    46: Xid("GPU stopped processing", "RESET_GPU"),
    48: Xid("double bit ECC error", "GPU reset or node reboot"),
    54: Xid("auxiliary power is not connected to the GPU board", "CHECK_MECHANICALS"),
    62: Xid("internal micro-controller halt", "RESET_GPU"),
    63: Xid("GPU memory remapping event", "IGNORE"),
    64: Xid("GPU memory remapping failure", "RESET_GPU"),
    74: Xid("NVLink error", "GPU reset or node reboot"),
    79: Xid("GPU has fallen off the bus", "RESTART_BM"),
    95: Xid("uncontained memory error", "RESET_GPU"),
    109: Xid("context switch timeout error", "RESET_GPU"),
    110: Xid("security fault error", "RESET_GPU"),
    119: Xid("GSP RPC timeout", "RESET_GPU"),
    120: Xid("GSP error", "RESET_GPU"),
    136: Xid("link training failed", "RESET_GPU"),
    140: Xid("ECC unrecovered error", "RESET_GPU"),
    142: Xid("NVENC3 error", "CONTACT_SUPPORT"),
    143: Xid("GPU initialization error", "RESET_GPU"),
    151: Xid("key rotation error", "RESTART_VM"),
    155: Xid("NVLink SW defined error", "RESET_GPU"),
    156: Xid("resource retirement event", "RESET_GPU"),
    158: Xid("GPU fatal timeout", "RESET_GPU"),
}

# Application errors: the catalogue's action is to restart the application (or nothing); the GPU stays usable.
APPLICATION_XIDS: Mapping[int, Xid] = {
    13: Xid("graphics engine exception (an application fault)", "RESTART_APP"),
    31: Xid("GPU memory page fault (an application fault)", "RESTART_APP"),
    43: Xid("GPU stopped processing (an application fault; the GPU stays healthy)", "IGNORE"),
}

# NVML_GPU_RECOVERY_ACTION_* (nvidia-ml-py 13.x; the values of field 230).
RECOVERY_NONE = 0
RECOVERY_ACTIONS: Mapping[int, str] = {
    0: "none",
    1: "GPU reset",
    2: "node reboot",
    3: "drain P2P",
    4: "drain and reset",
    5: "recover IMEX domain",
    6: "bus reset",
    7: "system reboot",
}

# Report-only: the GPU is unhealthy (GpuHealthy 0, a log line) and nothing is drained. XID 63 is a memory
# remapping event (the catalogue says IGNORE: the remap happens at the next reset); XID 142 is the NVENC
# engine, which inference does not use; DRAIN_P2P asks to quiesce peer-to-peer traffic and read again.
REPORT_ONLY_XIDS = frozenset({63, 142})
RECOVERY_DRAIN_P2P = 3
REPORT_ONLY_RECOVERY_ACTIONS = frozenset({RECOVERY_DRAIN_P2P})
RECOVERY_READS = 2  # a recovery action other than NONE is a fault once it reads so this many times in a row

ACTIONS = ("report", "drain")
"""The ``--gpu-fault-action`` values."""


@dataclass(frozen=True)
class Fault:
    """Why one GPU is unhealthy: its identity, the kind of fault and the reason in words."""

    uuid: str
    gpu: int  # the gpu dimension
    nvml_index: int
    kind: str  # xid | recovery_action | lost | row_remap_failure
    reason: str  # "XID 79, GPU has fallen off the bus"
    code: int | None = None  # the XID or the recovery action
    drains: bool = True  # False: report-only (XID 63, 142, DRAIN_P2P): unhealthy, never drained
    reads: int = 1  # consecutive reads of the recovery action

    def fields(self) -> dict[str, object]:
        out: dict[str, object] = {
            "gpu_uuid": self.uuid,
            "gpu": self.gpu,
            "nvml_index": self.nvml_index,
            "fault": self.kind,
            "reason": self.reason,
        }
        if self.kind == "xid":
            out["xid"] = self.code
        elif self.kind == "recovery_action":
            out["recovery_action"] = self.code
            out["reads"] = self.reads
        if not self.drains:
            out["report_only"] = True
        return out


class Action(Protocol):
    """What the exporter does when a GPU turns unhealthy (``--gpu-fault-action``)."""

    name: str

    def unhealthy(self, fault: Fault) -> str:
        """Act on a GPU that turned unhealthy, without waiting on the network; say what was done."""
        ...

    def poll(self) -> None:
        """Once a cycle: retry what failed before, when due."""
        ...

    def series(self) -> list[tuple[str, float]]:
        """The action's own cumulative counts, as task-level series (family name, value)."""
        ...

    def close(self) -> None: ...


class Report:
    """``--gpu-fault-action report`` (the default): the verdict, its metric and log line; no AWS call."""

    name = "report"

    def __init__(self, why: str = "--gpu-fault-action report") -> None:
        self.why = why

    def unhealthy(self, fault: Fault) -> str:
        return f"reported only ({self.why}): the instance stays in service"

    def poll(self) -> None:
        return None

    def series(self) -> list[tuple[str, float]]:
        return []

    def close(self) -> None:
        return None


def xid_reason(xid: int) -> str:
    """``XID 79, GPU has fallen off the bus`` (the catalogue's meaning where known)."""
    known = FATAL_XIDS.get(xid) or APPLICATION_XIDS.get(xid)
    return f"XID {xid}, {known.meaning}" if known else f"XID {xid}"


def recovery_reason(action: int) -> str:
    return f"the driver asks for a recovery action: {RECOVERY_ACTIONS.get(action, f'unknown ({action})')}"


class GpuHealth:
    """The sticky verdict of every GPU the source reports, and the action taken when one turns unhealthy."""

    def __init__(self, action: Action | None = None) -> None:
        self.action: Action = action or Report()
        self.faults: dict[str, Fault] = {}  # uuid -> the fault kept; kept across NVML re-initialisation
        self._recovery_reads: dict[str, int] = {}  # uuid -> consecutive reads of a recovery action other than NONE

    def judge(
        self,
        uuid: str,
        gpu: int,
        nvml_index: int,
        *,
        xids: Iterable[int] = (),
        recovery_action: int | None = None,
        lost: bool = False,
        remap_failure: bool = False,
    ) -> Fault | None:
        """This cycle's observations of one GPU -> the fault that makes it unhealthy, or None (healthy).

        The first fault turns the GPU unhealthy: one log line, and the action when it drains. Later faults of
        the same GPU change nothing, but for a draining fault after a report-only one: that one is acted on.
        """
        reads = self._reads(uuid, recovery_action)
        known = self.faults.get(uuid)
        if known is not None and known.drains:
            return known
        fault = _first_fault(uuid, gpu, nvml_index, list(xids), recovery_action, reads, lost, remap_failure)
        if fault is None or (known is not None and not fault.drains):
            return known
        self.faults[uuid] = fault
        if not fault.drains:
            did = "report-only: GpuHealthy 0, no drain"
        else:
            try:
                did = self.action.unhealthy(fault)
            except Exception as exc:  # the action's bug must not stop the verdict or the cycle
                log.error("GPU fault action failed: %s: %s", type(exc).__name__, exc, exc_info=True)
                did = f"the {self.action.name} action failed ({type(exc).__name__}: {exc})"
        log.error(
            "GPU %d (%s) unhealthy: %s; %s",
            gpu,
            uuid,
            fault.reason,
            did,
            extra={"fields": {**fault.fields(), "gpu_fault_action": self.action.name, "action_taken": did}},
        )
        return fault

    def _reads(self, uuid: str, recovery_action: int | None) -> int:
        """Consecutive reads of a recovery action other than NONE, this one included (0: none this cycle)."""
        if recovery_action is None or recovery_action == RECOVERY_NONE:
            self._recovery_reads.pop(uuid, None)
            return 0
        self._recovery_reads[uuid] = self._recovery_reads.get(uuid, 0) + 1
        return self._recovery_reads[uuid]

    def poll(self) -> None:
        try:
            self.action.poll()
        except Exception as exc:
            log.error("GPU fault action failed: %s: %s", type(exc).__name__, exc, exc_info=True)


def _first_fault(
    uuid: str,
    gpu: int,
    nvml_index: int,
    xids: list[int],
    recovery_action: int | None,
    reads: int,
    lost: bool,
    remap_failure: bool,
) -> Fault | None:
    """The fault to keep: a draining one before a report-only one."""
    if lost:
        return Fault(uuid, gpu, nvml_index, "lost", "the GPU is lost (NVML: GPU_IS_LOST, fallen off the bus)")
    for xid in xids:
        if xid in FATAL_XIDS and xid not in REPORT_ONLY_XIDS:
            return Fault(uuid, gpu, nvml_index, "xid", xid_reason(xid), xid)
    persistent = recovery_action is not None and recovery_action != RECOVERY_NONE and reads >= RECOVERY_READS
    if persistent and recovery_action not in REPORT_ONLY_RECOVERY_ACTIONS:
        reason = recovery_reason(recovery_action or 0)
        return Fault(uuid, gpu, nvml_index, "recovery_action", reason, recovery_action, reads=reads)
    if remap_failure:
        return Fault(uuid, gpu, nvml_index, "row_remap_failure", "row remapping failed (replace the GPU)")
    for xid in xids:
        if xid in REPORT_ONLY_XIDS:
            return Fault(uuid, gpu, nvml_index, "xid", xid_reason(xid), xid, drains=False)
    if persistent:
        reason = recovery_reason(recovery_action or 0)
        return Fault(uuid, gpu, nvml_index, "recovery_action", reason, recovery_action, drains=False, reads=reads)
    return None
