"""OTLP: OpenTelemetry's protocol, over HTTP, as the relay receives it and the exporters send it."""
