"""The NVML source against the faithful pynvml fake: fields, failures, XID events, MIG, and the Triton join."""

from __future__ import annotations

import inspect
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pynvml
import pytest

from demo.payloads import triton_metrics
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.sources import SourceError, SourceRequired, nvml
from exporter.sources.nvml import NVML_CALLS, NvmlSource, make_nvml_source, select
from tests.support import nvml_fake as fk
from tests.support.fakes import closed_port
from tests.support.helpers import CATALOG, IndexSource, TextSource, documents
from tests.support.paths import REPO

U = fk.UUIDS


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def values(collected, series: str) -> dict[str, float]:
    """uuid -> value of one series."""
    labels = collected.samples.labels
    return {labels[k].get("gpu_uuid"): v for k, v in collected.samples.samples.get(series, {}).items()}


def started(fake: fk.FakeNvml, environ: dict[str, str] | None = None, clock: Clock | None = None) -> NvmlSource:
    source = NvmlSource(fake, environ or {}, clock=clock or Clock())
    source.start()
    return source


# --- the fake is faithful to pynvml ------------------------------------------------------------------


@pytest.mark.parametrize("name", NVML_CALLS)
def test_fake_has_pynvml_name_and_parameters(name: str) -> None:
    real = getattr(pynvml, name)
    fake = getattr(fk.FakeNvml(), name)
    assert list(inspect.signature(fake).parameters) == list(inspect.signature(real).parameters)


def test_fake_raises_real_pynvml_error_classes() -> None:
    fake = fk.field_not_supported()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported) as info:
        fake.nvmlDeviceGetPowerUsage(h)
    assert info.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(fake.nvmlEventSetCreate(), 0)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fk.library_missing().nvmlInit()
    with pytest.raises(AttributeError):
        fake.nvmlDeviceGetFanSpeed  # noqa: B018 - a real function the fake lacks is never forwarded


# --- fields ------------------------------------------------------------------------------------------


def test_two_healthy_gpus_every_series_in_si_units() -> None:
    fake = fk.two_healthy()
    got = started(fake).collect(5.0)
    assert set(got.gpus) == {U[0], U[1]}
    assert values(got, "nvml_power_usage_watts") == {U[0]: 120.5, U[1]: 120.5}  # from 120500 mW
    assert values(got, "nvml_power_limit_watts")[U[0]] == 300.0
    assert values(got, "nvml_energy_joules")[U[0]] == 1000.0  # from 1,000,000 mJ
    assert values(got, "nvml_gpu_utilization_percent") == {U[0]: 10.0, U[1]: 11.0}
    assert values(got, "nvml_temperature_gpu_celsius") == {U[0]: 40.0, U[1]: 41.0}
    assert values(got, "nvml_memory_used_bytes")[U[0]] == 6 * 1024**3
    assert values(got, "nvml_memory_reserved_bytes")[U[0]] == 300 * 1024**2
    assert values(got, "nvml_clock_sm_mhz")[U[1]] == 1710.0
    assert values(got, "nvml_gpu_lost") == {U[0]: 0.0, U[1]: 0.0}
    assert values(got, "nvml_xid_errors_total") == {U[0]: 0.0, U[1]: 0.0}
    assert "nvml_temperature_memory_celsius" not in got.samples.samples  # GDDR board: no HBM sensor
    info = got.gpus[U[1]]
    assert info.index == 1
    assert info.properties["pci_bus_id"] == "00000000:11:00.0"  # bytes from pynvml, decoded
    assert info.properties["gpu_name"] == "NVIDIA A10G"
    assert info.properties["driver_version"] == "550.127.05"


def test_throttle_reasons_are_separate_flags() -> None:
    fake = fk.two_healthy()
    fake.gpus[0].clock_reasons = pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonGpuIdle
    fake.gpus[1].clock_reasons = pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwSlowdown
    got = started(fake).collect(5.0)
    assert values(got, "nvml_throttle_thermal") == {U[0]: 1.0, U[1]: 0.0}
    assert values(got, "nvml_throttle_power_cap") == {U[0]: 0.0, U[1]: 1.0}
    assert values(got, "nvml_throttle_hw_slowdown") == {U[0]: 0.0, U[1]: 1.0}


