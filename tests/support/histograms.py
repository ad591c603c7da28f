"""Triton-shaped histogram lines with bounds of one's choosing (a model config's own first-response buckets)."""

from __future__ import annotations

from collections.abc import Sequence

FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def histogram_lines(
    family: str, model: str, bounds: Sequence[float], observations: Sequence[float], version: str = "1"
) -> list[str]:
    """``family``'s _bucket (cumulative, ``+Inf`` last), _sum and _count lines for one model version, labels in
    name order as Triton prints them."""
    labels = f'model="{model}",version="{version}"'
    out = []
    for le in (*bounds, float("inf")):
        n = sum(1 for o in observations if o <= le)
        out.append(f'{family}_bucket{{{labels},le="{"+Inf" if le == float("inf") else _num(le)}"}} {n}')
    out.append(f"{family}_sum{{{labels}}} {_num(sum(observations))}")
    out.append(f"{family}_count{{{labels}}} {len(observations)}")
    return out


def first_response(per_model: dict[str, tuple[Sequence[float], Sequence[float]]]) -> str:
    """Triton's first-response histogram family: model -> (its bounds in ms, the observations so far)."""
    out = [f"# HELP {FIRST_RESPONSE} Duration from request to first response in milliseconds"]
    out.append(f"# TYPE {FIRST_RESPONSE} histogram")
    for model, (bounds, observations) in per_model.items():
        out += histogram_lines(FIRST_RESPONSE, model, bounds, observations)
    return "\n".join(out) + "\n"
