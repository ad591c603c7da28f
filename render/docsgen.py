"""docs/metrics.md: the metric reference and the catalog file schema, generated so they cannot go stale.

The worked example is ``catalog/example.toml``, shipped with the
package; tests load it as a user catalog against a real Triton.
"""

from __future__ import annotations

from importlib import resources

from catalog import CLOUDWATCH_UNITS, Catalog, Kind, Scope

SCOPE_TEXT = {
    Scope.MODEL: "Per model version (`model`, `version`)",
    Scope.GPU: "Per GPU (`gpu` = index; the uuid is the `gpu_uuid` property)",
    Scope.TASK: "Per task (no dimensions: one series across all tasks of the namespace)",
    Scope.SOURCE: "Per scrape source (`source`)",
    Scope.MODELSYNC: "Per model-sync event (no base dimensions; rollups over `model` and `result`)",
}

KIND_TEXT = {
    Kind.GAUGE: "the value at scrape time",
    Kind.DELTA: "a counter's increase over the window",
    Kind.RATE: "a counter's increase per second of the window (monotonic clock)",
    Kind.RATIO: "delta of the inputs (summed) / delta of the denominators (summed), when the denominator grew",
    Kind.GAUGE_RATIO: "gauge / gauge, pairwise (input 1 / denominator 1, ...), when the denominator > 0",
    Kind.QUANTILE: 'one quantile of a summary (`split = "quantile"`), when its `guard` counter grew',
    Kind.DISTRIBUTION: "a histogram's bucket deltas as a CloudWatch distribution (see below)",
    Kind.PERCENTILE: "one task's percentile (`quantile`), interpolated in the window's bucket deltas",
    Kind.STATE: "from the repository index (built-in metrics only)",
    Kind.SELF: "the exporter's own bookkeeping (built-in metrics only)",
    Kind.SUPPLIED: "the value the model-sync daemon supplies (scope `modelsync`, the model-sync pack only)",
}

