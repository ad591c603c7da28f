"""The trace relay: Triton's OpenTelemetry spans in on localhost, the ECS task's resource added, forwarded, measured.

    receiver.py   OTLP/HTTP on 127.0.0.1:4318 (JSON as Triton sends it, protobuf): a bounded boundary
    wire.py       a protobuf body's objects counted on the wire, before it is parsed: bounds and size in memory
    spans.py      ids and attribute bounds checked, span kinds (SERVER root, INTERNAL inside), phases
    window.py     phase histograms and the slowest requests between two scrapes (listed models only)
    relay.py      receiver -> bounded queue -> worker -> forwarder
    forward.py    the OTLP exporter towards X-Ray (telemetry/otlp), with its counts
    sampling.py   Triton's trace rate applied at runtime
    source.py     the relay as a pipeline source (series, per-model properties, slow-request log lines)

docs/tracing.md says how it is deployed and read.
"""
