"""The GPU health verdict and GPM, against the faithful pynvml fake: every fault kind, every non-fatal XID,
stickiness, GPM produced or not (with the reason), and both through the real pipeline (EMF, OTLP, --once table).

The drain action (a report to the controller) against moto and the exporter as a process:
tests/integration/test_nvml_drain.py; the controller's own rule: tests/unit/controller/test_reports.py.
"""

from __future__ import annotations

import logging

import pynvml
import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

from demo.payloads import triton_metrics
from exporter.config import Settings
from exporter.gpufaults import APPLICATION_XIDS, FATAL_XIDS, RECOVERY_ACTIONS, REPORT_ONLY_XIDS, GpuHealth, Report
from exporter.gpufaults.drain import ATTEMPTS
from exporter.gpus import keep_tritons_gpus
from exporter.otlp_output import OtlpMetricsOutput
from exporter.pipeline import Pipeline, Scrape
from exporter.series import EMPTY, Exposition, LabelSet
from exporter.sources import Collected, SourceError
from exporter.sources.nvml import NvmlSource
from exporter.summary import render_summary
from tests.support import nvml_fake as fk
from tests.support.helpers import CATALOG, Capture, IndexSource, TextSource, documents

U = fk.UUIDS
# The set the issue names (the EKS node monitoring agent's fatal XIDs), and the application errors.
ISSUE_FATAL = {46, 48, 54, 62, 63, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 142, 143, 151, 155, 156, 158}
GPM_SERIES = ("nvml_sm_active_percent", "nvml_sm_occupancy_percent", "nvml_tensor_active_percent")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def values(collected: Collected, series: str) -> dict[str, float]:
    labels = collected.samples.labels
    return {labels[k].get("gpu_uuid") or "": v for k, v in collected.samples.samples.get(series, {}).items()}


def healthy(collected: Collected) -> dict[str, float]:
    return values(collected, "nvml_gpu_healthy")


def started(fake: fk.FakeNvml, health: GpuHealth | None = None, clock: Clock | None = None) -> NvmlSource:
    source = NvmlSource(fake, {}, clock=clock or Clock(), health=health)
    source.start()
    return source


def unhealthy_lines(capture: Capture) -> list[logging.LogRecord]:
    return [r for r in capture.records if r.name == "exporter.gpu_health" and "unhealthy" in r.getMessage()]


class CountingAction(Report):
    """The report action, counting what it was asked (to prove it is asked once per GPU)."""

    def __init__(self) -> None:
        self.faults: list[object] = []
        self.polls = 0

    def unhealthy(self, fault):  # type: ignore[no-untyped-def]
        self.faults.append(fault)
        return "counted"

    def poll(self) -> None:
        self.polls += 1

    def series(self) -> list[tuple[str, float]]:
        return [(ATTEMPTS, float(len(self.faults)))]


# --- the rules as data ------------------------------------------------------------------------------------


def test_the_fatal_set_is_the_issues_and_application_errors_are_apart() -> None:
    assert set(FATAL_XIDS) == ISSUE_FATAL
    assert set(APPLICATION_XIDS) == {13, 31, 43}
    assert not set(FATAL_XIDS) & set(APPLICATION_XIDS)
    assert all(x.meaning and x.nvidia_action for x in (*FATAL_XIDS.values(), *APPLICATION_XIDS.values()))
    assert RECOVERY_ACTIONS[0] == "none" and set(RECOVERY_ACTIONS) == set(range(8))
    # the numbers are nvidia-ml-py's own
    for name, value in (
        ("NONE", 0),
        ("GPU_RESET", 1),
        ("NODE_REBOOT", 2),
        ("DRAIN_P2P", 3),
        ("DRAIN_AND_RESET", 4),
        ("RECOVER_IMEX_DOMAIN", 5),
        ("BUS_RESET", 6),
        ("SYSTEM_REBOOT", 7),
    ):
        assert getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{name}") == value
    assert pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION == 230


# --- each fault kind --------------------------------------------------------------------------------------


