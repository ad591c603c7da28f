"""The NVML source against the real library: runs only where NVML initialises (a GPU host), skipped elsewhere.

It checks that real calls return sane values and the same shapes the fake
returns, so a difference between the fake and the driver shows up here.
"""

from __future__ import annotations

import time

import pynvml
import pytest

from exporter.sources.nvml import NvmlSource
from tests.support import nvml_fake


def _nvml_works() -> str:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML does not initialise here: {exc}"
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    return "" if count else "NVML initialises but sees no GPU"


_REASON = _nvml_works()
pytestmark = pytest.mark.skipif(bool(_REASON), reason=_REASON or "real NVML available")


@pytest.fixture
def collected():
    source = NvmlSource(pynvml, {})
    source.start()
    try:
        yield source, source.collect(5.0)
    finally:
        source.close()


def values(got, series: str) -> dict[str, float]:
    labels = got.samples.labels
    return {labels[k].get("gpu_uuid"): v for k, v in got.samples.samples.get(series, {}).items()}


def test_real_gpus_have_sane_values(collected) -> None:
    _, got = collected
    assert got.gpus and all(u.startswith("GPU-") for u in got.gpus)
    assert sorted(i.index for i in got.gpus.values()) == list(range(len(got.gpus)))
    for uuid, info in got.gpus.items():
        assert isinstance(info.properties["pci_bus_id"], str) and ":" in info.properties["pci_bus_id"]
        assert info.properties["driver_version"]
        assert values(got, "nvml_gpu_lost")[uuid] == 0.0
        total = values(got, "nvml_memory_total_bytes")[uuid]
        assert total > 256 * 1024**2
        assert 0 <= values(got, "nvml_memory_used_bytes")[uuid] <= total
        util = values(got, "nvml_gpu_utilization_percent").get(uuid)
        assert util is None or 0 <= util <= 100  # absent on a MIG parent
        temp = values(got, "nvml_temperature_gpu_celsius").get(uuid)
        assert temp is None or 5 <= temp <= 120
        power = values(got, "nvml_power_usage_watts").get(uuid)
        limit = values(got, "nvml_power_limit_watts").get(uuid)
        assert power is None or 1 <= power <= 2000  # watts, not milliwatts
        assert limit is None or 10 <= limit <= 2000
        clock = values(got, "nvml_clock_sm_mhz").get(uuid)
        assert clock is None or 0 <= clock <= 5000
        energy = values(got, "nvml_energy_joules").get(uuid)
        assert energy is None or energy >= 0
        for flag in ("nvml_throttle_thermal", "nvml_throttle_power_cap", "nvml_throttle_hw_slowdown"):
            assert values(got, flag).get(uuid, 0.0) in (0.0, 1.0)


def test_real_event_wait_with_timeout_zero_returns_at_once(collected) -> None:
    source, _ = collected
    if source._event_set is None:
        pytest.skip("XID events cannot be registered here")
    t0 = time.perf_counter()
    source.collect(60.0)
    assert time.perf_counter() - t0 < 20  # draining never waits for events (that would take the 60 s)


def test_real_return_shapes_match_the_fake(collected) -> None:
    source, _ = collected
    h = source.devices[0].handle
    fake = nvml_fake.two_healthy()
    fake.nvmlInit()
    fh = fake.nvmlDeviceGetHandleByIndex(0)
    assert type(pynvml.nvmlDeviceGetUUID(h)) is type(fake.nvmlDeviceGetUUID(fh)) is str
    assert type(pynvml.nvmlDeviceGetPciInfo(h).busId) is type(fake.nvmlDeviceGetPciInfo(fh).busId) is bytes
    assert type(pynvml.nvmlDeviceGetMemoryInfo(h)) is type(fake.nvmlDeviceGetMemoryInfo(fh))
    assert type(pynvml.nvmlSystemGetDriverVersion()) is type(fake.nvmlSystemGetDriverVersion())
    event_set = pynvml.nvmlEventSetCreate()
    try:
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait(event_set, 0)
    finally:
        pynvml.nvmlEventSetFree(event_set)


# --- the recovery-action field and GPM (docs/gpu.md says what a real GPU answered, once one did) ------------


def test_real_recovery_action_field_is_none_or_not_supported(collected) -> None:
    """Field 230 on a healthy GPU: NONE (0), or NOT_SUPPORTED on drivers before the field; the GPU is healthy."""
    source, got = collected
    for d in source.devices:
        (v,) = pynvml.nvmlDeviceGetFieldValues(d.handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        assert v.nvmlReturn in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED), v.nvmlReturn
        if v.nvmlReturn == pynvml.NVML_SUCCESS:
            assert v.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT  # what the fake answers
            assert v.value.uiVal == pynvml.NVML_GPU_RECOVERY_ACTION_NONE
        print(f"{d.uuid}: recovery action field -> return {v.nvmlReturn}, value {v.value.uiVal}")  # for docs/gpu.md
    assert set(values(got, "nvml_gpu_healthy").values()) == {1.0}
    assert all(i.properties["health"] == "healthy" for i in got.gpus.values())


def test_real_gpm_two_samples_apart_or_the_reason_it_is_not_produced() -> None:
    source = NvmlSource(pynvml, {})
    source.start()
    try:
        source.collect(5.0)
        time.sleep(1.0)  # GPM averages over the time between two samples
        got = source.collect(5.0)
        for d in source.devices:
            support = pynvml.nvmlGpmQueryDeviceSupport(d.handle)
            sm = values(got, "nvml_sm_active_percent").get(d.uuid)
            print(
                f"{d.uuid} {d.properties.get('gpu_name')}: GPM supported {support.isSupportedDevice}, sm {sm}, "
                f"{got.gpus[d.uuid].properties.get('gpm', '')}"
            )  # for docs/gpu.md
            if support.isSupportedDevice and d.properties.get("mig_mode") != "enabled":
                for series in (
                    "nvml_sm_active_percent",
                    "nvml_sm_occupancy_percent",
                    "nvml_tensor_active_percent",
                    "nvml_dram_active_percent",
                ):
                    assert 0.0 <= values(got, series)[d.uuid] <= 100.0
                assert "gpm" not in got.gpus[d.uuid].properties
            elif not support.isSupportedDevice:
                assert got.gpus[d.uuid].properties["gpm"] == "not produced: this GPU has no GPM (Hopper and newer have)"
            else:  # MIG on: what NVML answers is recorded either way (the fake assumes NOT_SUPPORTED)
                assert (
                    values(got, "nvml_sm_active_percent").get(d.uuid) is not None
                    or "gpm" in got.gpus[d.uuid].properties
                )
    finally:
        source.close()


def test_real_gpm_sample_and_request_types_match_the_fake() -> None:
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        if not pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
            pytest.skip("this GPU has no GPM")
        sample = pynvml.nvmlGpmSampleAlloc()
        try:
            fake = nvml_fake.hopper(1)
            fake.nvmlInit()
            assert type(sample) is type(fake.nvmlGpmSampleAlloc()) is pynvml.c_nvmlGpmSample_t
            assert pynvml.nvmlGpmSampleGet(h, sample) is sample
        finally:
            pynvml.nvmlGpmSampleFree(sample)
    finally:
        pynvml.nvmlShutdown()