def test_ecc_remapped_rows_and_pcie_replays() -> None:
    fake = fk.two_healthy()
    fake.gpus[0].ecc, fake.gpus[0].remapped, fake.gpus[0].pcie_replay = (5, 1), (3, 1, 1, 0), 9
    got = started(fake).collect(5.0)
    assert values(got, "nvml_ecc_corrected_total")[U[0]] == 5.0
    assert values(got, "nvml_ecc_uncorrected_total")[U[0]] == 1.0
    assert values(got, "nvml_remapped_rows_correctable")[U[0]] == 3.0
    assert values(got, "nvml_remapped_rows_pending")[U[0]] == 1.0
    assert values(got, "nvml_remapped_rows_failure")[U[0]] == 0.0
    assert values(got, "nvml_pcie_replay_total")[U[0]] == 9.0


def test_unsupported_field_is_left_out_for_that_device_only_and_not_asked_again() -> None:
    fake = fk.field_not_supported()
    source = started(fake)
    got = source.collect(5.0)
    assert values(got, "nvml_power_usage_watts") == {U[0]: 120.5}  # not 0, not NaN: absent
    assert set(values(got, "nvml_energy_joules")) == {U[0]}
    assert set(values(got, "nvml_ecc_corrected_total")) == {U[0]}
    assert set(values(got, "nvml_remapped_rows_pending")) == {U[0]}
    assert set(values(got, "nvml_temperature_gpu_celsius")) == {U[0], U[1]}  # the device stays
    calls = fake.calls
    source.collect(5.0)
    per_cycle = fake.calls - calls
    source.collect(5.0)
    assert fake.calls - calls == 2 * per_cycle  # steady: the unsupported calls are not retried
    assert per_cycle < 2 * 17  # fewer than two complete devices' worth of calls


def test_one_transient_field_error_keeps_the_device_and_is_retried() -> None:
    fake = fk.two_healthy()
    fake.gpus[0].failing["nvmlDeviceGetClockInfo"] = pynvml.NVML_ERROR_UNKNOWN
    source = started(fake)
    got = source.collect(5.0)
    assert set(values(got, "nvml_clock_sm_mhz")) == {U[1]}
    assert set(values(got, "nvml_power_usage_watts")) == {U[0], U[1]}
    del fake.gpus[0].failing["nvmlDeviceGetClockInfo"]
    assert set(values(source.collect(5.0), "nvml_clock_sm_mhz")) == {U[0], U[1]}


def test_old_driver_uses_older_entry_points_once_found() -> None:
    fake = fk.FakeNvml(fk.gpus(1), old_driver=True)
    source = started(fake)
    got = source.collect(5.0)
    assert values(got, "nvml_memory_used_bytes")[U[0]] == 6 * 1024**3 + 300 * 1024**2  # v1: includes reserved
    assert "nvml_memory_reserved_bytes" not in got.samples.samples
    assert values(got, "nvml_temperature_gpu_celsius")[U[0]] == 40.0
    assert values(got, "nvml_throttle_thermal")[U[0]] == 0.0
    calls = fake.calls
    source.collect(5.0)
    healthy = fk.FakeNvml(fk.gpus(1))
    new = started(healthy)
    new.collect(5.0)
    before = healthy.calls
    new.collect(5.0)
    assert fake.calls - calls == healthy.calls - before  # no FunctionNotFound round trip per cycle


def test_error_numbers_and_constants_are_pynvmls() -> None:
    for name in (
        "NOT_SUPPORTED",
        "NO_PERMISSION",
        "NOT_FOUND",
        "DRIVER_NOT_LOADED",
        "TIMEOUT",
        "UNINITIALIZED",
        "LIBRARY_NOT_FOUND",
        "FUNCTION_NOT_FOUND",
        "GPU_IS_LOST",
        "LIB_RM_VERSION_MISMATCH",
        "ARGUMENT_VERSION_MISMATCH",
    ):
        assert getattr(nvml, name) == getattr(pynvml, f"NVML_ERROR_{name}"), name
    assert pynvml.nvmlMemory_v2 == nvml.MEMORY_V2
    assert nvml.MEMORY_TEMP_FIELD == pynvml.NVML_FI_DEV_MEMORY_TEMP
    assert pynvml.nvmlEventTypeXidCriticalError == nvml.XID_EVENT


# field -> (newer entry point, older entry point, a series it yields, GPU 0's value through the older call)
FALLBACKS = {
    "temperature": ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature", "nvml_temperature_gpu_celsius", 40.0),
    "memory": (
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetMemoryInfo",
        "nvml_memory_used_bytes",
        float(6 * 1024**3 + 300 * 1024**2),
    ),  # v1: used includes the driver's reservation
    "throttle": (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvml_throttle_thermal",
        1.0,
    ),
}
NEWER_ERRORS = {
    "FUNCTION_NOT_FOUND": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    "ARGUMENT_VERSION_MISMATCH": pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    "NOT_SUPPORTED": pynvml.NVML_ERROR_NOT_SUPPORTED,
}


