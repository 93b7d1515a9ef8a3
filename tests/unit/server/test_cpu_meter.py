"""CpuMeter (server/cpu_meter.py): busy when the machine's CPUs are, or a watched thread runs
most of a core; never busy where /proc cannot be read."""

import threading
import time

from server import cpu_meter
from server.cpu_meter import CpuMeter


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_watched_thread_that_runs_a_whole_core_makes_it_busy():
    meter = CpuMeter(threshold=1.01, loop_threshold=0.6, window=0.2)  # the machine alone: never busy
    ready = threading.Event()
    tid = []

    def loop() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        spin(1.0)

    thread = threading.Thread(target=loop)
    thread.start()
    ready.wait()
    meter.watch(tid[0])
    time.sleep(0.5)
    assert meter.busy()
    thread.join()
    time.sleep(0.3)
    meter.busy()  # the window with the end of the spin
    time.sleep(0.3)
    assert not meter.busy()


def test_the_machine_s_cpus_make_it_busy(monkeypatch, tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\n")
    monkeypatch.setattr(cpu_meter, "STAT", str(stat))
    meter = CpuMeter(threshold=0.8, window=0.0)
    stat.write_text("cpu  190 0 100 810 0 0 0 0 0 0\n")  # 90 of 100 jiffies not idle
    assert meter.busy()
    stat.write_text("cpu  200 0 100 900 0 0 0 0 0 0\n")  # 10 of 100
    assert not meter.busy()
    monkeypatch.setattr(cpu_meter, "STAT", str(tmp_path / "missing"))
    assert not CpuMeter(window=0.0).busy()