@pytest.mark.parametrize("xid", sorted(ISSUE_FATAL))
def test_each_fatal_xid_makes_its_gpu_unhealthy_for_good(xid: int) -> None:
    fake = fk.xid_events()
    action = CountingAction()
    source = started(fake, GpuHealth(action))
    assert healthy(source.collect(5.0)) == {U[0]: 1.0, U[1]: 1.0}
    with Capture.on("exporter") as cap:
        fake.inject_xid(1, xid)
        got = source.collect(5.0)
    assert healthy(got) == {U[0]: 1.0, U[1]: 0.0}
    assert values(got, "nvml_xid_errors_total") == {U[0]: 0.0, U[1]: 1.0}  # counted as before
    (line,) = unhealthy_lines(cap)
    assert line.levelno == logging.ERROR
    fields = line.fields  # type: ignore[attr-defined]
    assert fields["gpu_uuid"] == U[1] and fields["gpu"] == 1 and fields["xid"] == xid
    assert fields["reason"] == f"XID {xid}, {FATAL_XIDS[xid].meaning}"
    said = "report-only: GpuHealthy 0, no drain" if xid in REPORT_ONLY_XIDS else "counted"
    assert fields["action_taken"] == said and fields["gpu_fault_action"] == "report"
    assert fields.get("report_only", False) == (xid in REPORT_ONLY_XIDS)
    assert line.getMessage() == f"GPU 1 ({U[1]}) unhealthy: XID {xid}, {FATAL_XIDS[xid].meaning}; {said}"
    assert got.gpus[U[1]].properties["health"] == f"unhealthy: XID {xid}, {FATAL_XIDS[xid].meaning}"
    for _ in range(3):  # sticky, and the action is asked once (never for a report-only XID)
        assert healthy(source.collect(5.0)) == {U[0]: 1.0, U[1]: 0.0}
    assert len(action.faults) == (0 if xid in REPORT_ONLY_XIDS else 1) and action.polls == 5


def test_xid_63_and_142_are_report_only_and_a_draining_fault_after_them_is_acted_on() -> None:
    assert set(REPORT_ONLY_XIDS) == {63, 142}
    fake = fk.xid_events()
    action = CountingAction()
    source = started(fake, GpuHealth(action))
    fake.inject_xid(0, 63)
    fake.inject_xid(1, 142)
    assert healthy(source.collect(5.0)) == {U[0]: 0.0, U[1]: 0.0}
    assert action.faults == []
    with Capture.on("exporter") as cap:
        fake.inject_xid(0, 79)
        got = source.collect(5.0)
    assert [(f.uuid, f.code, f.drains) for f in action.faults] == [(U[0], 79, True)]  # type: ignore[attr-defined]
    (line,) = unhealthy_lines(cap)
    assert line.getMessage().endswith("XID 79, GPU has fallen off the bus; counted")
    assert got.gpus[U[0]].properties["health"] == "unhealthy: XID 79, GPU has fallen off the bus"
    fake.inject_xid(1, 63)
    source.collect(5.0)
    assert len(action.faults) == 1


@pytest.mark.parametrize("xid", [13, 31, 43, 94, 999])
def test_application_and_unknown_xids_are_counted_and_leave_the_gpu_healthy(xid: int) -> None:
    fake = fk.xid_events()
    source = started(fake)
    source.collect(5.0)
    with Capture.on("exporter") as cap:
        fake.inject_xid(0, xid)
        fake.inject_xid(0, xid)
        got = source.collect(5.0)
    assert healthy(got) == {U[0]: 1.0, U[1]: 1.0}
    assert values(got, "nvml_xid_errors_total")[U[0]] == 2.0
    assert got.gpus[U[0]].properties == {**got.gpus[U[0]].properties, "last_xid": xid, "health": "healthy"}
    assert not unhealthy_lines(cap)
    meaning = APPLICATION_XIDS.get(xid)
    expected = f"GPU {U[0]}: XID {xid}" + (f", {meaning.meaning}" if meaning else "")
    assert cap.messages(logging.WARNING).count(expected) == 2


@pytest.mark.parametrize("action", range(1, 8))
def test_a_recovery_action_other_than_none_read_twice_makes_the_gpu_unhealthy(action: int) -> None:
    fake = fk.two_healthy()
    counting = CountingAction()
    source = started(fake, GpuHealth(counting))
    assert healthy(source.collect(5.0)) == {U[0]: 1.0, U[1]: 1.0}  # NONE
    with Capture.on("exporter") as cap:
        fake.set_recovery_action(0, action)
        assert healthy(source.collect(5.0)) == {U[0]: 1.0, U[1]: 1.0}  # one read is no verdict
        got = source.collect(5.0)
    assert healthy(got) == {U[0]: 0.0, U[1]: 1.0}
    (line,) = unhealthy_lines(cap)
    assert line.fields["recovery_action"] == action and line.fields["reads"] == 2  # type: ignore[attr-defined]
    assert len(counting.faults) == (0 if action == 3 else 1)  # DRAIN_P2P is report-only
    assert line.fields.get("report_only", False) == (action == 3)  # type: ignore[attr-defined]
    assert line.fields["reason"] == f"the driver asks for a recovery action: {RECOVERY_ACTIONS[action]}"  # type: ignore[attr-defined]
    fake.set_recovery_action(0, 0)  # the driver's answer goes back to NONE (a reset elsewhere): still unhealthy here
    assert healthy(source.collect(5.0))[U[0]] == 0.0
    assert set(source.collect(5.0).samples.samples) <= set(CATALOG.families)  # field 230 makes no series


