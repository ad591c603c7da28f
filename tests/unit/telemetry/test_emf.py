"""EMF encoder limits and the validator, cross-checked against the aws-embedded-metrics library."""

from __future__ import annotations

import time

import orjson
import pytest
from aws_embedded_metrics import constants as aem_constants
from aws_embedded_metrics import validator as aem_validator
from aws_embedded_metrics.exceptions import InvalidDimensionError
from aws_embedded_metrics.storage_resolution import StorageResolution
from aws_embedded_metrics.unit import Unit as AemUnit
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import BASE_DIMENSIONS, CLOUDWATCH_UNITS, Input, Kind, Metric, Scope
from telemetry import emf
from telemetry.emf import Encoder, Event, dimensions_for, safe_dimension_value
from telemetry.emf_validate import validate
from tests.support.helpers import CATALOG

NOW = int(time.time() * 1000)


def test_our_units_are_the_libraries_units():
    assert set(CLOUDWATCH_UNITS) == {u.value for u in AemUnit}
    assert {m.unit for m in CATALOG.metrics} <= set(CLOUDWATCH_UNITS)


def test_named_limits_match_the_library_constants():
    assert emf.MAX_METRICS_PER_DIRECTIVE == aem_constants.MAX_METRICS_PER_EVENT
    assert emf.MAX_DIMENSIONS_PER_SET == aem_constants.MAX_DIMENSION_SET_SIZE
    assert emf.MAX_DIMENSION_VALUE_LENGTH == aem_constants.MAX_DIMENSION_VALUE_LENGTH
    # PutMetricData documents 1-255 characters; the library lets 256 through. Keep the stricter one.
    assert emf.MAX_NAMESPACE_LENGTH == 255 < aem_constants.MAX_NAMESPACE_LENGTH


def test_catalog_respects_emf_rules():
    names = [m.name for m in CATALOG.metrics]
    assert len(names) == len(set(names))
    for m in CATALOG.metrics:
        aem_validator.validate_metric(m.name, 1.0, m.unit, StorageResolution.STANDARD, {})
        for dims in m.dimension_sets:
            assert len(dims) <= emf.MAX_DIMENSIONS_PER_SET
        assert m.name[0].isupper()  # metric keys never collide with lower-case dimension/property keys


def _event(n_metrics: int, **dims: str) -> tuple[Encoder, Event]:
    metrics = [Metric(f"M{i}", Scope.MODEL, "Count", Kind.GAUGE, "x", (Input("s", "s"),)) for i in range(n_metrics)]
    enc = Encoder("Triton", metrics)
    props: dict[str, object] = {}
    dims = dimensions_for(BASE_DIMENSIONS[Scope.MODEL], {"model": "m", "version": "1", **dims}, props)
    return enc, Event(Scope.MODEL, dims, {f"M{i}": float(i) for i in range(n_metrics)}, props)


def test_more_than_100_metrics_are_split_across_directives():
    enc, event = _event(250)
    [doc] = enc.encode(event, NOW)
    assert validate(doc, NOW) == []
    directives = orjson.loads(doc)["_aws"]["CloudWatchMetrics"]
    assert [len(d["Metrics"]) for d in directives] == [100, 100, 50]


def test_oversize_event_drops_properties_then_still_valid():
    enc, event = _event(3)
    event.properties["reason"] = "r" * (300 * 1024)
    [doc], cut = enc.encode_counted(event, NOW)
    assert len(doc) < emf.MAX_EVENT_BYTES
    assert orjson.loads(doc)["truncated"] is True
    assert validate(doc, NOW) == []
    assert cut is True
    _, small = _event(3)
    assert enc.encode_counted(small, NOW)[1] is False
    docs, oversize = enc.encode_all([small, event, small], NOW)  # one count per event that was cut down
    assert len(docs) == 3 and oversize == 1


def test_non_finite_values_never_reach_the_document():
    enc, event = _event(3)
    event.values["M1"] = float("nan")
    event.values["M2"] = float("inf")
    [doc] = enc.encode(event, NOW)
    parsed = orjson.loads(doc)
    assert parsed["M0"] == 0 and "M1" not in parsed and "M2" not in parsed
    assert validate(doc, NOW) == []


def test_aws_is_the_first_key_for_fluent_bit_routing():
    enc, event = _event(2)
    assert enc.encode(event, NOW)[0].startswith(b'{"_aws":{"Timestamp":')


def test_encoder_refuses_bad_namespaces():
    for bad in ("", "AWS/Triton", "x" * 256, "Tritön"):
        with pytest.raises(ValueError):
            Encoder(bad, CATALOG.metrics)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=1500))
def test_any_model_name_becomes_a_valid_dimension(raw):
    safe = safe_dimension_value(raw)
    assert safe == safe_dimension_value(raw)  # deterministic
    aem_validator.validate_dimension_set({"model": safe.value})  # the library's own rules accept it
    assert safe.value.isprintable() and len(safe.value) <= emf.MAX_DIMENSION_VALUE_LENGTH
    assert safe.changed == (safe.value != raw)


def test_changed_names_stay_distinct_and_keep_the_original():
    a, b = safe_dimension_value("modèle"), safe_dimension_value("mod_le")
    assert a.value != b.value and a.changed and not b.changed
    props: dict[str, object] = {}
    dims = dimensions_for(BASE_DIMENSIONS[Scope.MODEL], {"model": "modèle", "version": "1"}, props)
    assert props["model_original"] == "modèle" and dims["model"] == a.value


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("_aws"), "missing _aws"),
        (lambda d: d["_aws"].update(Timestamp="now"), "Timestamp must be an integer"),
        (lambda d: d["_aws"].update(Timestamp=1), "outside"),
        (lambda d: d["_aws"]["CloudWatchMetrics"][0].update(Namespace="AWS/x"), "must not start with AWS/"),
        (lambda d: d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0].update(Unit="Watts"), "not a CloudWatch unit"),
        (lambda d: d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0].update(StorageResolution=5), "StorageResolution"),
        (lambda d: d.update(model="modèle"), "ASCII"),
        (lambda d: d.update(model=""), "ASCII"),
        (lambda d: d.pop("version"), "no string value"),
        (lambda d: d.update(M0="1"), "not a finite number"),
        (lambda d: d.update(M0=[1.0] * 101), "1-100 values"),
        (lambda d: d["_aws"]["CloudWatchMetrics"][0]["Dimensions"].append([f"k{i}" for i in range(31)]), "over 30"),
        (
            lambda d: d["_aws"]["CloudWatchMetrics"][0]["Metrics"].extend([{"Name": f"X{i}"} for i in range(100)]),
            "over 100",
        ),
    ],
)
def test_validator_catches_each_rule(mutate, message):
    enc, event = _event(2)
    doc = orjson.loads(enc.encode(event, NOW)[0])
    assert validate(doc, NOW) == []
    mutate(doc)
    errors = validate(doc, NOW)
    assert any(message in e for e in errors), errors


def test_validator_agrees_with_the_library_on_dimension_values():
    for value in ("ok", "modèle", " ", "x" * 1025):
        library_ok = True
        try:
            aem_validator.validate_dimension_set({"model": value})
        except InvalidDimensionError:
            library_ok = False
        enc, event = _event(1)
        doc = orjson.loads(enc.encode(event, NOW)[0])
        doc["model"] = value
        assert (validate(doc, NOW) == []) == library_ok, value


def test_validator_on_raw_bytes():
    assert validate(b"not json") and validate(b"[]") and validate(b"{}")
    enc, event = _event(1)
    assert validate(enc.encode(event, NOW)[0] + b" " * emf.MAX_EVENT_BYTES, NOW)
