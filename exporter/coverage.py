"""Coverage: the selected catalog metrics a model version cannot produce, and why, said once.

For each model version whose configuration the index source read, the
metrics of the catalog that read Triton's ``/metrics`` and that this model
gives nothing for, each with the reason, from what the exporter knows:

- the model's configuration: its backend (a vLLM family is for a vLLM
  model, a TensorRT-LLM family for a ``tensorrtllm`` one), decoupled or not
  (an input marked ``decoupled``), ``REPORT_CUSTOM_METRICS`` (the vLLM
  backend publishes nothing without it), the response cache (Triton then
  creates no request summary);
- Triton's version against the release a family needs (its ``since``, read by
  ``Family.triton_release``: the first-response histogram is 24.11 for a
  decoupled model and 26.01 for the others);
- the family's ``requires``: a ``--metrics-config`` flag that is off
  (``counter_latencies``, ``summary_latencies``, ``histogram_latencies``).

Every family-specific fact comes from the catalog; this module knows Triton's
flags and its version numbering only.

A metric none of whose inputs concern the model (a vLLM metric on an image
model, time to first token on a model that is not decoupled) is not named.
Computed only when a version appears or its configuration or Triton's
version changes: nothing per cycle in a steady state.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from catalog import HISTOGRAM_KINDS, Catalog, Family, Input, Metric, Scope
from telemetry.logs import get

from .series import LabelSet, Series
from .sources import ModelConfig

log = get("coverage")

TRITON_FLAGS = ("counter_latencies", "summary_latencies", "histogram_latencies")  # --metrics-config flags
ANCHOR = ((2, 51), (24, 10))  # server version 2.51 is release 24.10 (seen); one release a month
LLM_BACKENDS = {"vllm": "vllm", "tensorrt_llm": "tensorrtllm"}  # a family's requires -> the config's backend


@dataclass(frozen=True)
class Gap:
    metric: str
    reason: str


@dataclass(frozen=True)
class ModelCoverage:
    model: str
    version: str
    gaps: tuple[Gap, ...]

    def by_reason(self) -> dict[str, list[str]]:
        """reason -> the metrics it keeps from this version, in catalog order."""
        out: dict[str, list[str]] = {}
        for g in self.gaps:
            out.setdefault(g.reason, []).append(g.metric)
        return out

    def line(self) -> str:
        """``model 'm' version 1 cannot produce A, B (reason); C (reason)``: metrics grouped by reason."""
        parts = [f"{', '.join(names)} ({reason})" for reason, names in self.by_reason().items()]
        return f"model {self.model!r} version {self.version} cannot produce " + "; ".join(parts)


def grouped(coverages: Iterable[ModelCoverage]) -> str:
    """Every version's gaps, each reason said once: the reason, then per set of metrics it keeps from them the
    model versions (``MODEL/VERSION``) it keeps them from. The ``--once`` view's section: one line per model
    repeats the same reason across a repository of models alike."""
    groups: dict[str, dict[tuple[str, ...], list[str]]] = {}
    for c in coverages:
        for reason, names in c.by_reason().items():
            groups.setdefault(reason, {}).setdefault(tuple(names), []).append(f"{c.model}/{c.version}")
    lines = []
    for reason, sets in groups.items():
        lines.append(f"  {reason}\n")
        lines += [f"    {', '.join(metrics)}: {', '.join(versions)}\n" for metrics, versions in sets.items()]
    return "".join(lines)


def release_of(server_version: str) -> tuple[int, int] | None:
    """Triton's server version as its container release: 2.51.0 -> (24, 10), 2.66.0 -> (26, 1)."""
    m = re.match(r"(\d+)\.(\d+)", server_version)
    if m is None or int(m.group(1)) != ANCHOR[0][0]:
        return None
    (_, minor), (yy, mm) = ANCHOR
    months = yy * 12 + (mm - 1) + int(m.group(2)) - minor
    return (months // 12, months % 12 + 1)


def _shown(release: tuple[int, int]) -> str:
    return f"{release[0]:02d}.{release[1]:02d}"


def _sample(metric: Metric, inp: Input) -> str:
    return f"{inp.sample}_bucket" if metric.kind in HISTOGRAM_KINDS else inp.sample


def _concerns(family: Family, inp: Input, config: ModelConfig) -> bool:
    """Whether the input is one this model could give at all."""
    if family.source != "triton":
        return False
    backend = LLM_BACKENDS.get(family.requires)
    if config.llm_api and family.requires == "tensorrt_llm":
        return True  # the metrics its users look for, and why they never come
    if family.requires == "response_cache" and not config.response_cache:
        return False  # a per-model opt-in this model did not take: nothing is missing
    if backend is not None and config.backend != backend:
        return False
    return inp.decoupled is None or inp.decoupled is config.decoupled


def _reason(family: Family, inp: Input, config: ModelConfig, release: tuple[int, int] | None) -> str:
    if config.llm_api and family.requires == "tensorrt_llm":
        return (
            "TensorRT-LLM's LLM-API (PyTorch) backend publishes none of nv_trt_llm_* or nv_llm_* (its per-request "
            "figures come back as response tensors): Triton's core families only"
        )
    if family.requires == "vllm" and (config.parameter("REPORT_CUSTOM_METRICS") or "").lower() != "true":
        return "the vLLM backend publishes its metrics only with REPORT_CUSTOM_METRICS=true in the model's parameters"
    needs = family.triton_release(config.decoupled)
    if needs is not None and release is not None and release < needs:
        kind = ""
        if needs != family.triton_release(not config.decoupled):  # the release depends on the kind of model
            kind = " of a decoupled model" if config.decoupled else " of a model that is not decoupled"
        return f"Triton {_shown(release)} is too old: {family.name}{kind} needs {_shown(needs)}+"
    if family.requires == "summary_latencies" and config.response_cache:
        return "response cache on: Triton creates no request summary for the model"
    flag = family.requires
    if flag == "counter_latencies":  # on by default: someone turned it off
        return "counter_latencies is off (--metrics-config counter_latencies=false)"
    if flag in TRITON_FLAGS:
        return f"{flag} is off (--metrics-config {flag}=true turns it on)"
    if family.since and family.requires in LLM_BACKENDS:
        # The backend's own release is not something Triton's APIs tell: say which one publishes it.
        return f"no {family.name} from this model's backend: it is published from {family.since}"
    return f"Triton prints no {family.name} for this model"


def gaps(catalog: Catalog, config: ModelConfig, present: set[str], release: tuple[int, int] | None) -> tuple[Gap, ...]:
    """The selected model metrics that read /metrics, concern this model, and have none of their samples."""
    out = []
    for m in catalog.metrics:
        if m.scope is not Scope.MODEL or not m.inputs:
            continue
        concerned = [
            (catalog.families[i.family], i) for i in m.inputs if _concerns(catalog.families[i.family], i, config)
        ]
        if not concerned or any(_sample(m, i) in present for _, i in concerned):
            continue
        family, inp = concerned[0]
        out.append(Gap(m.name, _reason(family, inp, config, release)))
    return tuple(out)


class Coverage:
    """What each model version cannot produce, recomputed only when a version or Triton's version changes."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.known: dict[str, tuple[ModelConfig, str, ModelCoverage]] = {}  # entity key -> (config, version, result)

    def update(
        self,
        configs: Mapping[str, ModelConfig],
        server_version: str,
        samples: Mapping[str, Series],
        labels: Mapping[str, LabelSet],
    ) -> dict[str, ModelCoverage]:
        """Every known version's coverage; a line is logged for each version that appeared and misses metrics."""
        for key in [k for k in self.known if k not in configs]:
            del self.known[key]  # gone: said again when it comes back
        new = [
            k
            for k, c in configs.items()
            if (got := self.known.get(k)) is None or (got[0] is not c and got[0] != c) or got[1] != server_version
        ]
        if new:
            release = release_of(server_version)
            names, masks = _present(samples, labels, set(new))
            memo: dict[tuple[ModelConfig, int], tuple[Gap, ...]] = {}  # most versions look alike: one answer each
            for key in new:
                ls = labels.get(key)
                model, version = (ls.entity[1], ls.entity[2]) if ls is not None else _split(key)
                mask = masks.get(key, 0)
                found = memo.get((configs[key], mask))
                if found is None:
                    present = {n for i, n in enumerate(names) if mask >> i & 1}
                    found = memo[(configs[key], mask)] = gaps(self.catalog, configs[key], present, release)
                result = ModelCoverage(model, version, found)
                self.known[key] = (configs[key], server_version, result)
                if result.gaps:
                    log.info(
                        result.line(), extra={"fields": {"condition": "coverage", "model": model, "version": version}}
                    )
        return {k: v[2] for k, v in self.known.items()}


def _present(
    samples: Mapping[str, Series], labels: Mapping[str, LabelSet], keys: set[str]
) -> tuple[list[str], dict[str, int]]:
    """The scrape's sample names, and per given entity a bit mask of those it has (one pass, small ints: at
    1000 models a set per model would cost megabytes of peak memory)."""
    names = list(samples)
    out: dict[str, int] = {}
    for i, name in enumerate(names):
        bit = 1 << i
        for key in samples[name]:
            ls = labels.get(key)
            if ls is not None and (ent := ls.entity_key) in keys:
                out[ent] = out.get(ent, 0) | bit
    return names, out


def _split(key: str) -> tuple[str, str]:
    """model and version from an entity key (a version whose series are not in this scrape)."""
    parts = dict(p.split("\x1e", 1) for p in key.split("\x1f") if "\x1e" in p)
    return parts.get("model", key), parts.get("version", "")
