"""GPU inventory: the real no-driver path, and conversion against pynvml's API shape.

This machine has no NVIDIA driver, so the device path runs against an object with
pynvml's function names, returning pynvml's own ctypes structs and raising pynvml's
own error classes (built from the real NVML return codes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pynvml
import pytest

from interference.signals import GpuDevice
from node_agent.gpu import GpuInventory, device_from_nvml

MIB = 1024 * 1024


def test_no_driver_gives_no_gpus_and_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here")
    caplog.set_level(logging.DEBUG, logger="node_agent.gpu")
    inventory = GpuInventory()
    assert inventory.start() is False
    assert inventory.devices() == []
    inventory.close()
    assert [(r.levelno, "no NVIDIA driver" in r.getMessage()) for r in caplog.records] == [
        (logging.INFO, True)
    ]


def test_missing_library_gives_no_gpus_and_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="node_agent.gpu")
    inventory = GpuInventory(module_name="pynvml_not_installed_here")
    assert inventory.start() is False
    assert inventory.devices() == []
    assert len(caplog.records) == 1
    assert caplog.records[0].levelno == logging.INFO
    assert "interference-scheduler[gpu]" in caplog.records[0].getMessage()


def nvml_error(code: int) -> pynvml.NVMLError:
    error = pynvml.NVMLError(code)  # pynvml maps the code to its specific subclass
    assert type(error) is not pynvml.NVMLError
    return error


@dataclass
class FakeDevice:
    uuid: str
    name: str
    total: int
    used: int
    gpu_pct: int | None  # None: utilisation not supported (a MIG instance)
    compute_pids: list[int] = field(default_factory=list)
    graphics_pids: list[int] = field(default_factory=list)
    lost: bool = False


class NvmlLike:
    """pynvml's API surface the inventory uses, over a list of devices."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported

    def __init__(self, devices: list[FakeDevice], init_error: int | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise nvml_error(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        device = self.devices[index]
        if device.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return device

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeDevice) -> bytes:
        return handle.name.encode()  # older pynvml releases return bytes

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> pynvml.c_nvmlMemory_t:
        return pynvml.c_nvmlMemory_t(
            total=handle.total, free=handle.total - handle.used, used=handle.used
        )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> pynvml.c_nvmlUtilization_t:
        if handle.gpu_pct is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlUtilization_t(gpu=handle.gpu_pct, memory=10)

    def _processes(self, pids: list[int]) -> list[pynvml.c_nvmlProcessInfo_t]:
        return [pynvml.c_nvmlProcessInfo_t(pid=pid, usedGpuMemory=MIB) for pid in pids]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[object]:
        return self._processes(handle.compute_pids)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeDevice) -> list[object]:
        if handle.gpu_pct is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._processes(handle.graphics_pids)


H100 = FakeDevice(
    uuid="GPU-5a1c2d3e-0000-1111-2222-333344445555",
    name="NVIDIA H100 80GB HBM3",
    total=81559 * MIB,
    used=40960 * MIB,
    gpu_pct=87,
    compute_pids=[100, 101],
    graphics_pids=[101],  # one process doing both counts once
)
MIG = FakeDevice(
    uuid="MIG-0b1c2d3e-aaaa-bbbb-cccc-ddddeeeeffff",
    name="NVIDIA A100-SXM4-40GB MIG 1g.5gb",
    total=4864 * MIB,
    used=0,
    gpu_pct=None,
)


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (
            H100,
            GpuDevice(0, H100.uuid, H100.name, 81559.0, 40960.0, 87.0, 2),
        ),
        (MIG, GpuDevice(0, MIG.uuid, MIG.name, 4864.0, 0.0, 0.0, 0)),
    ],
    ids=["h100", "mig-unsupported-utilization"],
)
def test_device_from_nvml(device: FakeDevice, expected: GpuDevice) -> None:
    assert device_from_nvml(NvmlLike([device]), 0) == expected


def test_lost_gpu_is_skipped_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    lost = FakeDevice(uuid="GPU-lost", name="x", total=MIB, used=0, gpu_pct=0, lost=True)
    nvml = NvmlLike([H100, lost])
    inventory = GpuInventory(nvml=nvml)
    # Before start(): an earlier cli.main() may have left the logger at INFO.
    caplog.set_level(logging.WARNING, logger="node_agent.gpu")
    assert inventory.start() is True
    for _ in range(3):
        assert [d.uuid for d in inventory.devices()] == [H100.uuid]
    assert len(caplog.records) == 1
    assert "GPU 1" in caplog.records[0].getMessage()
    inventory.close()
    inventory.close()
    assert nvml.shutdowns == 1


def test_init_failure_of_injected_nvml_is_an_info_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="node_agent.gpu")
    inventory = GpuInventory(nvml=NvmlLike([H100], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert inventory.start() is False
    assert inventory.devices() == []
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "Driver Not Loaded" in caplog.records[0].getMessage()
