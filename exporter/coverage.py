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
  (``counter_latencies``, ``summary_latencies``, ``histogram_latencies``);
- a family that is there without the value of its split label a metric
  selects (``request_type="waiting"`` of TensorRT-LLM backends before v0.18):
  a missing input too, with the release that publishes that value when the
  family's ``since`` names it (``... for request_type waiting``);
- with ``--otlp-semconv genai``, OpenTelemetry's GenAI server metrics
  (:mod:`catalog.genai`): a model that is not generative, or none of whose
  sources applies or is published.

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
from dataclasses import dataclass, replace

from catalog import HISTOGRAM_KINDS, Catalog, Family, Input, Metric, Scope
from catalog import genai as semconv
from telemetry.logs import get

from .series import LabelSet, Series
from .sources import ModelConfig
from .sources.promtext import parse_labels

log = get("coverage")

TRITON_FLAGS = ("counter_latencies", "summary_latencies", "histogram_latencies")  # --metrics-config flags
ANCHOR = ((2, 51), (24, 10))  # server version 2.51 is release 24.10 (seen); one release a month
LLM_BACKENDS = {"vllm": "vllm", "tensorrt_llm": "tensorrtllm"}  # a family's requires -> the config's backend
BACKEND_NAMES = {"vllm": "vLLM models", "tensorrt_llm": "TensorRT-LLM models"}
_FOR_VALUE = re.compile(r"\s+for\s+(\S+)\s+(\S+)\s*$")  # a since clause about one value: "... for request_type waiting"


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


def token(sample: str, where: tuple[str, str] | None) -> str:
    """What ``present`` holds for an input: its sample name, or ``name{label="value"}`` for one split value."""
    return sample if where is None else f'{sample}{{{where[0]}="{where[1]}"}}'


def _token(metric: Metric, inp: Input) -> str:
    return token(_sample(metric, inp), inp.where)


def _since(family: Family) -> tuple[Family, dict[tuple[str, str], str]]:
    """The family with the ``since`` clauses about the whole family only, and those about one split value."""
    whole, values = [], {}
    for clause in family.since.split(";"):
        m = _FOR_VALUE.search(clause)
        if m is None:
            whole.append(clause.strip())
        else:
            values[(m.group(1), m.group(2))] = clause[: m.start()].strip()
    return replace(family, since="; ".join(c for c in whole if c)), values


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


def _reason(
    family: Family, inp: Input, config: ModelConfig, release: tuple[int, int] | None, family_present: bool = False
) -> str:
    if config.llm_api and family.requires == "tensorrt_llm":
        return (
            "TensorRT-LLM's LLM-API (PyTorch) backend publishes none of nv_trt_llm_* or nv_llm_* (its per-request "
            "figures come back as response tensors): Triton's core families only"
        )
    if family.requires == "vllm" and (config.parameter("REPORT_CUSTOM_METRICS") or "").lower() != "true":
        return "the vLLM backend publishes its metrics only with REPORT_CUSTOM_METRICS=true in the model's parameters"
    family, by_value = _since(family)
    if family_present and inp.where is not None:  # the family is there, the value the metric selects is not
        label, value = inp.where
        missing = f'{family.name} has no {label}="{value}" for this model'
        if inp.where in by_value:
            return f"{missing}: it is published from {by_value[inp.where]}"
        if label == "quantile":
            return f"{missing} (--metrics-config summary_quantiles= leaves it out)"
        return missing
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


def gaps(
    catalog: Catalog,
    config: ModelConfig,
    present: set[str],
    release: tuple[int, int] | None,
    genai: Iterable[semconv.Planned] = (),
) -> tuple[Gap, ...]:
    """The selected model metrics that read /metrics, concern this model, and miss all of their inputs (a
    family without the split value an input selects is missing too), or all of their denominators; with
    ``genai`` (:func:`catalog.genai.plan`), the GenAI metrics this model gets none of."""
    out = []
    for m in catalog.metrics:
        if m.scope is not Scope.MODEL or not m.inputs:
            continue
        for inputs in (m.inputs, m.denominators):  # a ratio needs both
            concerned = [
                (catalog.families[i.family], i) for i in inputs if _concerns(catalog.families[i.family], i, config)
            ]
            if concerned and not any(_token(m, i) in present for _, i in concerned):
                family, inp = concerned[0]
                out.append(Gap(m.name, _reason(family, inp, config, release, _sample(m, inp) in present)))
                break
    for planned in genai:
        reason = _genai_reason(catalog, planned, config, present, release)
        if reason is not None:
            out.append(Gap(planned.metric.name, reason))
    return tuple(out)