def _fallback_fake() -> fk.FakeNvml:
    fake = fk.FakeNvml(fk.gpus(2))
    fake.gpus[0].clock_reasons = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    return fake


@pytest.mark.parametrize("error", NEWER_ERRORS)
@pytest.mark.parametrize("reader", FALLBACKS)
def test_newer_entry_point_refusing_falls_back_to_the_older_one_on_that_gpu(reader: str, error: str) -> None:
    newer, older, series, expected = FALLBACKS[reader]
    fake = _fallback_fake()
    fake.gpus[0].failing[newer] = NEWER_ERRORS[error]
    source = started(fake)
    got = source.collect(5.0)
    assert values(got, series)[U[0]] == expected  # the field is not lost
    assert fake.called[older] == 1  # only GPU 0 needed the older call
    if reader == "memory":  # GPU 1 keeps v2 (reserved reported apart); GPU 0 has no such field in v1
        assert set(values(got, "nvml_memory_reserved_bytes")) == {U[1]}
    newer_calls = fake.called[newer]
    got = source.collect(5.0)
    assert values(got, series)[U[0]] == expected
    assert fake.called[newer] - newer_calls == 1  # GPU 1 only: GPU 0 is not asked the newer call again
    assert fake.called[older] == 2


@pytest.mark.parametrize("error", NEWER_ERRORS)
@pytest.mark.parametrize("reader", FALLBACKS)
def test_field_left_out_only_when_both_entry_points_fail(reader: str, error: str) -> None:
    newer, older, series, _ = FALLBACKS[reader]
    fake = _fallback_fake()
    fake.gpus[0].failing[newer] = NEWER_ERRORS[error]
    fake.gpus[0].failing[older] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = started(fake)
    assert set(values(source.collect(5.0), series)) == {U[1]}
    asked = fake.called[newer] + fake.called[older]
    assert set(values(source.collect(5.0), series)) == {U[1]}
    assert fake.called[newer] + fake.called[older] - asked == 1  # unsupported on GPU 0: neither asked again