SCHEMA = """\
## Catalog files

Every metric above is defined in a TOML file: `core.toml` (Triton's core families, NVML, the exporter's
own metrics) and `llm.toml` (vLLM and TensorRT-LLM) are built in (`catalog/`). Files you pass
with `--catalog PATH` (repeatable; `EXPORTER_CATALOG`, paths separated by `:`) are read after them, in
order, with the same schema: they add metrics for any family Triton serves (custom `pb_utils` families
included, `:` in names too), replace a built-in metric (`override = true`) or remove one (`drop`).
`--llm-metrics off` leaves the LLM pack out. The catalog is validated once at start: an unknown key,
kind, scope or unit, a duplicate EMF name, a ratio without denominators, a name over 255 characters, a
split label the family does not carry, or a family of the wrong type for the computation stops the
sidecar with one line naming the file, the entry and the problem (exit 2).

`--metrics` (`EXPORTER_METRICS`) selects what is emitted: comma-separated globs over EMF names, applied
left to right; `Pattern` adds, `-Pattern` removes, and the start is everything when the first term
removes (`-RequestFailure*,-Compute*`), nothing when it adds (`Gpu*,ModelReady`). A pattern that matches
nothing is an error. `python -m exporter catalog`, `cost` and `render` take the same `--catalog`,
`--metrics` and `--llm-metrics` flags, so you can list, price and draw a selection before you deploy it.

Top-level keys: `[families]`, `[dimensions]`, `[[metric]]`, `drop = ["Name", ...]`.

`[families]`: one entry per family a source serves, `name = {{ type = ..., labels = [...] }}`.

{family_keys}

`[dimensions]`: a dimension whose values are declared once, each with its meaning (model sync's `result`,
in `catalog/modelsync.toml`), `name = {{ help = "...", values = {{ value = "meaning", ... }} }}`.

{dimension_keys}

`[[metric]]`: one per EMF metric.

{metric_keys}

Model sync's metrics are a pack of their own, `catalog/modelsync.toml`, read apart from the exporter's
catalog (the exporter never emits them; the model-sync daemon encodes its events from it, and `render`
and `cost` read it): scope `modelsync`, kind `supplied`, `event` naming the event that carries the
metric, and rollups over the keys an event carries (`model`, and `result`, whose values the pack
declares under `[dimensions.result]`). docs/modelsync-metrics.md (its metric and result tables) is
rendered from it.

| kind | computation |
| --- | --- |
{kinds}

### Distributions and percentiles

A `distribution` metric turns a histogram's bucket deltas over the window into one EMF value object
`{{"Values": [...], "Counts": [...], "Max", "Min", "Count", "Sum"}}`: one pair per bucket that gained
observations. The value of a bucket `(lo, hi]` is its **midpoint**; the first bucket's lower edge is 0
(a first bound at or below 0 is its own value); the `+Inf` bucket's value is its lower edge, the
highest finite bound. `Min` and `Max` are the lower edge of the lowest and the upper edge of the highest
non-empty bucket (the lower edge for `+Inf`), `Count` the sum of `Counts`, `Sum` the delta of `_sum`
(all scaled by `scale`). More than 100 non-empty buckets are merged pairwise into count-weighted means.
A window without observations emits nothing; the first scrape, a new series and a counter reset are
baselines, as for counters. CloudWatch treats the object as a set of samples and computes `p50`, `p95`,
`p99` over every event of every task: that is the service's percentile, which dashboards and alarms use.

A `percentile` metric is one task's percentile over its own window, a plain number: CloudWatch cannot
combine it across tasks (its Maximum is "the worst task"). The LLM pack keeps p50/p95/p99 of time to
first token, inter-token and end-to-end latency per task for the `--once` table and per-task
investigation; Triton's own summary quantiles (`RequestLatencyP95`) are per task in the same way.

### Worked example: a custom `pb_utils` metric

A Python model publishes its own families with `pb_utils.MetricFamily` (no labels are added for it):

```python
self.hits = pb_utils.MetricFamily("app:prompt_cache_hits_total", "Prompt cache hits", pb_utils.MetricFamily.COUNTER)
self.hits_metric = self.hits.Metric(labels={{"model": args["model_name"], "version": args["model_version"]}})
self.wait = pb_utils.MetricFamily("app:tool_call_seconds", "Tool call time", pb_utils.MetricFamily.HISTOGRAM)
self.wait_metric = self.wait.Metric(labels={{...}}, buckets=[0.05, 0.1, 0.5, 1, 5])
```

This file (shipped as `catalog/example.toml`) emits its hits per window and per second and the
tool-call time as a distribution, per model version:

```toml
{example}```

Run `python -m exporter catalog --catalog example.toml` to check it and see what it adds,
`python -m render cost --catalog example.toml --models 5` for its price.
"""