def test_a_recovery_action_read_once_then_none_leaves_the_gpu_healthy() -> None:
    fake = fk.two_healthy()
    counting = CountingAction()
    source = started(fake, GpuHealth(counting))
    source.collect(5.0)
    for _ in range(3):  # a misread every other cycle never makes two in a row
        fake.set_recovery_action(0, 2)
        assert healthy(source.collect(5.0)) == {U[0]: 1.0, U[1]: 1.0}
        fake.set_recovery_action(0, 0)
        assert healthy(source.collect(5.0)) == {U[0]: 1.0, U[1]: 1.0}
    assert counting.faults == []


def test_a_driver_without_the_recovery_action_field_is_no_fault_and_is_not_asked_again() -> None:
    fake = fk.two_healthy()
    for g in fake.gpus:
        g.recovery_action = None  # an older driver: NOT_SUPPORTED for field 230 (and no memory temperature)
    source = started(fake)
    assert healthy(source.collect(5.0)) == {U[0]: 1.0, U[1]: 1.0}
    before = fake.called["nvmlDeviceGetFieldValues"]
    assert healthy(source.collect(5.0)) == {U[0]: 1.0, U[1]: 1.0}
    assert fake.called["nvmlDeviceGetFieldValues"] == before  # both fields marked unsupported, per GPU


def test_a_lost_gpu_is_unhealthy_and_stays_so_if_it_answers_again() -> None:
    fake = fk.gpu_lost()
    source = started(fake)
    source.collect(5.0)
    with Capture.on("exporter") as cap:
        fake.lose(1)
        got = source.collect(5.0)
    assert healthy(got) == {U[0]: 1.0, U[1]: 0.0}
    assert values(got, "nvml_gpu_lost") == {U[0]: 0.0, U[1]: 1.0}
    (line,) = unhealthy_lines(cap)
    assert line.fields["fault"] == "lost" and "GPU_IS_LOST" in line.fields["reason"]  # type: ignore[attr-defined]
    fake.gpus[1].lost = False
    assert healthy(source.collect(5.0)) == {U[0]: 1.0, U[1]: 0.0}


def test_a_row_remapping_failure_makes_the_gpu_unhealthy() -> None:
    fake = fk.two_healthy()
    source = started(fake)
    source.collect(5.0)
    fake.fail_row_remapping(0)
    with Capture.on("exporter") as cap:
        got = source.collect(5.0)
    assert healthy(got) == {U[0]: 0.0, U[1]: 1.0}
    assert values(got, "nvml_remapped_rows_failure")[U[0]] == 1.0
    (line,) = unhealthy_lines(cap)
    assert line.fields["fault"] == "row_remap_failure"  # type: ignore[attr-defined]


def test_a_pending_remap_alone_leaves_the_gpu_healthy() -> None:
    fake = fk.two_healthy()
    fake.gpus[0].remapped = (0, 1, 1, 0)  # a remap waiting for a reset: reported, not a failure
    assert healthy(started(fake).collect(5.0)) == {U[0]: 1.0, U[1]: 1.0}


def test_the_first_fault_is_the_reason_kept_and_two_gpus_each_ask_once() -> None:
    fake = fk.xid_events()
    action = CountingAction()
    source = started(fake, GpuHealth(action))
    fake.inject_xid(0, 48)
    fake.set_recovery_action(0, 2)
    source.collect(5.0)
    fake.lose(0)
    fake.inject_xid(1, 79)
    got = source.collect(5.0)
    assert healthy(got) == {U[0]: 0.0, U[1]: 0.0}
    # GPU 0's XID and recovery action came in one cycle: the XID is the reason; losing it later changes nothing.
    assert [(f.uuid, f.kind, f.code) for f in action.faults] == [(U[0], "xid", 48), (U[1], "xid", 79)]


def test_the_verdict_survives_an_nvml_reinitialisation() -> None:
    fake = fk.xid_events()
    clock = Clock()
    source = started(fake, clock=clock)
    fake.inject_xid(0, 79)
    assert healthy(source.collect(5.0))[U[0]] == 0.0
    fake.unload_driver()
    with pytest.raises(SourceError):
        source.collect(5.0)
    fake.load_driver()
    clock.now += 301
    assert healthy(source.collect(5.0)) == {U[0]: 0.0, U[1]: 1.0}


