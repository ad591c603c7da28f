"""The GPU join policy: which GPUs a task reports, and the ``gpu`` dimension each one gets.

Triton's own GPU series (DCGM inside Triton) and the NVML source describe
the same GPUs, keyed by the same ``GPU-...`` UUID. In ECS the sidecar sees
every GPU of the instance (``NVIDIA_VISIBLE_DEVICES=all``) while Triton sees
only its task's: without :func:`keep_tritons_gpus`, two tasks on one host
would both report each other's GPUs and summed metrics (XID, ECC) would
double. Which samples are which comes from the source that produced them
(:class:`~exporter.sources.SourceKind`), not from their names.
"""

from __future__ import annotations

from collections.abc import Iterable

from catalog import Catalog

from .series import Exposition
from .sources import Collected, GpuInfo


def gpu_samples(catalog: Catalog) -> frozenset[str]:
    """Triton's per-GPU samples: families it serves labelled ``gpu_uuid`` and not per model."""
    return frozenset(
        s
        for f in catalog.families.values()
        if f.source == "triton" and "gpu_uuid" in f.labels and "model" not in f.labels
        for s in f.samples()
    )


def gpu_uuids(exp: Exposition, samples: Iterable[str]) -> list[str]:
    """GPUs a /metrics exposition reports in those samples, in listing order."""
    out: dict[str, None] = {}
    for name in samples:
        for key in exp.samples.get(name, ()):
            ls = exp.labels[key]
            if ls.entity[0] == "gpu":
                out[ls.entity[1]] = None
    return list(out)


def keep_tritons_gpus(gpu_source: Collected, triton_gpus: list[str]) -> None:
    """Keep a GPU source's per-GPU series to the GPUs Triton reports, when it reports any.

    Its task-level series (no ``gpu_uuid``: the GPU fault action's counts) are no GPU's and stay.
    """
    if not triton_gpus:
        return
    wanted = set(triton_gpus)
    exp = gpu_source.samples
    for name, series in exp.samples.items():
        exp.samples[name] = {
            k: v for k, v in series.items() if exp.labels[k].entity[0] != "gpu" or exp.labels[k].entity[1] in wanted
        }
    for uuid in [u for u in gpu_source.gpus if u not in wanted]:
        del gpu_source.gpus[uuid]


class GpuIndex:
    """The ``gpu`` dimension: NVML's index for a UUID when NVML knows it, else Triton's listing order.

    Triton's order is remembered across cycles, so a GPU keeps its number
    while another one comes and goes.
    """

    def __init__(self) -> None:
        self.order: dict[str, int] = {}

    def indexes(self, gpus: dict[str, GpuInfo], triton_gpus: list[str]) -> dict[str, int]:
        out = {uuid: info.index for uuid, info in gpus.items() if info.index is not None}
        for uuid in triton_gpus:
            if uuid not in self.order:
                self.order[uuid] = len(self.order)
        for uuid, i in self.order.items():
            out.setdefault(uuid, i)
        return out
