"""OTLP/HTTP export, shared by every OTLP output (the trace relay, the OTLP metrics output).

- :mod:`telemetry.otlp.endpoint`: ``otlp+https://`` (SigV4-signed) and ``otlp+http://`` (plain) endpoints,
  with the AWS service and region a signature needs;
- :mod:`telemetry.otlp.sigv4`: signing the exact bytes sent, with credentials from the standard AWS chain;
- :mod:`telemetry.otlp.signals`: what differs between traces and metrics (unit counted, limits, response type);
- :mod:`telemetry.otlp.otlpjson`: OTLP/JSON in (Triton sends only JSON), ids read as hex;
- :mod:`telemetry.otlp.exporter`: a sender thread behind a bounded FIFO that batches, gzips, signs, posts
  and retries, so the producer never waits on the network and every drop is counted.
"""

# No re-exports: importing the endpoint parser (every settings table does) must not pull in requests and
# the exporter; import from the submodules.