def test_an_action_that_raises_costs_neither_the_verdict_nor_the_cycle() -> None:
    class Broken(Report):
        def unhealthy(self, fault):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

        def poll(self) -> None:
            raise RuntimeError("boom again")

    fake = fk.xid_events()
    source = started(fake, GpuHealth(Broken()))
    fake.inject_xid(1, 79)
    with Capture.on("exporter") as cap:
        got = source.collect(5.0)
    assert healthy(got) == {U[0]: 1.0, U[1]: 0.0}
    (line,) = unhealthy_lines(cap)
    assert "the report action failed (RuntimeError: boom)" in line.getMessage()


def test_the_action_counts_are_task_series_that_the_triton_join_keeps() -> None:
    fake = fk.xid_events()
    source = started(fake, GpuHealth(CountingAction()))
    fake.inject_xid(1, 79)
    got = source.collect(5.0)
    assert got.samples.samples[ATTEMPTS] == {EMPTY.key: 1.0}
    keep_tritons_gpus(got, [U[0]])  # Triton reports GPU 0 only: GPU 1's series go, the task's stay
    assert healthy(got) == {U[0]: 1.0}
    assert got.samples.samples[ATTEMPTS] == {EMPTY.key: 1.0}


# --- GPM ----------------------------------------------------------------------------------------------------


def gpm_fake(n: int = 2) -> tuple[fk.FakeNvml, Clock]:
    """Hopper GPUs on a clock the test moves (GPM averages over the time between two samples)."""
    fake, clock = fk.hopper(n), Clock()
    fake.clock = clock
    return fake, clock


def test_gpm_metrics_over_the_cycle_on_hopper() -> None:
    fake, clock = gpm_fake()
    source = started(fake)
    first = source.collect(5.0)
    assert not [s for s in GPM_SERIES if s in first.samples.samples]  # one sample: no window yet
    clock.now += 60
    got = source.collect(5.0)
    assert values(got, "nvml_sm_active_percent") == pytest.approx({U[0]: 60.0, U[1]: 61.0})
    assert values(got, "nvml_sm_occupancy_percent") == pytest.approx({U[0]: 30.0, U[1]: 31.0})
    assert values(got, "nvml_tensor_active_percent") == pytest.approx({U[0]: 20.0, U[1]: 21.0})
    assert values(got, "nvml_dram_active_percent") == pytest.approx({U[0]: 40.0, U[1]: 41.0})
    assert "gpm" not in got.gpus[U[0]].properties
    clock.now += 30
    fake.set_gpm(0, sm=90.0, tensor=75.0)  # half the next window at the old activity, half at the new
    clock.now += 30
    got = source.collect(5.0)
    assert values(got, "nvml_sm_active_percent")[U[0]] == pytest.approx(75.0)
    assert values(got, "nvml_tensor_active_percent")[U[0]] == pytest.approx(47.5)
    assert values(got, "nvml_sm_active_percent")[U[1]] == pytest.approx(61.0)
    assert len(fake.gpm_samples) == 4  # two per GPU, allocated once
    source.close()
    assert fake.gpm_samples == {}  # freed before NVML shuts down


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        ("ampere", "this GPU has no GPM (Hopper and newer have)"),
        ("old_driver", "this driver's NVML has no GPM (an older driver)"),
        ("mig", "MIG mode is on and NVML gives no GPM sample of the whole GPU"),
    ],
)
def test_gpm_not_produced_says_why_once(scenario: str, reason: str) -> None:
    clock = Clock()
    fake = {"ampere": fk.two_healthy, "old_driver": lambda: fk.FakeNvml(fk.gpus(2), old_driver=True)}.get(
        scenario, fk.hopper
    )()
    fake.clock = clock
    if scenario == "mig":
        fake.gpus[0].mig = (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)
        fake.gpus[0].mig_devices = ["MIG-aaaaaaaa-0000-0000-0000-000000000001"]
    source = started(fake)
    with Capture.on("exporter") as cap:
        for _ in range(3):
            got = source.collect(5.0)
            clock.now += 60
    assert not values(got, "nvml_sm_active_percent").get(U[0])
    assert str(got.gpus[U[0]].properties["gpm"]).startswith(f"not produced: {reason}")
    said = [m for m in cap.messages() if "GpuSmActive" in m and U[0] in m]
    assert len(said) == 1 and reason in said[0]
    if scenario == "mig":  # the other GPU, MIG off, keeps its GPM
        assert values(got, "nvml_sm_active_percent")[U[1]] == pytest.approx(61.0)


