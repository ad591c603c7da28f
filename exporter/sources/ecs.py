"""ECS task metadata (v4): who this task is, attached to events as properties.

Properties, not dimensions: a task id as a dimension would make every task
a new set of billed custom metrics. Read until it succeeds once, then
cached; the endpoint only exists inside ECS (``ECS_CONTAINER_METADATA_URI_V4``).
"""

from __future__ import annotations

import orjson

from triton_http import Client

from . import Collected, SourceError, SourceKind
from .fetch import fetch

_FIELDS = {
    "Cluster": "ecs_cluster",
    "TaskARN": "ecs_task_arn",
    "Family": "ecs_task_family",
    "Revision": "ecs_task_revision",
    "AvailabilityZone": "availability_zone",
    "LaunchType": "ecs_launch_type",
    "ServiceName": "ecs_service",
}


class EcsMetadataSource:
    name = "ecs_metadata"
    kind = SourceKind.METADATA

    def __init__(self, base_url: str, connect_timeout: float, http: Client | None = None) -> None:
        self.url = base_url.rstrip("/") + "/task"
        self.http = http or Client(connect_timeout, 1 << 20)
        self.cached: dict[str, object] | None = None

    def collect(self, timeout: float) -> Collected:
        if self.cached is None:
            resp = fetch(self.http, "GET", self.url, timeout)
            if resp.status != 200:
                raise SourceError(f"{self.url}: answered HTTP {resp.status}")
            try:
                data = orjson.loads(resp.body)
            except orjson.JSONDecodeError:
                raise SourceError(f"{self.url}: answered non-JSON") from None
            if not isinstance(data, dict):
                raise SourceError(f"{self.url}: answered JSON that is not an object")
            self.cached = {prop: data[key] for key, prop in _FIELDS.items() if isinstance(data.get(key), str | int)}
        return Collected(properties=dict(self.cached))

    def close(self) -> None:
        pass  # the client holds no connection between calls
