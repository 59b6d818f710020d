"""CI compile check of every cuda_src/*.cu for the H200 with nvcc (no GPU needed; skipped where nvcc is absent).

Each file is compiled exactly as NVRTC will see it at load (local headers inlined by the loader) together with
every template instance its wrapper module declares, so an error inside any instantiated kernel body fails here.
The target is the loader's for compute capability 9.0: sm_90, or sm_90a for the architecture-specific families
(gemm_sm90.cu: wgmma). The wgmma family must also assemble without ptxas serializing its wgmmas (a C7514/C7510
"wgmma.mma_async instructions are serialized" warning means the async pipeline silently became synchronous).
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ninfer.cuda import all_sources
from ninfer.cuda.loader import CUDA_SRC, source_text, target_arch

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
    arch = target_arch(src, "90")
    cmd = [
        NVCC,
        f"-arch=sm_{arch}",
        "-std=c++17",
        "-ftz=true",
        "--cubin",
        "-o",
        str(unit.with_suffix(".cubin")),
    ]
    if arch != "90":
        cmd.append("-Xptxas=-v")  # the serialization warning is printed with the resource report
    proc = subprocess.run([*cmd, str(unit)], capture_output=True, text=True, timeout=1200)
    log = proc.stdout + proc.stderr
    if proc.returncode == 0 and "are serialized" in log:
        return src, 1, log
    return src, proc.returncode, log


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_all_sources_compile_for_sm90(tmp_path: Path) -> None:
    sources = all_sources()
    # two workers: the CI machine has few cores and nvcc is single-threaded per file
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda kv: _compile(kv[0], kv[1], tmp_path), sources.items()))
    failed = [f"{src} (rc={rc}):\n{log[-3000:]}" for src, rc, log in results if rc != 0]
    assert not failed, "nvcc failed:\n" + "\n".join(failed)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_other_gdn_state_variant_compiles(tmp_path: Path) -> None:
    """The two-pass GDN variant that is not the default (compiled on first use, so not in all_sources)."""
    from ninfer.cuda.gdn import DEFAULT_VARIANT, STATE_VARIANTS, chunk_instances

    for v in STATE_VARIANTS:
        if v != DEFAULT_VARIANT:
            src, rc, log = _compile("gdn_chunk.cu", chunk_instances(v), tmp_path)
            assert rc == 0, f"gdn_chunk.cu variant {v} (rc={rc}):\n{log[-3000:]}"


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_warp_specialized_gdn_state_pass_does_not_spill(tmp_path: Path) -> None:
    """Every instance of the GDN state pass on two warp groups (gdn_state_wsp.cuh, variants "wsp", "wspq" and the
    bf16 scratch's "wspb")
    assembles without spilling: without staged Q rows two blocks share an SM (128 registers a thread), which only the
    setmaxnreg shift between the walk (152) and the output (104) meets."""
    import re

    from ninfer.cuda.gdn import chunk_instances

    instances = tuple(i for v in ("wsp", "wspq", "wspb") for i in chunk_instances(v) if "state_wsp" in i)
    _, rc, log = _compile("gdn_chunk.cu", instances, tmp_path)
    assert rc == 0, log[-3000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert len(spills) >= len(instances), "one report per instance"
    assert all(s == ("0", "0") for s in spills), "\n".join(
        line for line in log.splitlines() if "spill" in line or "Compiling" in line
    )


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("src", ["gemm_sm90_ws.cu", "attention_ws.cu"])
def test_warp_specialized_kernels_do_not_spill(tmp_path: Path, src: str) -> None:
    """Every instance of the warp-specialized families assembles without spilling: the ws GEMM (consumers hold 128
    fp32 accumulators under setmaxnreg 232) and its split-K reduction, and the warp-specialized prefill attention
    (consumers under setmaxnreg 232 hold O's 128 accumulators, S and two P fragments; the producer 32 registers).
    The ptxas report is printed (pytest -s)."""
    import re

    instances = all_sources()[src]
    _, rc, log = _compile(src, instances, tmp_path)
    assert rc == 0, log[-3000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    regs = re.findall(r"Used (\d+) registers", log)
    print("\n".join(line for line in log.splitlines() if "Function properties" in line or "Used" in line))
    assert len(spills) == len(regs) == len(instances), "one report per instance"
    assert all(s == ("0", "0") for s in spills), f"spills: {spills}"
