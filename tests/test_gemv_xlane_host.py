"""CPU check of the decode GEMV's cross-lane copies (cuda_src/wfrag.cuh): ``GV_QG64_XLANE``, a mask, 5 by default
(1: each quad lane copies 16 of a row's 64 code bytes of a tile; 2 the scale words, 4 Q5 / Q6's high words once
per quad), and ``GV_W8G32_XLANE`` (off: W8G32's codes, 32 bytes per quad lane); lanes read their words from their
quad's slots after the warp's sync in ``gv_wait_stage``; ``GV_QG64_SWZ`` places those slots for the banks.
perf/gemv_variants.py times them (noxlane, xlN, w8x, now8f, swz).

- The fragment emulation (tests/test_gemv_mma_host.py's driver built with GV_QG64_XLANE 7, GV_QG64_SWZ 1,
  GV_W8G32_XLANE 1 and GV_W8G32_FCVT 0: W8G32's codes to float by I2F, the default's being a PRMT and an FADD;
  all 32 lanes' copies land before any read) against the NumPy reference for Q4/Q5/Q6/W8G32: the same words reach
  the same mma slots.
- The launch emulation (tests/gemv_lanes_emu.py: one host thread per GPU thread, ``__syncwarp`` a real warp
  barrier, the copies and reads in the kernel's own order through the ring; its dense launches are Q4's): the
  default build bitwise the build at mask 0 (the per-lane copies) and the build at mask 7 with the bank-placed
  slots, at one and eight lanes, K split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gemv_lanes_emu import FILES, both_builds, build_lanes_emu, dense_case
from host_emu import build_nvcc_driver
from test_gemv_mma_host import DRIVER, FMTS, _host_gemv

from ninfer.cuda.linear import FRAG_STRUCTS
from ninfer.cuda.loader import source_text
from ninfer.cuda.qg64_layout import TILED_FORMATS
from ninfer.formats import FORMATS
from ninfer.reference import ops

GROUP = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S")  # W8G32: GV_W8G32_XLANE
# mask 7 (codes, scale words and Q5 / Q6's high words across the quad: every branch of the other masks) with the
# bank-placed slots (GV_QG64_SWZ 1: every slot function's swizzled branch); mask 5 is the default build, whose
# fragments tests/test_gemv_mma_host.py checks
_ON7 = "#define GV_QG64_XLANE 7\n#define GV_QG64_SWZ 1\n"
_W8X = "#define GV_W8G32_XLANE 1\n#define GV_W8G32_FCVT 0\n"


@pytest.fixture(scope="module")
def xdriver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fragment driver at mask 7 (scale and high-bit words once per quad too) and with W8G32's codes across
    the quad (GV_W8G32_XLANE 1), the group formats' cases at their FMTS codes."""
    cases = "\n".join(
        f"        case {FMTS.index(f)}: run<{FRAG_STRUCTS[f][0]}>(N, K, nrows, splits, w.data(), off, x.data(),"
        " y.data()); break;"
        for f in GROUP
    )
    text = _ON7 + _W8X + DRIVER.replace("%CASES%", cases)
    return build_nvcc_driver(tmp_path_factory, "gemv_xlane_host", text, timeout=600, opt="-O1")


@pytest.mark.parametrize("fmt", GROUP)
def test_xlane_fragments_match_reference(xdriver: Path, fmt: str) -> None:
    rng = np.random.default_rng(19)
    codec = FORMATS[fmt]
    for n, k in ((13, 200), (40, 1000), (21, 5128)):
        wf = (rng.standard_normal((n, k)) * 0.5).astype(np.float32)
        buf = np.ascontiguousarray(codec.encode(wf, (n, k)).reshape(-1).view(np.uint8))
        wdec = codec.decode(buf, (n, k))
        for b in (1, 9):
            x = (rng.standard_normal((b, k)) * 3).astype(np.float32)
            ref = ops.linear(x, wdec)
            got = _host_gemv(xdriver, fmt, buf, (n, k), x)
            err = np.max(np.abs(got.astype(np.float64) - ref), axis=1) / np.max(np.abs(ref), axis=1)
            assert err.max() <= 2e-5, f"{fmt} {n}x{k} b={b}: normalised errors {err}"


