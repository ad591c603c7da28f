"""The smoke inference (``--smoke``): one request per model, built from the model's own metadata.

A model can be READY and still fail every request (a Python model that raises,
a missing output). ``--smoke`` sends each required model one inference whose
inputs are synthesised from ``GET /v2/models/{m}/versions/{v}`` and its config:
zeros in Triton's binary tensor format, each variable dimension set to 1, a
one-step sequence for sequence models. Nothing is hard-coded per model; what
cannot be synthesised is reported as skipped. See docs/health.md ("Smoke
inference").

Only ``--smoke`` imports this module (``probe._smoke``), so the default run,
every 30 s in every task, does not load it. Standard library only, Python 3.8+.
"""

from __future__ import annotations

import json
import math
import time

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing takes milliseconds to import; type checkers know the name
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

if TYPE_CHECKING or __package__:  # type checkers see the package import
    from . import _http, _report
else:  # imported as a top-level module, from the folder health.py was copied to
    import _http
    import _report

MAX_SMOKE_BYTES = 64 * 1024 * 1024  # zeros we are willing to send per inference

# Bytes per element for Triton's binary tensor format; BYTES elements are a
# 4-byte little-endian length followed by the bytes, so an empty string is 4 zero bytes.
DTYPE_SIZES = {
    "BOOL": 1, "UINT8": 1, "INT8": 1,
    "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
    "UINT32": 4, "INT32": 4, "FP32": 4,
    "UINT64": 8, "INT64": 8, "FP64": 8,
    "BYTES": 4,
}  # fmt: skip


def build_infer(meta: dict[str, Any], config: dict[str, Any] | None) -> tuple[bytes, int]:
    """Request body (JSON header + zero tensors) and the JSON header length.

    Inputs come from the model's metadata: every input that the config does not
    mark optional, its datatype, its shape with each variable (-1) dimension,
    batch included, set to 1. Data are zeros in Triton's binary tensor format,
    which is also an empty string for BYTES, and outputs are asked for in binary
    so a large output does not cost a JSON rendering.
    """
    config = config or {}
    if (config.get("model_transaction_policy") or {}).get("decoupled"):
        raise _http.Unsynthesisable("decoupled model: Triton's HTTP infer endpoint cannot serve it")
    conf_inputs = {i.get("name"): i for i in config.get("input") or [] if isinstance(i, dict)}
    batched = int(config.get("max_batch_size") or 0) > 0
    inputs, total = [], 0
    for inp in meta.get("inputs") or []:
        name, dtype, shape = inp.get("name"), str(inp.get("datatype", "")), inp.get("shape")
        conf = conf_inputs.get(name, {})
        if conf.get("optional"):
            continue
        if conf.get("is_shape_tensor"):
            raise _http.Unsynthesisable(f"input {name} is a shape tensor; its values cannot be guessed")
        if dtype not in DTYPE_SIZES:
            raise _http.Unsynthesisable(f"input {name} has datatype {dtype!r}, which cannot be synthesised")
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise _http.Unsynthesisable(f"input {name} has no usable shape in the metadata")
        dims = [1 if d < 0 else d for d in shape]
        if batched and "dims" in conf and len(shape) == len(conf["dims"]) + 1:
            dims[0] = 1  # the batch dimension: one request of batch size 1
        size = math.prod(dims) * DTYPE_SIZES[dtype]
        total += size
        inputs.append({"name": name, "datatype": dtype, "shape": dims, "parameters": {"binary_data_size": size}})
    if not inputs:
        raise _http.Unsynthesisable("the model has no required inputs in its metadata")
    if total > MAX_SMOKE_BYTES:
        raise _http.Unsynthesisable(f"inputs would need {total} bytes (limit {MAX_SMOKE_BYTES})")
    params: dict[str, object] = {"binary_data_output": True}
    if config.get("sequence_batching"):
        import random  # only sequence models need it: 0.5 ms more (warnings, bisect, _sha512) the others do not pay

        params.update(sequence_id=random.randint(1 << 40, 1 << 48), sequence_start=True, sequence_end=True)
    header = json.dumps({"id": "triton-health", "inputs": inputs, "parameters": params}).encode()
    return header + bytes(total), len(header)


def smoke(client: _http.Client, name: str, version: str, explicit: bool) -> tuple[str, str]:
    """Returns (status, detail): ok, or skip for a model whose inputs cannot be synthesised."""
    seg = _http.segment(name)
    try:
        if seg is None:
            raise _http.Unsynthesisable("name cannot be sent in an HTTP path")
        base = f"/v2/models/{seg}/versions/{version}"
        meta_resp = client.request("GET", base)
        if meta_resp.status != 200:
            raise _http.ProtocolError(
                f"metadata answered HTTP {meta_resp.status}: {_report.first_line(meta_resp.error_text())}"
            )
        meta = meta_resp.json()
        conf_resp = client.request("GET", base + "/config")
        config = conf_resp.json() if conf_resp.status == 200 else None
        if not isinstance(meta, dict) or (config is not None and not isinstance(config, dict)):
            raise _http.ProtocolError("metadata or config is not a JSON object")
        body, header_len = build_infer(meta, config)
    except _http.Unsynthesisable as exc:
        if explicit:
            raise
        return "skip", str(exc)
    t0 = time.monotonic()
    resp = client.request(
        "POST",
        base + "/infer",
        body,
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_len)},
        wanted=json_part,
    )
    ms = (time.monotonic() - t0) * 1000
    if resp.status != 200:
        raise _http.ProtocolError(
            f"inference answered HTTP {resp.status}: {_report.first_line(resp.error_text()) or 'no reason given'}"
        )
    try:
        out = _http.loads(resp.body)
    except ValueError as exc:
        raise _http.ProtocolError(f"inference answered 200 with an unreadable body: {exc}") from exc
    outputs = out.get("outputs") if isinstance(out, dict) else None
    if not outputs:
        raise _http.ProtocolError("inference answered 200 without outputs")
    return "ok", f"HTTP 200 with {len(outputs)} output(s) in {ms:.0f} ms"


def json_part(headers: Mapping[str, str]) -> int | None:
    """How much of an inference answer the check reads: its JSON header, not the binary outputs after it."""
    n = headers.get("inference-header-content-length", "")
    return int(n) if n.isascii() and n.isdigit() and len(n) <= 18 else None