def test_a_transient_gpm_error_drops_one_window_and_recovers() -> None:
    fake, clock = gpm_fake(1)
    source = started(fake)
    source.collect(5.0)
    fake.gpus[0].failing["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_UNKNOWN
    clock.now += 60
    assert "nvml_sm_active_percent" not in source.collect(5.0).samples.samples
    del fake.gpus[0].failing["nvmlGpmSampleGet"]
    clock.now += 60
    assert "nvml_sm_active_percent" not in source.collect(5.0).samples.samples  # a new pair starts
    clock.now += 60
    assert values(source.collect(5.0), "nvml_sm_active_percent") == pytest.approx({U[0]: 60.0})


def test_the_fake_gpm_keeps_pynvmls_types_and_refuses_a_bad_pair() -> None:
    fake = fk.hopper(2)
    fake.nvmlInit()
    h0, h1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    assert isinstance(fake.nvmlGpmQueryDeviceSupport(h0), pynvml.c_nvmlGpmSupport_t)
    a, b = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    assert isinstance(a, pynvml.c_nvmlGpmSample_t)
    fake.nvmlGpmSampleGet(h0, a)
    fake.nvmlGpmSampleGet(h1, b)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics, request.sample1, request.sample2 = 1, 1, a, b
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # samples of two GPUs
        fake.nvmlGpmMetricsGet(request)
    request.version = 2
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        fake.nvmlGpmMetricsGet(request)
    fake.nvmlGpmSampleFree(a)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlGpmSampleFree(a)


# --- through the pipeline: EMF, OTLP, the --once table ------------------------------------------------------


class CaptureScrape:
    """A scrape output that keeps the OTLP the real OTLP metrics output encodes (nothing sent)."""

    def __init__(self) -> None:
        self.otlp = OtlpMetricsOutput(CATALOG, [], exporters=[])
        self.metrics: list[Metric] = []

    def export(self, scrape: Scrape) -> None:
        self.metrics = [Metric.FromString(b) for b, _ in self.otlp.encode(scrape)]

    def series(self) -> Exposition:
        return Exposition()

    def close(self, timeout: float) -> None:
        return None


def test_gpu_healthy_and_gpm_in_emf_otlp_and_the_once_table() -> None:
    fake, clock = gpm_fake()
    source = NvmlSource(fake, {}, clock=Clock())
    source.start()
    out = CaptureScrape()
    pipeline = Pipeline(
        Settings(nvml="on"),
        CATALOG,
        [TextSource(triton_metrics(["m"], 1, gpus=[U[0], U[1]])), IndexSource(), source],
        clock=clock,
        outputs=[out],
    )
    pipeline.cycle()
    clock.now += 60
    fake.inject_xid(1, 79)
    result = pipeline.cycle()
    docs = documents(result)
    gpu = {d["gpu"]: d for d in docs if "gpu" in d}
    assert gpu["0"]["GpuHealthy"] == 1.0 and gpu["1"]["GpuHealthy"] == 0.0
    assert gpu["1"]["health"] == "unhealthy: XID 79, GPU has fallen off the bus"
    assert gpu["0"]["GpuSmActive"] == pytest.approx(60.0) and gpu["0"]["GpuDramActive"] == pytest.approx(40.0)
    directive = next(
        d for d in gpu["1"]["_aws"]["CloudWatchMetrics"] if any(m["Name"] == "GpuHealthy" for m in d["Metrics"])
    )
    assert ["gpu"] in directive["Dimensions"] and [] in directive["Dimensions"]  # per GPU, and the fleet's minimum
    otlp = {m.name: m for m in out.metrics}
    points = {
        next(a.value.string_value for a in p.attributes if a.key == "gpu_uuid"): p.as_double
        for p in otlp["nvml_gpu_healthy"].gauge.data_points
    }
    assert points == {U[0]: 1.0, U[1]: 0.0}
    assert "nvml_sm_active_percent" in otlp
    table = render_summary(result)
    header = next(line for line in table.splitlines() if line.startswith("gpu "))
    assert "healthy" in header and header.rstrip().endswith("health")
    row1 = next(line for line in table.splitlines() if line.startswith("1 ") and U[1] in line)
    assert row1.rstrip().endswith("unhealthy: XID 79, GPU has fallen off the bus")
    row0 = next(line for line in table.splitlines() if line.startswith("0 ") and U[0] in line)
    assert row0.rstrip().endswith("healthy") and " 60 " in row0  # sm %
    pipeline.close()


def test_labels_of_the_drain_counts_are_the_task_and_not_a_gpu() -> None:
    assert LabelSet.of().entity == ("task",)
    assert CATALOG.families[ATTEMPTS].labels == () and CATALOG.families[ATTEMPTS].source == "nvml"
