"""ResourceMonitor: host sampling on CPU, NVML paths through a fake pynvml, ring buffer, intervals, lifecycle."""

import io
import sys
import threading
import time
import types
from collections import namedtuple

import pytest

from wmbook.profiling import monitor as monitor_mod
from wmbook.profiling.liveview import LiveView, live_view
from wmbook.profiling.monitor import ResourceMonitor, nvml_device_for

MIB = 2**20
HOST_ONLY = ("cpu_usage", "system_memory")


def _busy(seconds):
    t = time.perf_counter()
    x = 0
    while time.perf_counter() - t < seconds:
        x += 1
    return x


def _monitor_threads():
    return [t for t in threading.enumerate() if t.name == "wmbook-resource-monitor"]


class FakeNVML(types.ModuleType):
    """Stands in for pynvml: two GPUs with known readings; counts init/shutdown; optional failures."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    class NVMLError(Exception):
        pass

    def __init__(self, fail_init=False, fail_power=False):
        super().__init__("pynvml")
        self.inits = self.shutdowns = 0
        self.fail_init, self.fail_power = fail_init, fail_power
        self.handles = []

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return 6

    def nvmlDeviceGetHandleByIndex(self, i):
        self.handles.append(i)
        return ("h", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.handles.append(uuid)
        return ("h", uuid)

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU %s" % str(h[1]).encode()

    def nvmlDeviceGetMemoryInfo(self, h):
        return namedtuple("Mem", "total free used")(24564 * MIB, (24564 - 8420) * MIB, 8420 * MIB)

    def nvmlDeviceGetUtilizationRates(self, h):
        return namedtuple("Util", "gpu memory")(85, 40)

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 72

    def nvmlDeviceGetPowerUsage(self, h):
        if self.fail_power:
            raise self.NVMLError("Not Supported")
        return 250_000  # mW

    def nvmlDeviceGetClockInfo(self, h, kind):
        return {self.NVML_CLOCK_SM: 1980, self.NVML_CLOCK_MEM: 2619}[kind]


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def test_cpu_only_samples_host_metrics_and_reports_no_gpu():
    with ResourceMonitor(device="cpu", cpu_interval=0.05) as m:
        assert m.running
        _busy(0.3)
    assert not m.running and not _monitor_threads()
    assert m.gpu_available is False and "cpu" in m.gpu_reason
    df = m.samples()
    assert list(df.columns) == ["time_s", "metric", "value", "device"]
    assert {"cpu_percent", "system_memory_used_mib", "system_memory_total_mib", "process_rss_mib"} <= set(df["metric"])
    assert not df["metric"].str.startswith("gpu_").any()
    assert (df["device"] == "host").all()
    summ = m.summary().set_index("metric")
    assert summ.loc["cpu_percent", "max"] > 20  # the main thread was busy
    assert summ.loc["process_rss_mib", "min"] > 10
    assert summ.loc["system_memory_used_mib", "max"] <= summ.loc["system_memory_total_mib", "max"]
    for _, r in summ.iterrows():
        assert r["min"] - 1e-9 <= r["mean"] <= r["max"] + 1e-9
    assert m.info()["gpu_available"] is False and m.error_count == 0


def test_no_torch_cuda_reason_without_device():
    m = ResourceMonitor(metrics=HOST_ONLY + ("gpu_memory",), cpu_interval=0.05)
    with m:
        pass
    import torch

    if not torch.cuda.is_available():
        assert m.gpu_available is False and m.gpu_reason == "torch sees no CUDA device"


def test_ring_buffer_keeps_last_points_and_counts_dropped():
    m = ResourceMonitor(device="cpu", cpu_interval=0.01, max_points=3, metrics=("system_memory",))
    with m:
        time.sleep(0.25)
    df = m.samples()
    per = df.groupby("metric").size()
    assert (per == 3).all()
    summ = m.summary().set_index("metric")
    n = summ.loc["process_rss_mib", "count"]
    assert n > 6 and summ.loc["process_rss_mib", "dropped"] == n - 3
    assert m.info()["dropped_total"] == sum(summ["dropped"])
    kept = df[df["metric"] == "process_rss_mib"]["time_s"]
    assert kept.is_monotonic_increasing and kept.iloc[-1] >= 0.2  # the newest samples are kept


def test_separate_gpu_and_cpu_intervals_are_respected(fake_nvml):
    m = ResourceMonitor(gpu_index=0, gpu_interval=0.04, cpu_interval=0.2,
                        metrics=("gpu_utilization", "system_memory"))
    with m:
        time.sleep(0.62)
    c = m.summary().set_index("metric")["count"]
    # 0.62 s: about 16 GPU and 4 host samples (+1 final each); generous bounds for a loaded machine
    assert 5 <= c["gpu_utilization_pct"] <= 20
    assert 2 <= c["process_rss_mib"] <= 6
    assert c["gpu_utilization_pct"] > 2 * c["process_rss_mib"]


def test_fake_nvml_known_values_and_single_init(fake_nvml):
    groups = ("gpu_memory", "gpu_utilization", "gpu_temperature", "gpu_power", "gpu_clocks", "cpu_usage")
    a = ResourceMonitor(gpu_index=0, gpu_interval=0.02, cpu_interval=0.05, metrics=groups)
    b = ResourceMonitor(gpu_index=0, gpu_interval=0.02, metrics=("gpu_power",))
    a.start()
    b.start()
    a.start()  # idempotent: no second thread, no second init
    time.sleep(0.1)
    assert len(_monitor_threads()) == 2
    assert fake_nvml.inits == 1
    line = a.status_line()
    b.stop()
    assert fake_nvml.shutdowns == 0  # a still uses NVML
    a.stop()
    a.stop()
    assert fake_nvml.shutdowns == 1 and not _monitor_threads()
    assert a.gpu_available and a.gpu_name == "Fake GPU 0" and a.gpu_reason is None
    s = a.summary().set_index("metric")
    expect = {"gpu_memory_used_mib": 8420, "gpu_memory_total_mib": 24564, "gpu_utilization_pct": 85,
              "gpu_memory_utilization_pct": 40, "gpu_temperature_c": 72, "gpu_power_w": 250,
              "gpu_sm_clock_mhz": 1980, "gpu_memory_clock_mhz": 2619}
    for k, v in expect.items():
        assert s.loc[k, "min"] == pytest.approx(v) and s.loc[k, "max"] == pytest.approx(v), k
    assert s.loc["gpu_memory_used_pct", "last"] == pytest.approx(100 * 8420 / 24564)
    assert s.loc["gpu_power_w", "unit"] == "W" and s.loc["gpu_memory_used_mib", "device"] == "cuda:0"
    assert "GPU cuda:0: Memory 8420MiB / 24564MiB (34.3%), Util 85.0%, Temp 72.0°C, Power 250W" in line
    assert "CPU:" in line


def test_cuda_visible_devices_maps_torch_index_to_nvml(fake_nvml, monkeypatch):
    assert nvml_device_for(0, None) == 0
    assert nvml_device_for(1, "3,5") == 5
    assert nvml_device_for(0, " 2 , 7") == 2
    assert nvml_device_for(0, "GPU-abc,GPU-def") == "GPU-abc"
    with pytest.raises(ValueError, match="not among"):
        nvml_device_for(1, "0,-1,2")
    with pytest.raises(ValueError, match="empty"):
        nvml_device_for(0, "")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with ResourceMonitor(gpu_index=1, gpu_interval=0.05, metrics=("gpu_memory",)) as m:
        pass
    assert m.nvml_device == 5 and fake_nvml.handles == [5] and m.gpu_name == "Fake GPU 5"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234")
    with ResourceMonitor(gpu_index=0, metrics=("gpu_memory",)) as m:
        pass
    assert m.gpu_available and fake_nvml.handles[-1] == "GPU-1234"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4")
    with ResourceMonitor(gpu_index=2, metrics=("gpu_memory", "system_memory")) as m:
        pass
    assert not m.gpu_available and "not among CUDA_VISIBLE_DEVICES" in m.gpu_reason
    assert m.summary()["metric"].str.startswith("system").any()  # the host side still runs


def test_nvml_missing_or_failing_keeps_host_side(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(fail_init=True))
    with ResourceMonitor(gpu_index=0, cpu_interval=0.05, metrics=("gpu_memory", "system_memory")) as m:
        time.sleep(0.05)
    assert m.gpu_available is False and m.gpu_reason.startswith("NVML init failed: NVML Shared Library Not Found")
    assert len(m.samples()) > 0
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    with ResourceMonitor(gpu_index=0, metrics=("gpu_memory", "system_memory")) as m:
        pass
    assert m.gpu_available is False and "not installed" in m.gpu_reason


def test_failing_metric_is_recorded_and_switched_off_thread_survives(monkeypatch):
    fake = FakeNVML(fail_power=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    m = ResourceMonitor(gpu_index=0, gpu_interval=0.01, metrics=("gpu_power", "gpu_temperature"))
    with m:
        time.sleep(0.2)
        assert m.running and _monitor_threads()
    assert "gpu_power" in m.disabled and "Not Supported" in m.disabled["gpu_power"]
    assert m.error_count == 3 and all(e[1] == "gpu_power" for e in m.errors)
    s = m.summary().set_index("metric")
    assert "gpu_power_w" not in s.index and s.loc["gpu_temperature_c", "count"] > 5


def test_stop_after_exception_in_body():
    m = ResourceMonitor(device="cpu", cpu_interval=0.02)
    with pytest.raises(RuntimeError, match="boom"):
        with m:
            time.sleep(0.05)
            raise RuntimeError("boom")
    assert not m.running and not _monitor_threads()
    n = len(m.samples())
    time.sleep(0.08)
    assert len(m.samples()) == n  # nothing samples after stop
    m.start()  # restartable
    assert m.running
    m.stop()


def test_real_time_display_prints_status_lines():
    buf = io.StringIO()
    with ResourceMonitor(device="cpu", cpu_interval=0.02, display_interval=0.05, stream=buf):
        time.sleep(0.28)
    lines = [x for x in buf.getvalue().splitlines() if x]
    assert 2 <= len(lines) <= 7
    assert all("CPU:" in x and "GPU: n/a" in x for x in lines)


def test_bad_arguments_raise_before_starting():
    with pytest.raises(ValueError, match="gpu_interval"):
        ResourceMonitor(gpu_interval=0)
    with pytest.raises(ValueError, match="max_points"):
        ResourceMonitor(max_points=0)
    with pytest.raises(ValueError, match="unknown metric group 'gpu_fan'"):
        ResourceMonitor(metrics=("gpu_fan",))
    with pytest.raises(ValueError, match="display_interval"):
        ResourceMonitor(display_interval=-1)


def test_from_config_maps_switches():
    m = ResourceMonitor.from_config("production", device="cpu")
    assert m.gpu_groups == ["gpu_memory", "gpu_utilization"] and m.cpu_groups == ["system_memory"]
    assert m.gpu_interval == 1.0 and m.cpu_interval == 2.0 and m.max_points == 5000 and m.display_interval is None
    d = ResourceMonitor.from_config("development")
    assert "gpu_clocks" in d.gpu_groups and d.display_interval == 1.0


def test_plot_and_live_view_without_a_frontend(capsys):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = ResourceMonitor(device="cpu", cpu_interval=0.02).start()
    time.sleep(0.08)
    with pytest.raises(ValueError, match="interval"):
        live_view(m, interval=0)
    with live_view(m, interval=0.2, kind="table") as view:
        assert isinstance(view, LiveView) and not view.live and view.reason == "no notebook kernel"
    out = capsys.readouterr().out
    assert "process_rss_mib" in out  # the static final snapshot
    m.stop()
    fig = m.plot()
    assert len(fig.axes) == 2  # memory + utilisation panels on a CPU
    plt.close(fig)


def test_live_view_refreshes_widget_outputs():
    m = ResourceMonitor(device="cpu", cpu_interval=0.02).start()
    time.sleep(0.05)
    view = LiveView(m, interval=0.1, final=False)
    view._widget = types.SimpleNamespace(outputs=(), close=lambda: None)  # a stand-in widget
    view.start()
    time.sleep(0.35)
    out = view._widget.outputs
    view.stop()
    m.stop()
    assert view.refreshes >= 2 and not view.errors
    assert out[0]["output_type"] == "display_data" and len(out[0]["data"]["image/png"]) > 1000


def test_nvml_refcount_survives_unbalanced_release():
    fake = FakeNVML()
    monitor_mod._nvml_release(fake)  # no users: nothing to do, no shutdown
    assert fake.shutdowns == 0
