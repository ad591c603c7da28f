"""ECS task metadata: identity goes into properties, never dimensions.

The metadata endpoint exists only inside ECS, so a loopback server serves a
task document shaped like the v4 endpoint's (field names from the AWS docs).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.__main__ import build_sources
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.sources import SourceError
from exporter.sources.ecs import EcsMetadataSource
from tests.support.helpers import CATALOG, documents, model_doc, task_doc
from tests.support.helpers import ECS_TASK as TASK


def test_metadata_is_read_once_and_cached(metadata_server):
    url, hits = metadata_server
    source = EcsMetadataSource(url, connect_timeout=1.0)
    first = source.collect(2.0).properties
    second = source.collect(2.0).properties
    assert (
        first
        == second
        == {
            "ecs_cluster": TASK["Cluster"],
            "ecs_task_arn": TASK["TaskARN"],
            "ecs_task_family": "triton",
            "ecs_task_revision": "7",
            "availability_zone": "us-east-1b",
            "ecs_launch_type": "EC2",
        }
    )
    assert hits == ["/v4/abc/task"]


def test_unreachable_metadata_is_a_source_error():
    with pytest.raises(SourceError, match="cannot connect"):
        EcsMetadataSource("http://127.0.0.1:9/v4/x", connect_timeout=0.5).collect(1.0)


@pytest.mark.triton
def test_task_identity_is_a_property_on_events_not_a_dimension(triton, metadata_server):
    url, _ = metadata_server
    settings = replace(
        Settings(triton_url=triton.url, metrics_url=triton.metrics_url, nvml="off"), ecs_metadata_url=url
    )
    docs = documents(Pipeline(settings, CATALOG, build_sources(settings, CATALOG)).cycle())
    task = task_doc(docs)
    assert task["ecs_task_arn"] == TASK["TaskARN"] and task["availability_zone"] == "us-east-1b"
    assert model_doc(docs, "add")["ecs_task_arn"] == TASK["TaskARN"]
    for doc in docs:
        dims = {k for d in doc["_aws"]["CloudWatchMetrics"] for s in d["Dimensions"] for k in s}
        assert not any(k.startswith("ecs_") or k == "availability_zone" for k in dims)
    assert {d["source"] for d in docs if "SourceUp" in d} == {"triton_metrics", "triton_index", "ecs_metadata"}
