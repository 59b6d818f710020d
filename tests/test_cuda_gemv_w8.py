"""The 5-8-lane decode GEMV on 8-warp blocks (cuda_src/gemv_w8.cu, ``linear.GV_W8``) on the GPU: the same bits as
the 4-warp kernel. Per launch, for every float input form (plain, SwiGLU, the attention gate, a folded norm's
input) and the fold producer (the residual update and its partial sums of squares, per 4-warp row group), over
formats with one and two m-tiles per warp, K splits and N off the row blocks: every output bitwise the switch off,
and every row bitwise its one-row result. Per network: greedy decode of eight sequences (dense and MoE models),
eager and from the decode graph, the same tokens and logits with the switch on and off.

The host emulation (tests/test_gemv_w8_host.py) checks the kernel text on the CPU; tests/test_cuda_host_path.py
that the switch moves exactly the 8-lane launches. Run: ``python -m pytest -m gpu tests/test_cuda_gemv_w8.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from cuda_decode import greedy

from ninfer.config import ModelConfig
from ninfer.demo import random_weights
from ninfer.formats import FORMATS
from ninfer.reference import DictWeights

pytestmark = pytest.mark.gpu

F32 = np.float32
NVFP4 = "NVFP4G16_E4M3S"


@pytest.fixture
def cp() -> Any:
    return pytest.importorskip("cupy")


@pytest.fixture
def w8_switch() -> Iterator[Any]:
    import ninfer.cuda.linear as linear

    default = linear.GV_W8, linear.GV_W8_ONE
    yield linear
    linear.GV_W8, linear.GV_W8_ONE = default


def _weight(rng: np.random.Generator, fmt: str, n: int, k: int) -> Any:
    from ninfer.cuda.weights import upload_weight

    wf = (rng.standard_normal((n, k)) * 0.5).astype(F32)
    return upload_weight(fmt, (n, k), FORMATS[fmt].encode(wf, (n, k)))


def _bits(a: Any) -> np.ndarray:
    import cupy

    return cupy.asnumpy(a).view(np.uint8)


def _inputs(cp: Any, rng: np.random.Generator, w: Any, b: int) -> dict[str, Any]:
    """The GEMV's float input forms for ``b`` rows against ``w``, as calls."""
    from ninfer.cuda.linear import gemv
    from ninfer.cuda.norm import Normed

    k = w.cols
    x = cp.asarray((rng.standard_normal((b, 2 * k)) * 2).astype(F32))
    res = cp.asarray(rng.standard_normal((b, k)).astype(F32))
    part = cp.asarray(rng.random((7, b)).astype(F32) * k)
    nw = cp.asarray(rng.standard_normal(k).astype(F32) * 0.1)
    return {
        "plain": lambda: gemv(x[:, :k], w),
        "swiglu": lambda: gemv(x, w, swiglu=True),
        "gate": lambda: gemv(x[:, :k], w, gate=(x, 8)),
        "normed": lambda: gemv(Normed(res, part, nw, 1e-6), w),
        "rows": lambda: [gemv(x[i : i + 1, :k], w) for i in range(b)],  # each row alone (the 1-row instance)
    }


