"""Triton's trace rate, applied at runtime through its trace settings API and kept applied.

``POST /v2/trace/setting {"trace_rate": "N"}`` changes the global rate (1
request in N traced) without a restart; a restarted Triton is back at its
flags' rate, so every scrape reads the setting and posts again when it
differs. A client's W3C ``traceparent`` is traced whatever the rate (seen on
Triton 2.51), which is how one request is followed end to end.
"""

from __future__ import annotations

import orjson

from telemetry.logs import Conditions, get
from triton_http import AdminKey, Client, admin_headers, refusal_hint

from ..sources import SourceError
from ..sources.fetch import fetch

log = get("traces.sampling")


class TraceRate:
    def __init__(
        self, triton_url: str, rate: int, connect_timeout: float = 1.0, admin_key: AdminKey | None = None
    ) -> None:
        self.url = triton_url.rstrip("/") + "/v2/trace/setting"
        self.rate = str(rate)
        self.admin_key = admin_key  # the trace settings are a restricted API where Triton has the admin key
        self.http = Client(connect_timeout, 1 << 16, headers=admin_headers(admin_key))
        self.conditions = Conditions(log)
        self.applied = 0  # times we had to post it (1 at start, one more per Triton restart)

    def keep(self, timeout: float) -> None:
        """Read Triton's setting and post ours when it differs; a failure is logged once, never raised."""
        try:
            resp = fetch(self.http, "GET", self.url, timeout)
            if resp.status == 403:
                hint = refusal_hint(resp.status, resp.body, self.admin_key)
                raise SourceError(f"{self.url}: answered HTTP 403{hint}")
            current = orjson.loads(resp.body).get("trace_rate") if resp.status == 200 else None
            if current != self.rate:
                resp = fetch(self.http, "POST", self.url, timeout, {"trace_rate": self.rate})
                if resp.status != 200:
                    raise SourceError(f"{self.url}: answered HTTP {resp.status}: {resp.body[:200]!r}")
                self.applied += 1
                log.info("Triton's trace rate set to %s (was %s)", self.rate, current)
            self.conditions.set("trace_rate", None)
        except (SourceError, orjson.JSONDecodeError, AttributeError) as exc:
            self.conditions.set("trace_rate", f"cannot apply --trace-rate {self.rate}: {exc}")