def test_older_entry_point_failing_transiently_is_retried_next_cycle() -> None:
    fake = _fallback_fake()
    fake.gpus[0].failing["nvmlDeviceGetTemperatureV"] = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    fake.gpus[0].failing["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    source = started(fake)
    assert set(values(source.collect(5.0), "nvml_temperature_gpu_celsius")) == {U[1]}
    del fake.gpus[0].failing["nvmlDeviceGetTemperature"]
    assert values(source.collect(5.0), "nvml_temperature_gpu_celsius") == {U[0]: 40.0, U[1]: 41.0}


@pytest.mark.parametrize("error", ["ARGUMENT_VERSION_MISMATCH", "NOT_SUPPORTED"])
def test_driver_refusing_every_newer_entry_point_keeps_every_field(error: str) -> None:
    fake = fk.FakeNvml(fk.gpus(2), newer_error=NEWER_ERRORS[error])
    healthy = started(fk.FakeNvml(fk.gpus(2))).collect(5.0).samples.samples
    got = started(fake).collect(5.0).samples.samples
    assert set(got) == set(healthy) - {"nvml_memory_reserved_bytes"}  # v1 memory has no reserved field


def test_memory_temperature_from_field_values_on_hbm_boards() -> None:
    got = started(fk.mig_enabled()).collect(5.0)
    assert values(got, "nvml_temperature_memory_celsius") == {U[0]: 48.0, U[1]: 48.0}


# --- lost GPU, MIG -----------------------------------------------------------------------------------


def test_lost_gpu_is_a_one_on_gpu_lost_and_the_other_gpu_keeps_flowing() -> None:
    fake = fk.gpu_lost()
    source = started(fake)
    source.collect(5.0)
    fake.lose(1)
    got = source.collect(5.0)
    assert values(got, "nvml_gpu_lost") == {U[0]: 0.0, U[1]: 1.0}
    assert set(values(got, "nvml_gpu_utilization_percent")) == {U[0]}
    assert set(values(got, "nvml_temperature_gpu_celsius")) == {U[0]}
    assert U[1] in got.gpus  # still described, so the event carries its uuid and index


def test_mig_parent_reported_with_mode_and_instance_count() -> None:
    source = started(fk.mig_enabled())
    got = source.collect(5.0)
    assert got.gpus[U[0]].properties["mig_mode"] == "enabled"
    assert got.gpus[U[0]].properties["mig_devices"] == 2
    assert got.gpus[U[1]].properties["mig_mode"] == "disabled"
    assert set(values(got, "nvml_gpu_utilization_percent")) == {U[1]}  # not available on a MIG parent
    assert set(values(got, "nvml_memory_used_bytes")) == {U[0], U[1]}  # parent memory still is


def test_cuda_visible_devices_with_a_mig_uuid_selects_its_parent() -> None:
    fake = fk.mig_enabled()
    source = started(fake, {"CUDA_VISIBLE_DEVICES": fake.gpus[0].mig_devices[1]})
    got = source.collect(5.0)
    assert set(got.gpus) == {U[0]}
    assert got.gpus[U[0]].index == 0


# --- which GPUs, and the gpu dimension ---------------------------------------------------------------

FOUND = [(0, U[0]), (1, U[1]), (2, U[2]), (3, U[3])]


@pytest.mark.parametrize(
    ("nvidia", "cuda", "expected"),
    [
        (None, None, [U[0], U[1], U[2], U[3]]),
        ("all", None, [U[0], U[1], U[2], U[3]]),
        ("void", "", [U[0], U[1], U[2], U[3]]),  # empty CUDA_VISIBLE_DEVICES: the exporter does not use CUDA
        (f"{U[2]},{U[0]}", None, [U[0], U[2]]),  # runtime list: NVML (PCI) order kept
        ("3,1", None, [U[1], U[3]]),  # indices, and NVML sees the whole host: host indices
        (None, "2,0", [U[2], U[0]]),  # CUDA order is the gpu dimension
        (None, f"{U[3][:12]},1", [U[3], U[1]]),  # unique UUID prefix
        (None, "1,7,0", [U[1]]),  # CUDA stops at the first invalid entry
        (None, "GPU-0000000", []),  # ambiguous prefix matches nothing
        (f"{U[1]},{U[2]}", "1", [U[2]]),  # CUDA indexes what the runtime left
    ],
)
def test_select_rules(nvidia: str | None, cuda: str | None, expected: list[str]) -> None:
    assert select(FOUND, nvidia, cuda) == expected


def test_select_index_list_already_applied_by_the_runtime_is_not_reapplied() -> None:
    # NVIDIA_VISIBLE_DEVICES=2,3 and the runtime gave exactly two GPUs, renumbered 0 and 1 in here
    assert select([(0, U[2]), (1, U[3])], "2,3", None) == [U[2], U[3]]


def test_gpu_dimension_follows_cuda_visible_devices_order() -> None:
    got = started(fk.two_healthy(), {"CUDA_VISIBLE_DEVICES": "1,0"}).collect(5.0)
    assert got.gpus[U[1]].index == 0 and got.gpus[U[0]].index == 1
    assert got.gpus[U[1]].properties["nvml_index"] == 1


def test_gpus_not_read_before_the_timeout_are_left_out_of_the_cycle() -> None:
    ticks = iter(range(1, 1000))
    source = NvmlSource(fk.two_healthy(), {}, clock=lambda: float(next(ticks)))
    source.start()
    got = source.collect(1.5)  # the clock moves 1 s per look: time for one GPU only
    assert set(got.gpus) == {U[0]}
    assert set(values(got, "nvml_temperature_gpu_celsius")) == {U[0]}


# --- NVML absent or failing --------------------------------------------------------------------------


def test_library_missing_auto_on_a_cpu_host_warns_once_and_reports_down(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="exporter.nvml"):
        source = make_nvml_source("auto", fk.library_missing(), {}, dev=tmp_path)
    assert source is not None  # kept: SourceUp{source=nvml}=0 tells the truth every cycle
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "--nvml off" in warnings[0]
    with pytest.raises(SourceError, match=r"libnvidia-ml\.so\.1"):
        source.collect(5.0)


def test_library_missing_auto_with_gpu_hints_reports_the_source_down(tmp_path: Path) -> None:
    source = make_nvml_source("auto", fk.library_missing(), {"NVIDIA_VISIBLE_DEVICES": "all"}, dev=tmp_path)
    assert source is not None
    with pytest.raises(SourceError, match=r"libnvidia-ml\.so\.1"):
        source.collect(5.0)


def test_library_missing_auto_reports_down_and_retries_slowly(tmp_path: Path) -> None:
    fake = fk.library_missing()
    clock = Clock()
    source = make_nvml_source("auto", fake, {"NVIDIA_VISIBLE_DEVICES": "all"}, dev=tmp_path)
    assert source is not None
    source.clock = clock
    source.next_try = clock.now + source.retry_interval
    messages = set()
    for _ in range(10):  # ten cycles inside the retry interval: no new nvmlInit, same one-line reason
        with pytest.raises(SourceError) as info:
            source.collect(5.0)
        messages.add(str(info.value))
        clock.now += 10
    assert fake.inits == 0 and fake.calls == 1
    assert len(messages) == 1 and "\n" not in messages.pop()
    fake.library = True
    clock.now += 300
    got = source.collect(5.0)
    assert set(got.gpus) == {U[0], U[1]}
    assert fake.inits == 1


def test_pynvml_not_installed_reports_down(tmp_path: Path) -> None:
    assert make_nvml_source("off", fk.two_healthy(), {}) is None
    source = NvmlSource(None, {})
    with pytest.raises(SourceError, match="not installed"):
        source.collect(5.0)
    source.close()


@pytest.mark.parametrize(
    ("fake", "environ", "cause"),
    [
        (fk.library_missing, {"NVIDIA_VISIBLE_DEVICES": "all"}, r"NVML error 12\); libnvidia-ml\.so\.1 is not in"),
        (lambda: fk.FakeNvml(fk.gpus(1), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED), {}, r"error 9\).*not loaded"),
        (lambda: fk.FakeNvml(fk.gpus(1), init_error=pynvml.NVML_ERROR_NO_PERMISSION), {}, r"/dev/nvidiactl"),
        (
            lambda: fk.FakeNvml(fk.gpus(2)),
            {"NVIDIA_VISIBLE_DEVICES": "none", "CUDA_VISIBLE_DEVICES": "7"},
            r"no GPU visible",
        ),
    ],
)
def test_on_without_nvml_refuses_to_start_naming_the_cause(fake, environ, cause, tmp_path: Path) -> None:
    api = fake()
    with pytest.raises(SourceRequired, match=cause) as info:
        make_nvml_source("on", api, environ, dev=tmp_path)
    message = str(info.value)
    assert message.startswith("--nvml on (EXPORTER_NVML=on)") and "\n" not in message
    assert "retrying" not in message  # nothing retries: the sidecar stops
    assert api.refcount == 0  # NVML left shut down


def test_on_with_nvml_present_starts_and_later_failures_are_handled_as_under_auto(tmp_path: Path) -> None:
    fake = fk.two_healthy()
    source = make_nvml_source("on", fake, {}, dev=tmp_path)
    assert source is not None and source.ready
    fake.unload_driver()
    with pytest.raises(SourceError) as info:  # reported down, not a crash or an exit
        source.collect(5.0)
    assert not isinstance(info.value, SourceRequired)


def test_entry_point_maps_on_without_nvml_to_exit_2_with_one_line(monkeypatch, capsys) -> None:
    """Through exporter.__main__.main with the fake as pynvml: exit 2 for on, a normal run for auto."""
    from exporter import __main__ as entry
    from exporter.sources import nvml as nvml_module

    closed = f"http://127.0.0.1:{closed_port()}"
    argv = ["--once", "--interval", "0.05", "--triton-url", closed, "--triton-metrics-url", closed + "/metrics"]
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "all")
    monkeypatch.setattr(nvml_module, "load_api", fk.library_missing)
    assert entry.main(["--nvml", "on", *argv]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and err.startswith("exporter: error: --nvml on (EXPORTER_NVML=on)") and "error 12" in err
    )
    # auto with the same fake, and on with a working one, get past the sources to the scrape
    # (which fails here: exit 1, "cannot read Triton").
    for mode, api in (("auto", fk.library_missing), ("on", fk.two_healthy)):
        monkeypatch.setattr(nvml_module, "load_api", api)
        assert entry.main(["--nvml", mode, *argv]) == 1
        assert "cannot read Triton" in capsys.readouterr().err