def _fold(cp: Any, w: Any, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The fold producer's residual and partials for a fixed input (the same for both settings)."""
    from ninfer.cuda.linear import gemv, gemv_plan

    g = np.random.default_rng(w.rows + b)
    x = cp.asarray(g.standard_normal((b, w.cols)).astype(F32))
    r = cp.asarray(g.standard_normal((b, w.rows)).astype(F32))
    p = cp.full((gemv_plan(w.fmt, w.rows, w.cols).blocks_x, b), np.nan, F32)
    gemv(x, w, r, fold=p)
    return _bits(r), _bits(p)


@pytest.mark.parametrize("fmt", [NVFP4, "BF16", "FP8E4M3_F32ROW", "Q4G64_F16S"])
def test_w8_products_are_the_4_warp_bits(cp: Any, w8_switch: Any, fmt: str) -> None:
    rng = np.random.default_rng(71)
    for n, k in ((600, 2048), (300, 5128), (2048, 6144), (40, 1032)):
        w = _weight(rng, fmt, n, k)
        for b in (5, 8):
            calls = _inputs(cp, rng, w, b)
            got = {}
            for on in (False, True):
                w8_switch.GV_W8 = on
                got[on] = {name: _bits(call()) for name, call in calls.items() if name != "rows"}
                got[on]["fold"] = np.concatenate([a.reshape(-1) for a in _fold(cp, w, b)])
            for name in got[False]:
                assert np.array_equal(got[False][name], got[True][name]), f"{fmt} {n}x{k}, {b} rows, {name}"
            one = np.concatenate([_bits(y) for y in calls["rows"]()])
            assert np.array_equal(got[True]["plain"].reshape(b, -1), one.reshape(b, -1)), (
                f"{fmt} {n}x{k}: rows"
            )


@pytest.mark.parametrize("fmt", [NVFP4, "Q4G64_F16S", "Q6G64_F16S", "W8G32_F16S", "BF16"])
def test_one_lane_on_8_warp_blocks_is_the_4_warp_bits(cp: Any, w8_switch: Any, fmt: str) -> None:
    """``linear.GV_W8_ONE``: a format's one-lane dense products on gemv_w8.cu's 8-warp blocks, every input form
    and the fold producer bitwise the 4-warp kernel's."""
    rng = np.random.default_rng(73)
    for n, k in ((600, 2048), (300, 5128), (40, 1032)):
        w = _weight(rng, fmt, n, k)
        calls = _inputs(cp, rng, w, 1)
        got = {}
        for on in (False, True):
            w8_switch.GV_W8, w8_switch.GV_W8_ONE = True, frozenset({fmt} if on else ())
            geo = w8_switch._geometry(
                fmt, n, k, "", False, 1, "float", True, False, "off", True, False, w8_switch.GV_W8_ONE
            )
            assert (geo[1] == "gemv_w8.cu") == on, f"{fmt}: one-lane family {geo[1]} with the switch {on}"
            got[on] = {name: _bits(call()) for name, call in calls.items() if name != "rows"}
            got[on]["fold"] = np.concatenate([a.reshape(-1) for a in _fold(cp, w, 1)])
        for name in got[False]:
            assert np.array_equal(got[False][name], got[True][name]), f"{fmt} {n}x{k}, one row, {name}"


def _dense(moe: bool) -> Any:
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences
    from ninfer.cuda.upload import encode_weights, upload_encoded

    ffn: dict[str, Any] = (
        {"num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
         "shared_expert_intermediate_size": 256}
        if moe else {"intermediate_size": 1024}
    )  # fmt: skip
    cfg = ModelConfig(
        arch="qwen3_5_moe" if moe else "qwen3_5", vocab_size=2048, hidden_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=128, linear_value_head_dim=128, partial_rotary_factor=0.25, mrope_section=(6, 5, 5),
        layer_types=("linear_attention", "linear_attention", "linear_attention", "full_attention"), **ffn,
    )  # fmt: skip
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=7)), NVFP4)
    return Sequences(CudaQwen36(cfg, upload_encoded(cfg, enc)), slots=9, context=512, page_size=16)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_decode_of_eight_sequences_is_the_same_with_w8(w8_switch: Any, moe: bool) -> None:
    pytest.importorskip("cupy")
    seqs = _dense(moe)
    prompts = [np.random.default_rng(80 + i).integers(0, 2048, 9 + 4 * i) for i in range(8)]
    got = {}
    for graph in (False, True):
        seqs.net.cuda_graph = graph
        for on in (False, True):
            w8_switch.GV_W8 = on
            seqs.net.graphs.clear()  # a graph captured with the other setting would replay its launches
            got[graph, on] = greedy(seqs, prompts, 4)
    seqs.net.graphs.clear()
    for graph in (False, True):
        toks_off, lg_off = got[graph, False]
        toks_on, lg_on = got[graph, True]
        assert toks_off == toks_on, f"graph={graph}: tokens"
        assert np.array_equal(lg_off.view(np.uint8), lg_on.view(np.uint8)), f"graph={graph}: logits"
