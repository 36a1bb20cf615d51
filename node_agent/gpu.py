"""GPU inventory through NVML (``pynvml`` from the optional ``nvidia-ml-py`` extra).

Per device: index, UUID, model, memory total/used (MiB), GPU utilisation (%) and the
number of processes using it. On a node without the NVIDIA driver or without
``nvidia-ml-py`` the inventory is empty, said once at INFO, and never an error.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from interference.signals import GpuDevice

log = logging.getLogger(__name__)

_MIB = 1024 * 1024


def device_from_nvml(nvml: Any, index: int) -> GpuDevice:
    """Read one device through the ``pynvml`` API.

    Utilisation and the process list are not supported on every device (MIG instances,
    some vGPUs); they read as 0 there. Any other NVML error propagates.
    """
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        utilization_pct = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError_NotSupported:
        utilization_pct = 0.0
    pids: set[int] = set()
    for list_processes in (
        nvml.nvmlDeviceGetComputeRunningProcesses,
        nvml.nvmlDeviceGetGraphicsRunningProcesses,
    ):
        try:
            pids.update(process.pid for process in list_processes(handle))
        except nvml.NVMLError_NotSupported:
            continue
    return GpuDevice(
        index=index,
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        model=_text(nvml.nvmlDeviceGetName(handle)),
        memory_total_mib=memory.total / _MIB,
        memory_used_mib=memory.used / _MIB,
        utilization_pct=utilization_pct,
        process_count=len(pids),
    )


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str on Python 3, older pynvml releases returned bytes
    return value.decode() if isinstance(value, bytes) else value


class GpuInventory:
    """The node's GPUs; ``start()`` once, ``devices()`` every interval, ``close()`` at exit."""

    def __init__(self, module_name: str = "pynvml", nvml: Any = None) -> None:
        """``nvml`` replaces the imported module (an object with pynvml's API)."""
        self._module_name = module_name
        self._nvml: Any = nvml
        self._started = False
        self._failing: set[int] = set()

    @property
    def available(self) -> bool:
        """Whether NVML initialised (a driver and the library are present)."""
        return self._started

    def start(self) -> bool:
        """Load and initialise NVML; ``False`` (logged once at INFO) when there is none."""
        if self._started:
            return True
        nvml = self._nvml
        if nvml is None:
            try:
                nvml = importlib.import_module(self._module_name)
            except ImportError:
                log.info(
                    "GPU inventory off: %s is not installed (pip install "
                    "'interference-scheduler[gpu]' on GPU nodes)",
                    self._module_name,
                )
                return False
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            log.info("GPU inventory off: no NVIDIA driver/NVML on this node (%s)", exc)
            return False
        self._nvml = nvml
        self._started = True
        log.info("GPU inventory on: NVIDIA driver %s", self._driver_version())
        return True

    def _driver_version(self) -> str:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError:
            return "unknown"

    def devices(self) -> list[GpuDevice]:
        """Every device NVML can read now; a failing device is logged once and skipped."""
        if not self._started:
            return []
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            log.warning("NVML cannot count devices (%s); reporting no GPUs this interval", exc)
            return []
        found: list[GpuDevice] = []
        for index in range(count):
            try:
                found.append(device_from_nvml(nvml, index))
            except nvml.NVMLError as exc:
                if index not in self._failing:
                    log.warning("GPU %d unreadable through NVML (%s); skipping it", index, exc)
                    self._failing.add(index)
                continue
            self._failing.discard(index)
        return found

    def close(self) -> None:
        """Shut NVML down; safe to call twice."""
        if self._started:
            self._started = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)