def test_auto_with_nvml_present_keeps_the_source(tmp_path: Path) -> None:
    source = make_nvml_source("auto", fk.two_healthy(), {}, dev=tmp_path)
    assert source is not None and source.ready


def test_no_permission_is_explained() -> None:
    source = NvmlSource(fk.FakeNvml(fk.gpus(1), init_error=pynvml.NVML_ERROR_NO_PERMISSION), {})
    with pytest.raises(SourceError, match="/dev/nvidiactl"):
        source.collect(5.0)


def test_driver_unloaded_mid_run_shuts_down_then_reinitialises_after_the_retry_interval() -> None:
    fake = fk.two_healthy()
    clock = Clock()
    source = started(fake, clock=clock)
    source.collect(5.0)
    fake.unload_driver()
    with pytest.raises(SourceError, match="stopped answering"):
        source.collect(5.0)
    assert fake.refcount == 0 and fake.shutdowns == 1
    fake.load_driver()
    clock.now += 60
    with pytest.raises(SourceError):
        source.collect(5.0)
    assert fake.inits == 1
    clock.now += 300
    assert set(source.collect(5.0).gpus) == {U[0], U[1]}
    assert fake.inits == 2


def test_close_frees_the_event_set_and_shuts_nvml_down_once() -> None:
    fake = fk.two_healthy()
    source = started(fake)
    source.collect(5.0)
    source.close()
    source.close()
    assert fake.refcount == 0 and fake.shutdowns == 1
    assert all(s.freed for s in fake.event_sets)


