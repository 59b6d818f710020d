"""perf/profile_step.py's ``profile()`` attributes every launch of the cuda_src kernels, with no GPU: the CUDA
runner's prefill and decode over perf/nogpu.py's stand-ins (as tests/test_cuda_host_path.py), every event record
and launch stamped in order (tests/profile_driver.py, in a subprocess so that the stand-in ``cupy`` never meets this
process's modules). A launch that no span encloses would show as ``other`` on the device (the 27B's SwiGLU gate |
up GEMM, the 35B-A3B's expert GEMMs and GEMVs did, until the launches were intercepted at the loader and driver).
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

DRIVER = Path(__file__).with_name("profile_driver.py")


@cache
def _run(case: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, str(DRIVER), case], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"profile driver {case!r} failed:\n{r.stderr[-6000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _misses(phase: dict[str, Any]) -> list[str]:
    """Each launch not enclosed by exactly one span (none while its stream captured a graph): kernel and spans."""
    return [
        f"{x['kernel']} in {x['spans']}"
        for x in phase["launches"]
        if len(x["spans"]) != (0 if x["captured"] else 1)
    ]


def test_every_eager_launch_is_in_one_span() -> None:
    """Prefill (GEMV rows, expert lanes, GEMMs with the SwiGLU epilogue, grouped expert GEMMs, chunked GDN) and
    decode of the dense and MoE networks with their switches: each launch timed once, and one span per launch."""
    res = _run("eager")
    for key, phase in res.items():
        assert phase["launches"], key
        assert not _misses(phase), (key, _misses(phase)[:10])
        assert phase["spans"] == len(phase["launches"]), key
        assert phase["after"] == 0, key  # the profile ended: the same phase again adds no span


def test_no_event_inside_a_graph_capture() -> None:
    """Decode through captured graphs under the profile: the capture's eager warm-up launches are timed, the
    captured ones are not (no event recorded while the stream captures), the replays launch nothing of ours."""
    res = _run("graph")
    for key, phase in res.items():
        assert phase["captured_events"] == 0, key
        assert not _misses(phase), (key, _misses(phase)[:10])
    assert any(x["captured"] for x in res["moe-decode"]["launches"])  # a capture happened inside the profile


def test_spans_are_named_by_kernel_and_by_source() -> None:
    """``by_kernel``: the kernel's name less its template arguments; ``by_source`` (the default): its cuda_src
    file's stem, for the function the launch used (gemv.cu and gemv_w8.cu share kernel names)."""
    res = _run("kernels")
    names = {"by_kernel": lambda src, name: name.split("<")[0], "by_source": lambda src, name: src[:-3]}
    for by, want in names.items():
        for key, phase in res[by].items():
            wrong = [x for x in phase["launches"] if x["spans"] != [want(*x["kernel"])]]
            assert not wrong, (by, key, wrong[:5])
    families = {x["spans"][0] for phase in res["by_source"].values() for x in phase["launches"]}
    assert {"gemm_sm90", "gemm_sm90_ws", "gemv", "gdn_chunk", "norm", "moe_lanes"} <= families


def test_profile_is_undone() -> None:
    """After the runs: the driver is the original, the loader hands out and caches plain functions, and a stand-in
    kept past its run launches untimed."""
    res = _run("kernels")
    assert res["undone"] == [True, True]
    assert res["loader"] == ["_Function"]  # nogpu's kernel functions, no stand-in
    assert res["held"] == ["_Timed", 1, 0]