def _genai_reason(
    catalog: Catalog,
    planned: semconv.Planned,
    config: ModelConfig,
    present: set[str],
    release: tuple[int, int] | None,
) -> str | None:
    """Why a model version gets no point of one GenAI metric; None when it gets them."""
    declared = config.parameter(semconv.OPERATION_PARAMETER)
    what = config.backend or config.platform or "Triton"
    article = "an" if what[0].lower() in "aeiou" else "a"
    kind = f"{article} {what} model that is {'' if config.decoupled else 'not '}decoupled"
    if semconv.operation(declared, config.decoupled, config.backend) is None:
        if declared is not None and declared.strip():
            return f"the model's configuration sets {semconv.OPERATION_PARAMETER} to {declared.strip()!r}"
        return (
            f"not a generative model: {kind} (a {semconv.OPERATION_PARAMETER} parameter in its configuration "
            "makes it one)"
        )
    if not planned.sources:
        return f"none of {', '.join(planned.metric.sources)} is selected (--metrics)"
    concerned = []
    for source in planned.sources:
        family = catalog.families[source.input.family]
        if _concerns(family, source.input, config):
            concerned.append((family, source.input))
    if not concerned:
        read = " or ".join(
            f"{s.input.family} ({_for_whom(catalog.families[s.input.family], s.input)})" for s in planned.sources
        )
        return f"nothing measures it for {kind}: it is read from {read}"
    if any(token(f"{inp.sample}_bucket", inp.where) in present for _, inp in concerned):
        return None
    family, inp = concerned[0]
    return _reason(family, inp, config, release, f"{inp.sample}_bucket" in present)


def _for_whom(family: Family, inp: Input) -> str:
    """Which models an input is for, in words: "vLLM models", "decoupled models", "every model"."""
    who = BACKEND_NAMES.get(family.requires, "")
    if inp.decoupled is not None:
        kind = "decoupled models" if inp.decoupled else "models that are not decoupled"
        who = f"{who}, {kind}" if who else kind
    return who or "every model"


class Coverage:
    """What each model version cannot produce, recomputed only when a version or Triton's version changes."""

    def __init__(self, catalog: Catalog, genai: bool = False) -> None:
        self.catalog = catalog
        self.genai = semconv.plan(catalog) if genai else ()
        self.known: dict[str, tuple[ModelConfig, str, ModelCoverage]] = {}  # entity key -> (config, version, result)
        # sample -> the split values model metrics select of it ((label, value)): present per model version too
        self.values: dict[str, set[tuple[str, str]]] = {}
        for m in catalog.metrics:
            if m.scope is Scope.MODEL:
                for i in (*m.inputs, *m.denominators):
                    if i.where is not None:
                        self.values.setdefault(_sample(m, i), set()).add(i.where)

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
            names, masks = _present(samples, labels, set(new), self.values)
            memo: dict[tuple[ModelConfig, int], tuple[Gap, ...]] = {}  # most versions look alike: one answer each
            for key in new:
                ls = labels.get(key)
                model, version = (ls.entity[1], ls.entity[2]) if ls is not None else _split(key)
                mask = masks.get(key, 0)
                found = memo.get((configs[key], mask))
                if found is None:
                    present = {n for i, n in enumerate(names) if mask >> i & 1}
                    found = memo[(configs[key], mask)] = gaps(self.catalog, configs[key], present, release, self.genai)
                result = ModelCoverage(model, version, found)
                self.known[key] = (configs[key], server_version, result)
                if result.gaps:
                    log.info(
                        result.line(), extra={"fields": {"condition": "coverage", "model": model, "version": version}}
                    )
        return {k: v[2] for k, v in self.known.items()}


def _present(
    samples: Mapping[str, Series],
    labels: Mapping[str, LabelSet],
    keys: set[str],
    values: Mapping[str, set[tuple[str, str]]],
) -> tuple[list[str], dict[str, int]]:
    """The scrape's sample names and the selected split values (:func:`token`), and per given entity a bit
    mask of those it has (one pass, small ints: at 1000 models a set per model would cost megabytes of peak
    memory)."""
    names: list[str] = []
    out: dict[str, int] = {}
    for name, series in samples.items():
        bit = 1 << len(names)
        names.append(name)
        wanted = []
        for where in sorted(values.get(name, ())):
            wanted.append((where, 1 << len(names)))
            names.append(token(name, where))
        for key in series:
            ls = labels.get(key)
            if ls is not None and (ent := ls.entity_key) in keys:
                mask = bit
                for (label, value), vbit in wanted:
                    if ls.labels.get(label) == value:
                        mask |= vbit
                out[ent] = out.get(ent, 0) | mask
    return names, out


def _split(key: str) -> tuple[str, str]:
    """model and version from an entity key (a version whose series are not in this scrape): keys are spelt
    as label blocks (exporter/series), so the parser's own grammar reads them back."""
    parts = dict(parse_labels(key))
    return parts.get("model", key), parts.get("version", "")
