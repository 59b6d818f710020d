"""GPU name and memory through NVML (``nvidia-ml-py``). A machine without the library, the driver or a device
reports ``available=False`` with the reason: shown as absent, never raised as an error."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import msgspec

__all__ = ["GpuStatus", "GpuProbe"]


class GpuStatus(msgspec.Struct, frozen=True, kw_only=True):
    available: bool
    detail: str = ""  # why there is no GPU, when there is none
    name: str = ""
    total_bytes: int = 0
    used_bytes: int = 0
    free_bytes: int = 0


class GpuProbe:
    """Device ``index`` through NVML, initialised on first use (and retried at most every probe)."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self._lock = threading.Lock()
        self._nvml: object | None = None
        self._handle: object | None = None

    def _init(self) -> object:
        if self._handle is None:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        return self._handle

    def status(self) -> GpuStatus:
        with self._lock:
            try:
                h = self._init()
                nv = self._nvml
                mem = nv.nvmlDeviceGetMemoryInfo(h)  # type: ignore[attr-defined]
                name = nv.nvmlDeviceGetName(h)  # type: ignore[attr-defined]
            except ImportError:
                return GpuStatus(available=False, detail="nvidia-ml-py is not installed")
            except Exception as e:  # NVMLError: no driver, no device: the GPU is absent, not an error
                self._handle = None
                return GpuStatus(available=False, detail=f"no GPU: {e}")
            name = name.decode() if isinstance(name, bytes) else str(name)
            return GpuStatus(available=True, name=name, total_bytes=int(mem.total), used_bytes=int(mem.used),
                             free_bytes=int(mem.free))  # fmt: skip

    def process_bytes(self, pids: Iterable[int]) -> int:
        """GPU memory held by the processes ``pids`` (0 without NVML or a device)."""
        want = set(pids)
        with self._lock:
            try:
                h = self._init()
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(h)  # type: ignore[attr-defined]
            except Exception:  # no NVML, no device: nothing is held
                return 0
        return sum(int(p.usedGpuMemory or 0) for p in procs if p.pid in want)