FAMILY_KEYS_DOC = (
    ("type", "`counter`, `gauge`, `summary`, `histogram` or `untyped`, as its `# TYPE` line says"),
    ("labels", "labels it carries (`model` and `version` for a per-model family; not `le` or `quantile`)"),
    (
        "source",
        "`triton` (read from `/metrics`, the default), `nvml` (the NVML source's own series), `traces` (the trace "
        "relay) or `outputs` (the exporter's own outputs: what the OTLP metrics output sent)",
    ),
    ("help", "optional text for this page"),
    (
        "requires",
        "optional: what must be on for Triton to serve it (a `--metrics-config` flag such as `counter_latencies` or "
        "`summary_latencies`, a backend such as `vllm`, ...); `cost` and the coverage line use it",
    ),
    (
        "since",
        'optional: the first releases that publish it (`"Triton 24.11"`, `"vLLM backend r24.09"`); the version '
        "table above lists it, and the coverage line compares its `Triton YY.MM` with the server's version; clauses "
        'separated by `;`, one saying `(decoupled models)` applies to those only (`"Triton 24.11 (decoupled models); '
        'Triton 26.01 (every model)"`)',
    ),
    ("override", "`true` to redeclare a family an earlier file declared differently"),
)
DIMENSION_KEYS_DOC = (
    ("help", "what the dimension says (required)"),
    ("values", 'its allowed values, each with its meaning: `{ ok = "...", ... }` (required)'),
)
METRIC_KEYS_DOC = (
    ("name", "the EMF metric name: upper-case first letter, then letters, digits, `_ . -`; at most 255 characters"),
    (
        "scope",
        "`model` (dimensions `model`, `version`), `gpu` (`gpu`) or `task` (none); the family must "
        "carry `model` and `version`, `gpu_uuid`, or neither; `modelsync` is for the model-sync pack",
    ),
    ("unit", "a CloudWatch unit: {units}"),
    ("kind", "the computation (table below)"),
    (
        "inputs",
        'families read: `"name"`, `"name_sum"`, or `{ family = "name", split = "label", '
        'select = "value", scale = 100.0, sample = "sum" }`; with several, the first present '
        "for an entity wins (a ratio sums them); `cumulative = true` lets `delta`, `rate` and `ratio` read a "
        "gauge family that only grows (a count the source types as a gauge); `decoupled = true` (or `false`) on a "
        "distribution's or percentile's input reads it only for model versions whose configuration says they are "
        "decoupled (or not)",
    ),
    ("denominators", "`ratio` and `gauge_ratio` only"),
    ("guard", "`quantile` only: a counter that must have grown in the window"),
    ("quantile", "`percentile` only: 0.95 for p95"),
    (
        "combine",
        "`sum` (default) or `max`: how an entity's series that differ in other labels merge (a model "
        "on two GPUs has one series per `gpu_uuid`)",
    ),
    (
        "rollups",
        'extra dimension sets, each a billed metric: `[["model"], []]` adds per-model and service-wide; '
        "scope `modelsync`: subsets of `model`, `result`",
    ),
    ("breakdown_of", "a total (another metric): this metric's zero is left out while the total is zero too"),
    ("help", "what it means (required)"),
    (
        "event",
        "scope `modelsync` only (required there): the event that carries it, `attempt`, `model`, `host`, "
        "`rollout` or `start`",
    ),
    (
        "interval",
        "seconds between its values when shorter than the exporter's `--interval`: a divisor of 60 below it "
        "(`10` for the scaling signals, docs/scaling.md); computed from its own counter window, emitted by a "
        "scrape of only the sources it reads between full cycles; not for kinds `self`, `state`, `supplied`",
    ),
    (
        "resolution",
        "`1`: a high-resolution metric (EMF `StorageResolution` 1; alarms may use 10 or 30-second periods, billed "
        "at the high-resolution alarm price); `60` (default): standard",
    ),
    (
        "across",
        "scope `task` only: the task's one value from each model's (or GPU's) value of a model- or GPU-labelled "
        "family: `sum` (kinds `gauge`, `delta`, `rate`) or `max` (any but `distribution`)",
    ),
    ("override", "`true` to replace a metric of the same name from an earlier file"),
)


def _keys_table(rows: tuple[tuple[str, str], ...]) -> str:
    return "\n".join(["| key | meaning |", "| --- | --- |", *(f"| `{k}` | {v} |" for k, v in rows)])


def example_catalog() -> str:
    return (resources.files("catalog") / "example.toml").read_text(encoding="utf-8")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def versions_table(catalog: Catalog) -> list[str]:
    """The families that only some releases publish (their ``since``), and the metrics that read them."""
    rows = []
    for f in sorted(catalog.families.values(), key=lambda f: (f.since, f.name)):
        if not f.since:
            continue
        readers = []
        for m in catalog.metrics:
            picks = [i.where for i in m.all_inputs() if i.family == f.name]
            if picks:
                readers.append(f"`{m.name}`" + "".join(f" ({w[0]}={w[1]})" for w in picks[:1] if w))
        rows.append(f"| `{f.name}` | {_cell(f.since)} | {', '.join(readers) or '(none)'} |")
    if not rows:
        return []
    return [
        "## Versions",
        "",
        "What users run is a spread of releases: a family below is absent before the release named, and",
        "the metrics that read it are then not emitted (no zeros, no error). Families not listed are in every",
        "release this exporter supports.",
        "",
        "| Family | First releases that publish it | Metrics that read it |",
        "| --- | --- | --- |",
        *rows,
        "",
    ]


