"""Building and reading the g++ emulations of CUDA kernels (tests/host/*_emu.cpp preludes: one std::thread per CUDA
thread, block and warp barriers, NaN-filled shared memory), shared by the ``*_host.py`` tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ninfer.cuda.loader import source_text
from ninfer.formats import bf16_encode

__all__ = ["CXX", "HOST", "NVCC", "build_emulator", "build_nvcc_driver", "rel_error", "words"]

HOST = Path(__file__).parent / "host"
CXX = shutil.which("g++")
NVCC = shutil.which("nvcc")


def build_emulator(
    tmp_path_factory: pytest.TempPathFactory, name: str, parts: list[str], timeout: int = 600
) -> Path:
    """Compile the concatenation of ``parts`` (host/ files by name, ``source_text`` of cuda_src families ending in
    ``.cu``, or literal lines) into an executable; skips without g++."""
    if CXX is None:
        pytest.skip("g++ not installed")
    d = tmp_path_factory.mktemp(name)
    text = []
    for p in parts:
        if p.endswith(".cu"):
            text.append(source_text(p))
        elif p.endswith(".cpp"):
            text.append((HOST / p).read_text())
        else:
            text.append(p)
    src = d / "emu.cpp"
    src.write_text("\n".join(text))
    exe = d / "emu"
    cmd = [CXX, "-std=c++20", "-O2", "-pthread", "-w", "-o", str(exe), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe


def build_nvcc_driver(
    tmp_path_factory: pytest.TempPathFactory, name: str, text: str, timeout: int = 900, opt: str = "-O2"
) -> Path:
    """Compile a host program that includes cuda_src headers (``text``, one .cu file) with nvcc for the CPU at
    optimisation level ``opt``; skips without nvcc."""
    from ninfer.cuda.loader import CUDA_SRC

    if NVCC is None:
        pytest.skip("nvcc not installed")
    d = tmp_path_factory.mktemp(name)
    (d / "driver.cu").write_text(text)
    exe = d / "driver"
    cmd = [NVCC, "-std=c++17", opt, "-I", str(CUDA_SRC), "-o", str(exe), str(d / "driver.cu")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return exe


def words(x: np.ndarray, bf: bool) -> np.ndarray:
    """The kernel's activation words: bf16 (uint16) or float32."""
    return bf16_encode(x) if bf else np.ascontiguousarray(x, dtype=np.float32)


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref| (float64); every value of ``got`` must be finite."""
    assert np.isfinite(got).all(), f"non-finite values: {np.count_nonzero(~np.isfinite(got))}"
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