# --- XID events --------------------------------------------------------------------------------------


def test_xid_events_are_drained_without_blocking_and_counted_per_gpu() -> None:
    fake = fk.xid_events()
    timeouts: list[int] = []
    real_wait = fake.nvmlEventSetWait

    def wait(eventSet, timeoutms):
        timeouts.append(timeoutms)
        return real_wait(eventSet, timeoutms)

    fake.nvmlEventSetWait = wait  # type: ignore[method-assign]
    source = started(fake)
    assert values(source.collect(5.0), "nvml_xid_errors_total") == {U[0]: 0.0, U[1]: 0.0}
    fake.inject_xid(1, 79)
    fake.inject_xid(1, 48)
    fake.inject_xid(0, 13)
    got = source.collect(5.0)
    assert values(got, "nvml_xid_errors_total") == {U[0]: 1.0, U[1]: 2.0}
    assert got.gpus[U[1]].properties["last_xid"] == 48
    assert got.gpus[U[0]].properties["last_xid"] == 13
    assert set(timeouts) == {0}
    assert values(source.collect(5.0), "nvml_xid_errors_total") == {U[0]: 1.0, U[1]: 2.0}  # running count


def test_xid_counts_survive_reinitialisation() -> None:
    fake = fk.xid_events()
    clock = Clock()
    source = started(fake, clock=clock)
    fake.inject_xid(0, 79)
    assert values(source.collect(5.0), "nvml_xid_errors_total")[U[0]] == 1.0
    fake.unload_driver()
    with pytest.raises(SourceError):
        source.collect(5.0)
    fake.load_driver()
    clock.now += 301
    assert values(source.collect(5.0), "nvml_xid_errors_total")[U[0]] == 1.0  # never goes down


# --- through the pipeline: the join with Triton's GPU series -----------------------------------------


def triton_text(step: int, gpus: list[str]) -> str:
    """One model's /metrics with these GPUs' nv_gpu_* series (each family in one block, as Triton prints it)."""
    return triton_metrics(["m"], step, gpus=gpus)


def run(sources, cycles: int, between=None) -> list:
    clock = Clock()
    pipeline = Pipeline(Settings(nvml="on"), CATALOG, sources, clock=clock)
    results = []
    for n in range(cycles):
        if between:
            between(n)
        results.append(pipeline.cycle())
        clock.now += 60
    return results


def gpu_docs(result) -> list[dict]:
    return [d for d in documents(result) if "gpu" in d]


def test_one_event_per_gpu_with_triton_and_nvml_metrics_joined_on_uuid() -> None:
    fake = fk.two_healthy()
    triton = TextSource(*(triton_text(step, [U[0], U[1]]) for step in (1, 2)))
    nvml = NvmlSource(fake, {}, clock=Clock())
    results = run([triton, IndexSource(), nvml], 2, between=lambda n: fake.advance(60))
    docs = gpu_docs(results[1])
    assert len(docs) == 2  # one event per GPU, not one per source
    by_uuid = {d["gpu_uuid"]: d for d in docs}
    for i, uuid in enumerate((U[0], U[1])):
        d = by_uuid[uuid]
        assert d["gpu"] == str(i)  # NVML's index is the gpu dimension for Triton's series too
        assert d["GpuUtilization"] == 50.0  # Triton (0.5 x 100) wins over NVML (10, 11)
        assert d["GpuEnergyJoules"] == 7230.0  # Triton's counter delta, not NVML's
        assert d["GpuPowerWatts"] == 120.5
        assert d["GpuTemperatureCelsius"] == 40.0 + i  # NVML only
        assert d["GpuSmClockMHz"] == 1710.0
        assert d["GpuThrottleThermal"] == 0.0
        assert d["GpuXidErrors"] == 0.0
        assert d["GpuLost"] == 0.0
        assert d["GpuMemoryReserved"] == 300 * 1024**2
        assert d["gpu_name"] == "NVIDIA A10G" and d["driver_version"] == "550.127.05"
        assert d["GpuMemoryUsedPercent"] == pytest.approx(6e9 / 24e9 * 100)  # Triton's pair wins
    source_docs = [d for d in documents(results[1]) if d.get("source") == "nvml"]
    assert source_docs and source_docs[0]["SourceUp"] == 1.0


