"""The CUDA runner's host path without a GPU: CuPy and the CUDA driver stubbed (perf/nogpu.py), every kernel launch
recorded instead of run, in a subprocess (tests/host_path_driver.py). No value is checked (nothing computes): these
tests catch, on every machine, what used to surface only on the device: a wrapper that rejects the arguments the
model passes, a switch that breaks a path's Python, and a fusion that launches what it claims to remove.

The kernels' results are checked by the GPU tests and the host emulations (tests/test_*_host.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

DRIVER = Path(__file__).with_name("host_path_driver.py")
LAYERS, MOE_STEPS, DENSE_STEPS = 4, 3, 2
GDN_LAYERS = 3


@cache
def _run(case: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, str(DRIVER), case], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"host path {case!r} failed:\n{r.stderr[-6000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _count(launches: dict[str, int], prefix: str) -> int:
    return sum(n for k, n in launches.items() if k.startswith(prefix))


def _switches(key: str) -> dict[str, int]:
    return {p.rstrip("0123456789"): int(p[-1]) for p in key.split("-")[1:4]}


@pytest.mark.parametrize("route", [0, 1])
@pytest.mark.parametrize("combine", [0, 1])
def test_moe_decode_launches_what_its_switches_say(route: int, combine: int) -> None:
    res = _run("moe")
    keys = [k for k in res if _switches(k)["route"] == route and _switches(k)["combine"] == combine]
    assert len(keys) == 8  # 2 shared-expert forms x prefetch off/on x 1 or 3 sequences
    calls = LAYERS * MOE_STEPS  # one MoE block per layer and step
    for k in keys:
        dec = res[k]["decode"]
        assert _count(dec, "gemv_mma_rt<") == (calls if route else 0), k
        assert _count(dec, "moe_route<") == (0 if route else calls), k
        assert _count(dec, "gemv_mma_cb<") == (calls if combine else 0), k
        assert _count(dec, "moe_combine_rmsnorm<") == (0 if combine else calls), k
        # the fusions remove launches and add none
        base = res[k.replace(f"route{route}", "route0").replace(f"combine{combine}", "combine0")]["decode"]
        assert sum(dec.values()) == sum(base.values()) - (route + combine) * calls, k


def test_moe_prefill_takes_the_lane_and_gemm_paths() -> None:
    res = _run("moe")
    one = res["shared256-route0-combine0-pf0-seqs1"]["prefill"]  # 12 rows: expert lanes
    three = res["shared256-route0-combine0-pf0-seqs3"]["prefill"]  # 12, 17 and 130 rows
    assert _count(one, "gdn_chunk") > 0 and _count(one, "moe_route<") == LAYERS
    assert _count(three, "gdn_chunk_state") == 3 * GDN_LAYERS
    assert _count(three, "gemm90") > _count(one, "gemm90") > 0
    # the decode switches leave prefill alone
    for k, v in res.items():
        assert v["prefill"] == res[k.split("-")[0] + "-route0-combine0-pf0-" + k.split("-")[-1]]["prefill"], k


@pytest.mark.parametrize("fmt", ["NVFP4G16_E4M3S", "BF16"])
def test_dense_decode_folds_norms_and_takes_the_lane_instances(fmt: str) -> None:
    res = _run("dense")
    for pf in (0, 1):
        for seqs in (1, 8):
            folded = res[f"{fmt}-fold1-pf{pf}-seqs{seqs}"]["decode"]
            plain = res[f"{fmt}-fold0-pf{pf}-seqs{seqs}"]["decode"]
            # folded: only the first layer's input norm is a launch; plain: two norms per layer
            assert _count(folded, "rmsnorm<float, true, true") == DENSE_STEPS
            assert _count(plain, "rmsnorm<float, true, true") == 2 * LAYERS * DENSE_STEPS
            gemv = {k: n for k, n in folded.items() if k.startswith("gemv_mma<")}
            assert gemv and all(k.endswith(f", {seqs}>") for k in gemv), gemv  # the launch's lane count
            assert _count(folded, "gdn_step") == GDN_LAYERS * DENSE_STEPS


def test_dense_prefill_paths() -> None:
    res = _run("dense")
    one = res["NVFP4G16_E4M3S-fold1-pf0-seqs1"]["prefill"]  # a one-token prompt: the decode kernels
    many = res["NVFP4G16_E4M3S-fold1-pf0-seqs8"]["prefill"]  # 1-300 rows: lanes, GEMM, chunked GDN
    assert _count(one, "gemm90") == 0 and _count(one, "gdn_step") == GDN_LAYERS
    assert _count(many, "gemm90") > 0 and _count(many, "gdn_chunk_state") > 0


def test_graph_decode_replays_and_traces_the_prefetch_order() -> None:
    res = _run("graph")
    for model, v in res.items():
        dec = v["decode"]
        assert dec.get("graph") == MOE_STEPS, model  # every step a replay
        assert v["next"] > LAYERS, model  # the traced order of the step's GEMVs (the prefetch targets)
    # the capture's eager warm-up step and the captured step (PDL launches through the driver): both MoE fusions,
    # no standalone routing or combine kernel
    moe = res["moe"]["decode"]
    assert _count(moe, "gemv_mma_rt<") == _count(moe, "gemv_mma_cb<") == 2 * LAYERS
    assert _count(moe, "moe_route<") == _count(moe, "moe_combine_rmsnorm<") == 0


def test_engine_serves_and_reuses_on_the_cuda_runner() -> None:
    res = _run("engine")
    assert res["batch"] == [[6, None]] * 5
    cached, completion, error = res["reuse"]
    assert error is None and completion == 4
    # the first turn's prompt (195 tokens) back from the prefix cache, page-aligned at least
    assert cached >= 192


def test_w8_switch_moves_the_8_lane_gemvs_to_8_warp_blocks() -> None:
    res = _run("w8")
    for graph in (0, 1):
        off, on = res[f"graph{graph}-w80"], res[f"graph{graph}-w81"]
        assert off.keys() == on.keys()  # the same instances and launch counts, only the block size moves
        for name, threads in off.items():
            eight = name.endswith(", float, 8>")
            assert threads == {"128": sum(threads.values())}, name
            assert on[name] == ({"256": threads["128"]} if eight else threads), (name, on[name])


def test_gdn_persist_switch_moves_only_the_many_sequence_decode() -> None:
    """``gdn_step.STEP_PERSIST``: the GDN decode of 8 sequences moves from the counter kernel to the persistent
    clusters (gdn_step_clp), eagerly and captured; one sequence keeps the cluster kernel; nothing else changes."""
    res = _run("gdnp")
    for graph in (0, 1):
        for seqs in (1, 8):
            off, on = res[f"graph{graph}-persist0-seqs{seqs}"], res[f"graph{graph}-persist1-seqs{seqs}"]
            rest = {k: n for k, n in off.items() if not k.startswith("gdn_step")}
            assert rest == {k: n for k, n in on.items() if not k.startswith("gdn_step")}, (graph, seqs)
            assert _count(off, "gdn_step") == _count(on, "gdn_step") > 0
            if seqs == 1:
                assert on == off and _count(on, "gdn_step_cl<") == _count(on, "gdn_step")
            else:
                assert _count(off, "gdn_step<") == _count(on, "gdn_step_clp<") == _count(on, "gdn_step"), on


def test_ws_attention_switch_moves_the_head256_prefill_attention() -> None:
    """``attention_prefill.WS_AUTO``: at head size 256 and the default precision (bf16) the prefill attention is the
    warp-specialized kernel (attention_prefill_ws), else the wgmma one (attention_prefill_wg); nothing else moves."""
    res = _run("attnws")
    off, on = res["ws0"], res["ws1"]
    assert _count(off, "attention_prefill_wg<") > 0 and _count(off, "attention_prefill_ws<") == 0
    assert _count(on, "attention_prefill_ws<") == _count(off, "attention_prefill_wg<")
    assert _count(on, "attention_prefill_wg<") == 0
    rest = lambda d: {k: n for k, n in d.items() if not k.startswith("attention_prefill_w")}  # noqa: E731
    assert rest(off) == rest(on)


def test_swiglu_switch_moves_the_dense_gate_up_to_the_epilogue() -> None:
    """``gemv_swiglu_out``: every dense gate | up GEMV (one per layer and decode step, and those of prompts short
    enough for the GEMV) becomes the epilogue's instance (gemv_mma_gu), eagerly and captured, folded or not, and so
    does every MoE layer's decode expert gate | up launch (not with the combine in the down launch); no launch is
    added or removed, and a prompt on the GEMM path is untouched."""
    res = _run("swiglu")
    for graph in (0, 1):
        for fold in (0, 1):
            for seqs in (1, 8):
                off = res[f"graph{graph}-fold{fold}-on0-seqs{seqs}"]
                on = res[f"graph{graph}-fold{fold}-on1-seqs{seqs}"]
                key = f"graph{graph} fold{fold} seqs{seqs}"
                assert _count(off["decode"], "gemv_mma_gu") == _count(off["prefill"], "gemv_mma_gu") == 0, key
                assert _count(on["decode"], "gemv_mma_gu") == LAYERS * DENSE_STEPS, key
                for phase in ("prefill", "decode"):
                    assert sum(on[phase].values()) == sum(off[phase].values()), (key, phase)
                if seqs == 1:  # a 12-token prompt: GEMM rows, no GEMV
                    assert on["prefill"] == off["prefill"], key
                else:  # the five prompts of at most 8 tokens run the GEMV, one gate | up per layer each
                    assert _count(on["prefill"], "gemv_mma_gu") == 5 * LAYERS, key
    for comb in (0, 1):  # MoE: the experts' gate | up launches, unless the combine runs in the down launch
        for seqs in (1, 3):
            off, on = res[f"moe-combine{comb}-on0-seqs{seqs}"], res[f"moe-combine{comb}-on1-seqs{seqs}"]
            key = f"moe combine{comb} seqs{seqs}"
            # the routed experts' launch (NVFP4), and the shared expert's dense gate | up (kept apart in this model:
            # its fused weight has per-row globals, NVFP4RowG) whatever the combine
            assert _count(on["decode"], "gemv_mma_gu<FragNVFP4,") == (0 if comb else LAYERS * MOE_STEPS), key
            assert _count(on["decode"], "gemv_mma_gu<FragNVFP4RowG,") == LAYERS * MOE_STEPS, key
            assert on["prefill"] == off["prefill"], key  # prompts of 12+ tokens: GEMMs
            assert sum(on["decode"].values()) == sum(off["decode"].values()), key


def test_route_tail_switch_removes_the_moe_route_launches() -> None:
    """``moe_route_router``: every decode MoE layer's router GEMV is the routing-tail instance (gemv_mma_rr) and its
    moe_route launch is gone (one launch less per layer and step); prefill (GEMM rows) is untouched."""
    res = _run("rtail")
    for shared in (256, 512):
        for seqs in (1, 3):
            off, on = res[f"shared{shared}-on0-seqs{seqs}"], res[f"shared{shared}-on1-seqs{seqs}"]
            key = f"shared{shared} seqs{seqs}"
            assert _count(off["decode"], "moe_route") == LAYERS * MOE_STEPS, key
            assert _count(off["decode"], "gemv_mma_rr") == 0, key
            assert _count(on["decode"], "moe_route") == 0, key
            assert _count(on["decode"], "gemv_mma_rr") == LAYERS * MOE_STEPS, key
            assert sum(on["decode"].values()) == sum(off["decode"].values()) - LAYERS * MOE_STEPS, key
            assert on["prefill"] == off["prefill"], key


def test_bulk_switch_moves_the_nvfp4_gemvs_to_the_bulk_families() -> None:
    res = _run("bulk")
    moved = {"gemv.cu": "gemv_bulk.cu", "gemv_w8.cu": "gemv_w8_bulk.cu"}
    for moe in (0, 1):
        off, on = res[f"moe{moe}-bulk0"], res[f"moe{moe}-bulk1"]
        assert off.keys() == on.keys()  # the same instances, only their module moves
        assert any("gemv_bulk.cu" in v for v in on.values()) and any(
            "gemv_w8_bulk.cu" in v for v in on.values()
        )
        for name, fams in off.items():
            assert not any("bulk" in f for f in fams), name
            want = {moved[f] if name.startswith("gemv_mma<FragNVFP4") else f: n for f, n in fams.items()}
            assert on[name] == want, (name, on[name])


def test_gdn_wrappers_check_out_dtype_and_rows() -> None:
    """causal_conv, gdn_recurrent, gdn_chunked and gdn_decode take an ``out`` of their activations' dtype and rows
    and raise KernelError for any other (a float32 ``out`` for bf16 activations was accepted before, and written as
    bf16 words)."""
    res = _run("gdn_out")
    assert len(res) == 4 * 2 * 3
    for key, msg in res.items():
        name, act, case = key.split("-")
        other = "uint16" if act == "float32" else "float32"
        want = {
            "ok": "ok",
            "dtype": f"out: dtype {other} differs from x ({act})",
            "rows": "out: needs 5 rows, got 4",
        }
        assert msg == want[case], f"{key}: {msg}"
