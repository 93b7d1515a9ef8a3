"""GPU discovery and the per-lane device assignment (pure functions, testable without a GPU).

Numbering: ``gpu_ids_list`` uses TensorFlow-visible ids, i.e. CUDA ordinals after
``CUDA_VISIBLE_DEVICES``. ``session_num`` lanes (DeepRec's sessions) run on every listed GPU, so
a group has ``session_num * len(gpu_ids_list)`` lanes, GPU-major (lane ``g * session_num + k`` is
lane ``k`` of GPU ``g``).

``use_multi_stream``:

* on: every lane has its own stream. TensorFlow: each listed GPU is split into ``session_num``
  virtual devices (``GPUOptions.Experimental.num_virtual_devices_per_gpu``), one stream each;
  lane ``k`` is logical device ``/device:GPU:k``. ONNX Runtime: one ``InferenceSession`` (one CUDA
  execution provider, one compute stream) per lane.
* off: the lanes of one GPU share its one stream: TensorFlow logical device ``/device:GPU:g``;
  ONNX Runtime one ``InferenceSession`` per GPU that its lanes share.

``use_multi_stream`` with an empty ``gpu_ids_list`` means every visible GPU. A config that asks
for a GPU on a machine where the engine sees none fails with ConfigError, unless
``gpu_fallback_to_cpu`` is set: then the same number of lanes runs on the CPU and the fallback is
reported.
"""

from __future__ import annotations

import ctypes
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class LaneDevice:
    """Where one lane runs."""

    lane: int
    gpu: int | None  # TF-visible GPU id; None on the CPU
    stream: int  # stream index on that GPU (0 when the GPU's lanes share one)
    tf_device: str  # TensorFlow logical device of the lane's dense part
    session: int  # which engine session (ORT InferenceSession) the lane runs on

    def describe(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DevicePlan:
    lanes: tuple[LaneDevice, ...]
    gpu_ids: tuple[int, ...]  # the GPUs in use ( () on the CPU)
    multi_stream: bool
    note: str = ""  # e.g. why a GPU config runs on the CPU

    @property
    def on_gpu(self) -> bool:
        return bool(self.gpu_ids)

    @property
    def sessions(self) -> int:
        return 1 + max(d.session for d in self.lanes)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"devices": "gpu" if self.on_gpu else "cpu", "gpu_ids": list(self.gpu_ids),
                               "use_multi_stream": self.multi_stream,
                               "lanes": [d.describe() for d in self.lanes]}
        if self.note:
            out["note"] = self.note
        return out


def cpu_plan(lanes: int, note: str = "") -> DevicePlan:
    return DevicePlan(tuple(LaneDevice(i, None, 0, "/device:CPU:0", i) for i in range(lanes)), (), False, note)


def virtual_cpu_plan(lanes: int) -> DevicePlan:
    """Lane ``k`` on virtual CPU device ``/device:CPU:k``: the GPU lanes' per-lane graph copies, no GPU.

    The test route of :mod:`processor.engine.tensorflow.lane_graphs`: a backend given this plan builds one
    graph copy per lane exactly as for lanes on (virtual) GPUs, on a session with ``lanes`` CPU
    devices (:func:`configure_tf_cpus`). Not reachable from a model config.
    """
    return DevicePlan(tuple(LaneDevice(i, None, 0, f"/device:CPU:{i}", i) for i in range(lanes)), (), False,
                      "virtual CPU devices, one per lane (the GPU lanes' graph-copy path run on the CPU)")


def assign_devices(gpu_ids: tuple[int, ...] | list[int], session_num: int, use_multi_stream: bool,
                   visible_gpus: int, *, fallback_to_cpu: bool = False, why_none: str = "") -> DevicePlan:
    """The device of every lane. Raises ConfigError for ids this machine does not have."""
    gpu_ids = tuple(gpu_ids)
    if not gpu_ids and not use_multi_stream:
        return cpu_plan(session_num)
    if not gpu_ids:
        gpu_ids = tuple(range(visible_gpus))
    if visible_gpus == 0:
        asked = f"gpu_ids_list {list(gpu_ids)}" if gpu_ids else "use_multi_stream"
        reason = f" ({why_none})" if why_none else ""
        if fallback_to_cpu:
            lanes = session_num * max(1, len(gpu_ids))
            return cpu_plan(lanes, f"{asked} asked for a GPU but none is visible{reason}; "
                                   f"serving {lanes} lane(s) on the CPU (gpu_fallback_to_cpu)")
        key = "gpu_ids_list" if gpu_ids else "use_multi_stream"
        raise ConfigError(f"{key}: {asked} asks for GPU execution but no GPU is visible on this machine"
                          f"{reason}; remove gpu_ids_list/use_multi_stream, or set gpu_fallback_to_cpu "
                          f"to serve on the CPU")
    beyond = [g for g in gpu_ids if g >= visible_gpus]
    if beyond:
        raise ConfigError(f"gpu_ids_list: GPU id(s) {beyond} beyond the {visible_gpus} visible GPU(s) "
                          f"(valid ids: 0..{visible_gpus - 1}, TensorFlow-visible numbering)")
    lanes = []
    for g_index, gpu in enumerate(gpu_ids):
        for lane_on_gpu in range(session_num):
            lane = g_index * session_num + lane_on_gpu
            if use_multi_stream:  # the lane's own stream on its GPU
                lanes.append(LaneDevice(lane, gpu, lane_on_gpu, f"/device:GPU:{lane}", lane))
            else:
                lanes.append(LaneDevice(lane, gpu, 0, f"/device:GPU:{g_index}", g_index))
    return DevicePlan(tuple(lanes), gpu_ids, use_multi_stream)