@pytest.fixture(scope="module")
def tdriver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fragment driver as built by default, the Q4G64 / Q5G64 / Q6G64 cases only."""
    cases = "\n".join(
        f"        case {FMTS.index(f)}: run<{FRAG_STRUCTS[f][0]}>(N, K, nrows, splits, w.data(), off, x.data(),"
        " y.data()); break;"
        for f in TILED_FORMATS
    )
    return build_nvcc_driver(
        tmp_path_factory, "gemv_tsc_host", DRIVER.replace("%CASES%", cases), timeout=600, opt="-O1"
    )


@pytest.mark.parametrize("fmt", TILED_FORMATS)
def test_tiled_scale_fragments_match_reference(tdriver: Path, fmt: str) -> None:
    """The group scales read from ninfer/cuda/qg64_layout.py's tiled plane: N off the 16-row groups (the padded
    rows), K off the 128-wide tile, several splits (K = 5128), one and nine rows, against the NumPy reference; the
    artifact's row-major plane given to the same driver fails it (the layout is what the reads follow)."""
    rng = np.random.default_rng(23)
    codec = FORMATS[fmt]
    for n, k in ((13, 200), (40, 1000), (21, 5128)):
        wf = (rng.standard_normal((n, k)) * 0.5).astype(np.float32)
        wf *= np.exp(rng.uniform(-2, 2, (n, 1))).astype(np.float32)  # scales that differ by row
        buf = np.ascontiguousarray(codec.encode(wf, (n, k)).reshape(-1).view(np.uint8))
        wdec = codec.decode(buf, (n, k))
        for b in (1, 9):
            x = (rng.standard_normal((b, k)) * 3).astype(np.float32)
            ref = ops.linear(x, wdec)
            got = _host_gemv(tdriver, fmt, buf, (n, k), x)
            err = np.max(np.abs(got.astype(np.float64) - ref), axis=1) / np.max(np.abs(ref), axis=1)
            assert err.max() <= 2e-5, f"{fmt} {n}x{k} b={b}: normalised errors {err}"
        wrong = _host_gemv(tdriver, fmt, buf, (n, k), x, device_layout=False)
        assert not np.allclose(wrong, ref, rtol=1e-3), f"{fmt} {n}x{k}: the row-major plane passed too"


@pytest.fixture(scope="module")
def emus(lanes_emu: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    off = "#define GV_QG64_XLANE 0\n" + source_text("gemv.cu")
    return {"base": build_lanes_emu(tmp_path_factory, gemv=off), "xlane": lanes_emu}


@pytest.mark.parametrize(
    "case", [("Q4G64_F16S", "float", 600, 1024, 1, 3), ("Q4G64_F16S", "float", 300, 2048, 8, 2)]
)
def test_xlane_launch_is_the_same_bits(emus: dict[str, Any], tmp_path: Path, case: tuple) -> None:
    both_builds(emus, tmp_path, lambda e, d: dense_case(e, d, case, cluster=False), FILES["dense"])


@pytest.fixture(scope="module")
def emus2(lanes_emu: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return {
        "base": lanes_emu,
        "xlane7": build_lanes_emu(tmp_path_factory, gemv=_ON7 + source_text("gemv.cu")),
    }


@pytest.mark.parametrize(
    "case", [("Q4G64_F16S", "float", 600, 1024, 1, 3), ("Q4G64_F16S", "float", 300, 2048, 8, 2)]
)
def test_xlane7_launch_is_the_same_bits(emus2: dict[str, Any], tmp_path: Path, case: tuple) -> None:
    """Mask 7 with GV_QG64_SWZ 1 (for Q4 mask 3: each row set's scale word copied by one quad lane, read by all
    four; the code pieces and scale words in their bank-placed slots) against the
    default build (the emulator's dense launches are Q4's; Q5 / Q6's high words: the fragment driver above)."""
    both_builds(emus2, tmp_path, lambda e, d: dense_case(e, d, case, cluster=False), FILES["dense"])
