"""The real OTLP metrics output, keeping its encoded Metric messages instead of posting them."""

from __future__ import annotations

from catalog import Catalog
from exporter.otlp_output import OtlpMetricsOutput
from exporter.pipeline import Scrape

from .helpers import CATALOG


class Recording(OtlpMetricsOutput):
    def __init__(self, catalog: Catalog = CATALOG, genai: bool = False) -> None:
        super().__init__(catalog, [], "triton-server", exporters=[], genai=genai)
        self.items: list[tuple[bytes, int]] = []

    def export(self, scrape: Scrape) -> None:
        self.items += self.encode(scrape)