def metrics_markdown(catalog: Catalog, namespace: str) -> str:
    files = ", ".join(f"`{f}`" for f in catalog.files)
    lines = [
        "# Metric reference",
        "",
        "Generated by `python -m render` from the metric catalog; do not edit by hand",
        "(tests/unit/render/test_render.py fails when this file differs from a fresh render).",
        "",
        f"Catalog files: {files}. Namespace: `{namespace}` by default (`AWS_EMF_NAMESPACE`). Each dimension set",
        "listed is its own billed custom metric per distinct set of values; `(none)` is one metric across all",
        "tasks. Inputs name Triton's `/metrics` families or the NVML source's series (`nvml_*`);",
        "`a | b` means the first present wins, `x 100` a scale.",
        "",
    ]
    for scope in Scope:
        metrics = [m for m in catalog.metrics if m.scope is scope]
        if not metrics:
            continue
        lines += [
            f"## {SCOPE_TEXT[scope]}",
            "",
            "| Metric | Unit | Kind | Dimension sets | Inputs | Meaning |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for m in metrics:
            dims = "<br>".join(", ".join(f"`{d}`" for d in ds) or "(none)" for ds in m.dimension_sets)
            meaning = m.help + (f" Zero omitted while `{m.breakdown_of}` is zero." if m.breakdown_of else "")
            kind = (
                str(m.kind)
                + (f", every {m.interval} s" if m.interval else "")
                + (", high resolution" if m.high_resolution else "")
            )
            lines.append(f"| `{m.name}` | {m.unit} | {kind} | {dims} | {_cell(m.describe())} | {_cell(meaning)} |")
        lines.append("")
    lines.append(
        f"{len(catalog.metrics)} metrics, {sum(len(m.dimension_sets) for m in catalog.metrics)} dimension sets."
    )
    lines += [
        "",
        "## Families",
        "",
        "| Family | Type | Labels | Source | Requires | Notes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for f in sorted(catalog.families.values(), key=lambda f: f.name):
        labels = ", ".join(f"`{x}`" for x in f.labels) or "(none)"
        lines.append(f"| `{f.name}` | {f.type} | {labels} | {f.source} | {f.requires} | {_cell(f.help)} |")
    lines.append("")
    lines += versions_table(catalog)
    kinds = "\n".join(f"| `{k}` | {text} |" for k, text in KIND_TEXT.items())
    units = ", ".join(f"`{u}`" for u in CLOUDWATCH_UNITS)
    metric_keys = _keys_table(METRIC_KEYS_DOC).replace("{units}", units)
    lines.append(
        SCHEMA.format(
            family_keys=_keys_table(FAMILY_KEYS_DOC),
            dimension_keys=_keys_table(DIMENSION_KEYS_DOC),
            metric_keys=metric_keys,
            kinds=kinds,
            example=example_catalog(),
        )
    )
    return "\n".join(lines)


MODELSYNC_DOC = "docs/modelsync-metrics.md"
EVENT_TEXT = {
    "attempt": "one per sync attempt of one model",
    "model": "one per model per reconcile",
    "host": "one per reconcile",
    "rollout": "one per decision of a safe rollout",
    "start": "one per task start (modelsync/startup.py)",
}


def modelsync_markdown(pack: Catalog) -> str:
    """docs/modelsync-metrics.md: model sync's metrics and result names, from its pack of the catalog."""
    lines = [
        "# Model sync metrics",
        "",
        "Generated by `python -m render` from `catalog/modelsync.toml`, the model-sync pack; do not",
        "edit by hand (tests/unit/render/test_render.py fails when this file differs from a fresh render). The daemon",
        "encodes its events from the pack; see [modelsync.md](modelsync.md#metrics-emf) for the events'",
        "properties and the alarms. Each dimension set is its own billed custom metric per distinct set of",
        "values; `(none)` is one metric across all hosts.",
        "",
        "| Metric | Unit | Event | Dimension sets | Meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in pack.metrics:
        dims = "<br>".join(", ".join(f"`{d}`" for d in ds) or "(none)" for ds in m.dimension_sets)
        event = f"{m.event}: {EVENT_TEXT.get(m.event, '')}"
        lines.append(f"| `{m.name}` | {m.unit} | {_cell(event)} | {dims} | {_cell(m.help)} |")
    for dim in pack.dimensions.values():
        lines += ["", f"## `{dim.name}`: {_cell(dim.help)}", "", "| Value | Meaning |", "| --- | --- |"]
        lines += [f"| `{value}` | {_cell(meaning)} |" for value, meaning in dim.values]
    return "\n".join(lines) + "\n"
