"""The trace relay: Triton's OpenTelemetry spans in on localhost, ECS context added, forwarded, measured.

    receiver.py   OTLP/HTTP on 127.0.0.1:4318 (JSON as Triton sends it, protobuf): a bounded boundary
    spans.py      ids and attribute bounds checked, span kinds (SERVER root, INTERNAL inside), phases
    context.py    ECS resource attributes from the task metadata
    window.py     phase histograms and the slowest requests between two scrapes (listed models only)
    relay.py      receiver -> bounded queue -> worker -> forwarder
    sampling.py   Triton's trace rate applied at runtime
    source.py     the relay as a pipeline source (series, per-model properties, slow-request log lines)

docs/tracing.md says how it is deployed and read.
"""