def test_nvml_alone_fills_the_shared_gpu_metrics() -> None:
    fake = fk.two_healthy()
    triton = TextSource(*(triton_metrics(["m"], step) for step in (1, 2)))  # no nv_gpu_* (DCGM off)
    results = run([triton, IndexSource(), NvmlSource(fake, {}, clock=Clock())], 2, between=lambda n: fake.advance(60))
    d = {doc["gpu_uuid"]: doc for doc in gpu_docs(results[1])}[U[1]]
    assert d["GpuUtilization"] == 11.0
    assert d["GpuEnergyJoules"] == pytest.approx(120.5 * 60)  # delta of NVML's mJ counter, in J
    assert d["GpuMemoryUsedPercent"] == pytest.approx(6 / 24 * 100)
    assert d["gpu"] == "1"


def test_nvml_missing_keeps_triton_gpu_metrics_and_reports_source_down() -> None:
    triton = TextSource(*(triton_metrics(["m"], step, gpus=[U[0]]) for step in (1, 2)))
    results = run([triton, IndexSource(), NvmlSource(fk.library_missing(), {}, clock=Clock())], 2)
    docs = documents(results[1])
    gpu = [d for d in docs if "gpu" in d]
    assert len(gpu) == 1 and gpu[0]["GpuUtilization"] == 50.0 and gpu[0]["gpu"] == "0"
    assert "GpuTemperatureCelsius" not in gpu[0]
    up = {d["source"]: d["SourceUp"] for d in docs if "source" in d}
    assert up["nvml"] == 0.0 and up["triton_metrics"] == 1.0


def test_xid_errors_per_window_and_last_xid_property_in_emf() -> None:
    fake = fk.xid_events()

    def between(n: int) -> None:
        if n == 1:
            fake.inject_xid(0, 79)
            fake.inject_xid(0, 94)

    results = run(
        [TextSource(triton_metrics(["m"], 1)), IndexSource(), NvmlSource(fake, {}, clock=Clock())], 3, between=between
    )
    first = {d["gpu_uuid"]: d for d in gpu_docs(results[1])}
    assert first[U[0]]["GpuXidErrors"] == 2.0 and first[U[0]]["last_xid"] == 94
    assert first[U[1]]["GpuXidErrors"] == 0.0 and "last_xid" not in first[U[1]]
    assert {d["gpu_uuid"]: d for d in gpu_docs(results[2])}[U[0]]["GpuXidErrors"] == 0.0


def test_counter_reset_after_driver_reload_drops_one_window_then_recovers() -> None:
    fake = fk.driver_reload()

    def between(n: int) -> None:
        fake.advance(60)
        for g in fake.gpus:
            g.ecc = (g.ecc[0] + 2, 0)
            g.pcie_replay += 1
        if n == 2:
            fake.reset_counters()

    results = run(
        [TextSource(triton_metrics(["m"], 1)), IndexSource(), NvmlSource(fake, {}, clock=Clock())], 4, between=between
    )
    normal = {d["gpu_uuid"]: d for d in gpu_docs(results[1])}[U[0]]
    assert normal["GpuEccCorrectedErrors"] == 2.0 and normal["GpuPcieReplays"] == 1.0
    assert normal["GpuEnergyJoules"] == pytest.approx(120.5 * 60)
    reset = {d["gpu_uuid"]: d for d in gpu_docs(results[2])}[U[0]]
    assert "GpuEccCorrectedErrors" not in reset and "GpuEnergyJoules" not in reset  # no negative deltas
    assert reset["GpuTemperatureCelsius"] == 40.0  # gauges keep flowing
    assert results[2].resets == 2
    after = {d["gpu_uuid"]: d for d in gpu_docs(results[3])}[U[0]]
    assert after["GpuEccCorrectedErrors"] == 2.0 and after["GpuEnergyJoules"] == pytest.approx(120.5 * 60)


