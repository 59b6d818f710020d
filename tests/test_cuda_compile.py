"""CI compile check of every cuda_src/*.cu for sm_90 with nvcc (no GPU needed; skipped where nvcc is absent).

Each file is compiled exactly as NVRTC will see it at load (local headers inlined by the loader) together with
every template instance its wrapper module declares, so an error inside any instantiated kernel body fails here.
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ninfer.cuda import all_sources
from ninfer.cuda.loader import CUDA_SRC, source_text

NVCC = shutil.which("nvcc")


def test_every_source_has_a_family_module() -> None:
    on_disk = {p.name for p in CUDA_SRC.glob("*.cu")}
    declared = set(all_sources())
    assert on_disk == declared, (
        f"not declared: {sorted(on_disk - declared)}; missing: {sorted(declared - on_disk)}"
    )
    for src, inst in all_sources().items():
        assert inst and len(set(inst)) == len(inst), f"{src}: empty or duplicate instances"


def test_includes_are_inlined_once() -> None:
    text = source_text("gemv.cu")
    assert '#include "' not in text
    assert text.count("struct __align__(2) bf16") == 1  # common.cuh reached through two includes


def _compile(src: str, instances: tuple[str, ...], tmp: Path) -> tuple[str, int, str]:
    unit = tmp / src
    table = ",\n".join(f"    (void*)&{name}" for name in instances)
    unit.write_text(f"{source_text(src)}\nvoid* ninfer_instances[] = {{\n{table}\n}};\n")
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "--cubin", "-o", str(unit.with_suffix(".cubin")), str(unit)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return src, proc.returncode, proc.stdout + proc.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_all_sources_compile_for_sm90(tmp_path: Path) -> None:
    sources = all_sources()
    # two workers: the CI machine has few cores and nvcc is single-threaded per file
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda kv: _compile(kv[0], kv[1], tmp_path), sources.items()))
    failed = [f"{src} (rc={rc}):\n{log[-3000:]}" for src, rc, log in results if rc != 0]
    assert not failed, "nvcc failed:\n" + "\n".join(failed)
