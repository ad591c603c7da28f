"""The trace relay: Triton's OpenTelemetry spans in on localhost, ECS context added, forwarded, measured.

    receiver.py   OTLP/HTTP on 127.0.0.1:4318 (JSON as Triton sends it, protobuf), never blocking
    spans.py      span kinds (SERVER root, INTERNAL inside), per-phase latency from span events
    context.py    ECS resource attributes from the task metadata
    window.py     phase histograms and the slowest requests between two scrapes
    relay.py      receiver -> bounded queue -> worker -> forwarder
    sampling.py   Triton's trace rate applied at runtime
    source.py     the relay as a pipeline source (series, per-model properties, slow-request log lines)

docs/tracing.md says how it is deployed and read.
"""