# --- engine settings from a plan ---------------------------------------------------------------

def configure_tf_gpus(session_config, plan: DevicePlan, session_num: int) -> None:
    """Fill ``ConfigProto.gpu_options`` for ``plan`` (nothing on the CPU)."""
    if not plan.on_gpu:
        return
    options = session_config.gpu_options
    options.visible_device_list = ",".join(str(g) for g in plan.gpu_ids)
    options.allow_growth = True
    if plan.multi_stream and session_num > 1:
        options.experimental.num_virtual_devices_per_gpu = session_num


def configure_tf_cpus(session_config, plan: DevicePlan) -> None:
    """``ConfigProto.device_count["CPU"]`` for a plan naming virtual CPU devices (``/device:CPU:k``)."""
    ids = [int(d.tf_device.rsplit(":", 1)[1]) for d in plan.lanes if d.tf_device.startswith("/device:CPU:")]
    if ids and max(ids) > 0:
        session_config.device_count["CPU"] = max(ids) + 1


def cuda_options(device: LaneDevice) -> dict[str, str]:
    """The CUDA execution provider's options for a lane's ORT session ({} on the CPU)."""
    if device.gpu is None:
        return {}
    return {"device_id": str(device.gpu), "arena_extend_strategy": "kSameAsRequested",
            "do_copy_in_default_stream": "1"}


def cpu_side(device: LaneDevice) -> LaneDevice:
    """The same lane on the CPU: where the embedding part of a split ONNX graph runs
    (:mod:`processor.engine.onnx.placement`); same session index, so the same threads and cpus."""
    return replace(device, gpu=None, stream=0, tf_device="/device:CPU:0")


def ort_providers(device: LaneDevice) -> list:
    """``providers`` for the ORT session of one lane: CUDA EP on its GPU (own stream), then CPU."""
    if device.gpu is None:
        return ["CPUExecutionProvider"]
    return [("CUDAExecutionProvider", cuda_options(device)), "CPUExecutionProvider"]


# --- discovery ----------------------------------------------------------------------------------

def tf_visible_gpus() -> tuple[int, str]:
    """(GPUs TensorFlow sees, why none when 0)."""
    import tensorflow as tf

    count = len(tf.config.list_physical_devices("GPU"))
    if count:
        return count, ""
    if not tf.test.is_built_with_cuda():
        return 0, f"this TensorFlow {tf.__version__} is built without CUDA (tensorflow-cpu)"
    return 0, "TensorFlow finds no CUDA device"


def ort_visible_gpus() -> tuple[int, str]:
    """(GPUs the ONNX Runtime CUDA provider can use, why none when 0)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return 0, f"onnxruntime {ort.__version__} has no CUDA execution provider (install onnxruntime-gpu)"
    count = cuda_device_count()
    return count, "" if count else "the CUDA driver reports no device"


def cuda_device_count() -> int:
    """CUDA devices the driver reports (honours CUDA_VISIBLE_DEVICES); 0 without a driver."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def plan_for(config, engine: str) -> DevicePlan:
    """The device plan for a ModelConfig on this machine; engine is 'tensorflow' or 'onnxruntime'."""
    if not config.gpu_ids_list and not config.use_multi_stream:
        return cpu_plan(config.session_num)
    visible, why = tf_visible_gpus() if engine == "tensorflow" else ort_visible_gpus()
    return assign_devices(config.gpu_ids_list, config.session_num, config.use_multi_stream, visible,
                          fallback_to_cpu=config.gpu_fallback_to_cpu, why_none=why)