def test_lost_gpu_in_emf() -> None:
    fake = fk.gpu_lost()
    results = run(
        [TextSource(triton_metrics(["m"], 1)), IndexSource(), NvmlSource(fake, {}, clock=Clock())],
        2,
        between=lambda n: fake.lose(1) if n == 1 else None,
    )
    docs = {d["gpu_uuid"]: d for d in gpu_docs(results[1])}
    assert docs[U[1]]["GpuLost"] == 1.0 and docs[U[1]]["gpu"] == "1"
    assert "GpuTemperatureCelsius" not in docs[U[1]]
    assert docs[U[0]]["GpuLost"] == 0.0


def test_nvml_is_kept_to_the_gpus_triton_reports() -> None:
    """In ECS the sidecar sees every GPU of the host (NVIDIA_VISIBLE_DEVICES=all); Triton sees its own.

    Without the filter, two tasks on one host would each report the other's GPU, and summed
    metrics (XID, ECC) would count twice.
    """
    fake = fk.two_healthy()
    triton = TextSource(*(triton_text(step, [U[1]]) for step in (1, 2)))  # this task's Triton has GPU 1 only
    nvml = NvmlSource(fake, {}, clock=Clock())
    results = run([triton, IndexSource(), nvml], 2, between=lambda n: fake.advance(60))
    docs = gpu_docs(results[1])
    assert [d["gpu_uuid"] for d in docs] == [U[1]]
    assert docs[0]["gpu"] == "1" and docs[0]["GpuTemperatureCelsius"] == 41.0  # NVML fields kept for it
    # Without Triton GPU series there is nothing to filter by: NVML's whole view is reported.
    cpu_triton = TextSource(*(triton_text(step, []) for step in (1, 2)))
    results = run([cpu_triton, IndexSource(), NvmlSource(fk.two_healthy(), {}, clock=Clock())], 2)
    assert sorted(d["gpu_uuid"] for d in gpu_docs(results[1])) == sorted([U[0], U[1]])


# --- --nvml on/auto through the real entry point, with this machine's real pynvml ------------------------


def _real_nvml_error() -> str | None:
    """Why the real NVML cannot initialise here (None: it can, so these tests do not apply)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return str(exc)
    pynvml.nvmlShutdown()
    return None


NVML_ABSENT = _real_nvml_error()
needs_no_nvml = pytest.mark.skipif(NVML_ABSENT is None, reason="NVML initialises on this machine")
ROOT = REPO


def _exporter_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("EXPORTER_", "TRITON_", "NVIDIA_", "CUDA_"))}


@needs_no_nvml
def test_real_entry_point_on_without_nvml_exits_2_with_one_line(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{closed_port()}"
    out = tmp_path / "emf.log"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter",
            "--nvml",
            "on",
            "--interval",
            "0.3",
            "--output",
            f"file:{out}",
            "--triton-url",
            closed,
            "--triton-metrics-url",
            closed + "/metrics",
        ],
        cwd=ROOT,
        env=_exporter_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "exporter: error: --nvml on (EXPORTER_NVML=on) needs NVML, which is unavailable: NVML cannot initialise: "
    )
    assert NVML_ABSENT in lines[0]
    assert proc.stdout == "" and not out.exists()  # stopped before any cycle


@needs_no_nvml
def test_real_entry_point_auto_without_nvml_keeps_running_and_reports_the_source_down(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{closed_port()}"
    out = tmp_path / "emf.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter",
            "--nvml",
            "auto",
            "--interval",
            "0.3",
            "--startup-wait",
            "0",  # Triton is not there on purpose: cycle at once
            "--output",
            f"file:{out}",
            "--triton-url",
            closed,
            "--triton-metrics-url",
            closed + "/metrics",
        ],
        cwd=ROOT,
        env=_exporter_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not out.exists() or out.read_bytes().count(b'"source":"nvml"') < 3):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.1)
        assert proc.poll() is None  # still running after three cycles
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    docs = [orjson.loads(line) for line in out.read_bytes().splitlines() if line.strip()]
    nvml_up = [d["SourceUp"] for d in docs if d.get("source") == "nvml" and "SourceUp" in d]
    assert len(nvml_up) >= 3 and set(nvml_up) == {0}
    warnings = [orjson.loads(line) for line in err.splitlines() if b'"NVML' in line]
    assert warnings and warnings[0]["level"] == "warning" and "retrying every 300s" in warnings[0]["msg"]
