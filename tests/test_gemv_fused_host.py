"""CPU check of cuda_src/gemv.cu's fused epilogues (the families of cuda_src/gemv_fused.cu) in the host emulation of
tests/gemv_lanes_emu.py: the dense gate | up SwiGLU epilogue (gemv_mma_gu: the down product of its output bitwise
the down product staging the SwiGLU) and the router product with moe_route's selection in its tail (gemv_mma_rr:
bitwise the plain product followed by router.cu's moe_route). The GPU tests (tests/test_cuda_gemv_swiglu.py,
tests/test_cuda_route_tail.py) check the kernels on the device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gemv_lanes_emu import F32, FMTS, cluster_twin, emulate, weight, write
from host_emu import words

from ninfer.formats import bf16_decode, bf16_round
from ninfer.reference import ops

# the SwiGLU epilogue (gemv.cu gemv_mma_gu): fmt, activation type, I (features), K, rows, gate|up splits, N2, down
# splits; N = 2 I rows, a multiple of twice the row block (both halves of a feature in one block, 4 and 8 warps)
SWIGLU_OUT_CASES = [
    (
        "NVFP4G16_E4M3S",
        "float",
        256,
        1032,
        10,
        3,
        200,
        2,
    ),  # 2 row blocks, 9 tiles as 3 splits, two lane blocks
    ("NVFP4G16_E4M3S", "bf16", 128, 256, 3, 1, 130, 1),  # one split: the block's own epilogue
    ("BF16", "float", 128, 520, 8, 2, 70, 3),  # 64-row blocks
    ("FP8E4M3_F32ROW", "bf16", 256, 384, 1, 3, 96, 2),
]


def _swiglu_out_id(c: tuple) -> str:
    return f"{c[0]}-{c[1]}-i{c[2]}-k{c[3]}-r{c[4]}-s{c[5]}-n{c[6]}-s{c[7]}"


@pytest.mark.parametrize("case", SWIGLU_OUT_CASES, ids=_swiglu_out_id)
def test_swiglu_out_is_the_swiglu_staging(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    """The SwiGLU epilogue (``gemv(..., swiglu_out=True)``: each row block holds its features' gate and up rows and
    stores silu(gate) * up): the next product of its [rows, I] output as plain input gives bitwise what the same
    product staging the SwiGLU of the plain [gate | up] output gives, 8 lanes and one per block the same bits, the
    counter and the cluster reductions the same bits, and the features against the NumPy reference."""
    _swiglu_out_case(lanes_emu, tmp_path, case, cluster=False)


@pytest.mark.parametrize("case", SWIGLU_OUT_CASES[::3], ids=_swiglu_out_id)
def test_swiglu_out_cluster_bitwise_counter(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    """The SwiGLU epilogue with its splits reduced by the clusters' rank 0: the counter path's bits."""
    _swiglu_out_case(lanes_emu, tmp_path, case, cluster=True)


def _swiglu_out_case(emu: Path, tmp_path: Path, case: tuple, *, cluster: bool) -> None:
    fmt, t, inter, k, rows, s1, n2, s2 = case
    n = 2 * inter
    rng = np.random.default_rng(inter * 11 + k)
    buf, wdec, offs = weight(rng, fmt, n, k)
    buf2, wdec2, offs2 = weight(rng, "NVFP4G16_E4M3S", n2, inter)
    x = (rng.standard_normal((rows, k)) * 0.5).astype(F32)
    x = bf16_round(x) if t == "bf16" else x
    write(tmp_path, w=buf, wsize=np.array([buf.size], np.int64), woff=np.array(offs, np.int64),
           w2=buf2, w2size=np.array([buf2.size], np.int64), w2off=np.array(offs2, np.int64),
           x=words(x, t == "bf16"))  # fmt: skip
    args = ["swiglu_out", tmp_path, FMTS.index(fmt), int(t == "bf16"), n, k, s1, rows, 3, n2, s2]
    emulate(emu, args)
    names = ("hs8", "hs1", "gu", "yo8", "yo1", "yp", "hse")
    if cluster:
        cluster_twin(emu, tmp_path, args, names)
    dt = np.uint16 if t == "bf16" else F32
    out = {m: np.fromfile(tmp_path / f"{m}.bin", dtype=dt) for m in names}
    for a, b, what in (("hs8", "hs1", "epilogue: 8 lanes != one"), ("yo8", "yo1", "down: 8 lanes != one"),
                       ("yo8", "yp", "down of the epilogue != down staging the SwiGLU")):  # fmt: skip
        assert out[a].size and np.array_equal(out[a].view(np.uint8), out[b].view(np.uint8)), what
    hse = out["hse"].reshape(rows, inter)[::-1]  # slot s read row rows - 1 - s
    assert np.array_equal(hse.view(np.uint8), out["hs1"].reshape(rows, inter).view(np.uint8)), (
        "expert slots != dense"
    )
    val = lambda y: bf16_decode(y) if t == "bf16" else y.astype(np.float64)  # noqa: E731
    gu = val(out["gu"]).reshape(rows, n)
    g, u = gu[:, :inter], gu[:, inter:]
    want = g / (1.0 + np.exp(-g)) * u
    got = val(out["hs8"]).reshape(rows, inter)
    assert np.isfinite(got).all(), "a feature was not written"
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err <= (8e-3 if t == "bf16" else 1e-6), f"silu(gate) * up: normalised error {err:.3e}"
    prod = ops.linear(x, wdec)
    ref_gu = np.max(np.abs(gu - prod)) / np.max(np.abs(prod))
    assert ref_gu <= (1.2e-2 if t == "bf16" else 2e-5), f"[gate | up] product: normalised error {ref_gu:.3e}"
    ref = ops.linear(want.astype(F32), wdec2)
    yo = val(out["yo8"]).reshape(rows, n2)
    err = np.max(np.abs(yo - ref)) / np.max(np.abs(ref))
    assert err <= (1.5e-2 if t == "bf16" else 2e-5), f"down: normalised error {err:.3e}"


# the router product with the routing in its tail (gemv.cu gemv_mma_rr): fmt, N (router rows), K, splits, rows, E,
# top-k, shared expert
RTAIL_CASES = [
    ("NVFP4G16_E4M3S", 257, 2048, 4, 1, 256, 8, True),  # the 35B-A3B's router | shared gate, one decode token
    ("NVFP4G16_E4M3S", 257, 2048, 4, 8, 256, 8, False),  # eight tokens: one 8-lane block, eight 1-lane blocks
    (
        "BF16",
        40,
        256,
        1,
        3,
        33,
        5,
        True,
    ),  # one split: every block finishes its row block itself; a lane's 2nd expert
    ("FP8E4M3_F32ROW", 130, 1024, 2, 10, 128, 4, False),  # two lane blocks of 8, a partial row block
]


@pytest.mark.parametrize(
    "case",
    RTAIL_CASES,
    ids=lambda c: f"{c[0]}-n{c[1]}-s{c[3]}-t{c[4]}-e{c[5]}k{c[6]}-{'sh' if c[7] else 'no'}",
)
def test_route_tail_is_the_product_then_moe_route(lanes_emu: Path, tmp_path: Path, case: tuple) -> None:
    """The router product with moe_route's selection in its tail (the last row block of each lane block routes its
    tokens): the logits, the ids (the shared expert's slots after the routed ones) and the weights bitwise the plain
    product followed by router.cu's moe_route, with 8-lane blocks and with one lane per block, the counters back at
    zero; the same through the cluster reduction."""
    fmt, n, k, splits, rows, e, top, shared = case
    rng = np.random.default_rng(n + 3 * k + rows)
    buf, wdec, offs = weight(rng, fmt, n, k)
    x = (rng.standard_normal((rows, k)) * 0.5).astype(F32)
    write(tmp_path, w=buf, wsize=np.array([buf.size], np.int64), woff=np.array(offs, np.int64), x=x)
    args = ["rtail", tmp_path, FMTS.index(fmt), n, k, splits, rows, 3, e, top, int(shared)]
    emulate(lanes_emu, args)
    names = ("y_ref", "ids_ref", "w_ref", "y_rr8", "ids_rr8", "w_rr8", "y_rr1", "ids_rr1", "w_rr1")
    if splits > 1:
        cluster_twin(lanes_emu, tmp_path, args, names)
    out = {
        m: np.fromfile(tmp_path / f"{m}.bin", dtype=np.int32 if m.startswith("ids") else F32) for m in names
    }
    for part in ("y", "ids", "w"):
        for lanes in ("8", "1"):
            a, b = out[f"{part}_ref"], out[f"{part}_rr{lanes}"]
            assert a.size and np.array_equal(a.view(np.uint8), b.view(np.uint8)), (
                f"{part}, {lanes}-lane blocks"
            )
    ids = out["ids_ref"]
    assert ids.min() >= 0 and ids.max() <= e and (not shared or (ids[rows * top :] == e).all())
    ref = ops.linear(x, wdec)
    assert np.max(np.abs(out["y_ref"].reshape(rows, n) - ref)) / np.max(np.abs(ref)) <= 2e-5
