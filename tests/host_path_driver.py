"""Runs the CUDA runner's host path with no GPU (perf/nogpu.py: CuPy and the driver stubbed, kernels not run) and
prints what it launched as JSON. A subprocess of tests/test_cuda_host_path.py, so the stand-in ``cupy`` never
meets the test process's modules::

    python tests/host_path_driver.py moe|dense|graph|w8|bulk|swiglu|rtail|engine|gdn_out

Nothing here checks a value (no kernel runs); it checks that every wrapper, plan and switch of the CUDA runner
accepts the arguments the model gives it, and which kernels each path launches.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from perf import nogpu  # noqa: E402

nogpu.install()

import numpy as np  # noqa: E402

from ninfer.config import ModelConfig  # noqa: E402
from ninfer.demo import random_weights  # noqa: E402
from ninfer.reference import DictWeights  # noqa: E402

NVFP4 = "NVFP4G16_E4M3S"
GDN3_ATTN1 = ("linear_attention", "linear_attention", "linear_attention", "full_attention")


def _config(moe: bool, shared: int = 256) -> ModelConfig:
    ffn: dict[str, Any] = (
        dict(
            num_experts=16,
            num_experts_per_tok=4,
            moe_intermediate_size=256,
            shared_expert_intermediate_size=shared,
        )
        if moe
        else dict(intermediate_size=1024)
    )
    return ModelConfig(
        arch="qwen3_5_moe" if moe else "qwen3_5", vocab_size=2048, hidden_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=128, linear_value_head_dim=128, partial_rotary_factor=0.25, mrope_section=(6, 5, 5),
        layer_types=GDN3_ATTN1, **ffn,
    )  # fmt: skip


def _seqs(cfg: ModelConfig, fmt: str = NVFP4, graph: bool = False) -> Any:
    from ninfer.cuda.model import CudaQwen36
    from ninfer.cuda.sequences import Sequences
    from ninfer.cuda.upload import encode_weights, upload_encoded

    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=4)), fmt)
    net = CudaQwen36(cfg, upload_encoded(cfg, enc), cuda_graph=graph)
    net.warmup()
    return Sequences(net, slots=9, context=1024, page_size=16)


def _phase(fn: Any) -> dict[str, int]:
    """The kernels ``fn()`` launches (name -> count)."""
    nogpu.LAUNCHES.clear()
    fn()
    return dict(nogpu.LAUNCHES)


def _prefill_then_decode(seqs: Any, lengths: list[int], steps: int) -> dict[str, dict[str, int]]:
    """Each prompt prefilled in its own sequence, then ``steps`` decode steps of all of them as one batch."""
    net, sids = seqs.net, [seqs.new() for _ in lengths]
    rng = np.random.default_rng(1)

    def prefill() -> None:
        for s, n in zip(sids, lengths, strict=True):
            net.lm_head(seqs.forward(s, rng.integers(0, 2048, n))[-1:])

    def decode() -> None:
        for _ in range(steps):
            net.lm_head(seqs.forward_batch(np.zeros(len(sids), np.int64), sids))

    out = {"prefill": _phase(prefill), "decode": _phase(decode)}
    for s in sids:
        seqs.free(s)
    return out


def moe() -> dict[str, Any]:
    """The MoE network with every combination of the decode switches, one and three decoding sequences."""
    res: dict[str, Any] = {}
    for shared in (256, 512):  # the shared expert fused into the routed weight, and kept apart
        seqs = _seqs(_config(True, shared))
        for bits in range(8):
            route, comb, pf = bool(bits & 1), bool(bits & 2), bool(bits & 4)
            seqs.net.moe_route_fused, seqs.net.moe_combine_fused, seqs.net.gemv_prefetch = route, comb, pf
            for lengths in ([12], [12, 17, 130]):
                key = f"shared{shared}-route{int(route)}-combine{int(comb)}-pf{int(pf)}-seqs{len(lengths)}"
                res[key] = _prefill_then_decode(seqs, lengths, 3)
    return res


def dense() -> dict[str, Any]:
    """The dense network: prompts on the GEMV-lane and GEMM paths (1, 8, 40 and 300 rows: chunked GDN), decode at
    one and eight sequences, with and without norm folding and L2 hints, in NVFP4 and BF16."""
    res: dict[str, Any] = {}
    for fmt in (NVFP4, "BF16"):
        seqs = _seqs(_config(False), fmt)
        for fold in (True, False):
            for pf in (False, True):
                seqs.net.fold_norms, seqs.net.gemv_prefetch = fold, pf
                for lengths in ([1], [8, 40, 300, 5, 6, 7, 9, 2]):
                    key = f"{fmt}-fold{int(fold)}-pf{int(pf)}-seqs{len(lengths)}"
                    res[key] = _prefill_then_decode(seqs, lengths, 2)
    return res


def _module_switch(module: Any, attr: str) -> Iterator[tuple[bool, bool, Any]]:
    """(graph, on, sequences of the dense network) with the module switch ``module.attr`` set to ``on``, eagerly and
    from graphs (recaptured after each change); the switch's own value back afterwards."""
    default = getattr(module, attr)
    try:
        for graph in (False, True):
            seqs = _seqs(_config(False), graph=graph)
            for on in (False, True):
                setattr(module, attr, on)
                seqs.net.graphs.clear()
                yield graph, on, seqs
    finally:
        setattr(module, attr, default)


def w8() -> dict[str, Any]:
    """The dense network's 8-lane decode with linear.GV_W8 off and on, eagerly and from graphs: threads per block of
    each GEMV instance launched (name -> {threads: launches})."""
    import ninfer.cuda.linear as linear

    res: dict[str, Any] = {}
    for graph, on, seqs in _module_switch(linear, "GV_W8"):
        nogpu.BLOCKS.clear()
        _prefill_then_decode(seqs, [8, 40, 300, 5, 6, 7, 9, 2], 2)
        blocks: dict[str, dict[int, int]] = {}
        for (name, threads), n in nogpu.BLOCKS.items():
            if name.startswith("gemv_mma"):
                blocks.setdefault(name, {})[threads] = n
        res[f"graph{int(graph)}-w8{int(on)}"] = blocks
    return res


def gdnp() -> dict[str, Any]:
    """The dense network's decode at 1 and 8 sequences with gdn_step.STEP_PERSIST off and on, eagerly and from
    graphs: the kernels launched."""
    import ninfer.cuda.gdn_step as gdn_step

    res: dict[str, Any] = {}
    for graph, on, seqs in _module_switch(gdn_step, "STEP_PERSIST"):
        for lengths in ([5], [8, 40, 300, 5, 6, 7, 9, 2]):
            res[f"graph{int(graph)}-persist{int(on)}-seqs{len(lengths)}"] = _prefill_then_decode(
                seqs, lengths, 2
            )["decode"]
    return res


def attnws() -> dict[str, Any]:
    """The dense network with head size 256 (the wgmma attentions'): prompts prefilled with
    attention_prefill.WS_AUTO off and on, eagerly and captured: the kernels launched."""
    import dataclasses

    import ninfer.cuda.attention_prefill as ap

    cfg = dataclasses.replace(_config(False), head_dim=256, partial_rotary_factor=0.125)
    res: dict[str, Any] = {}
    default = ap.WS_AUTO
    try:
        seqs = _seqs(cfg)
        for on in (False, True):
            ap.WS_AUTO = on
            res[f"ws{int(on)}"] = _prefill_then_decode(seqs, [300, 40, 1], 1)["prefill"]
    finally:
        ap.WS_AUTO = default
    return res


def swiglu() -> dict[str, Any]:
    """The dense network's decode (1 and 8 sequences) with ``gemv_swiglu_out`` off and on, eagerly and from graphs,
    fold on and off; the MoE network's (1 and 3 sequences) with the combine fusion off and on: the kernels launched
    (name -> count) per phase."""
    res: dict[str, Any] = {}
    for graph in (False, True):
        seqs = _seqs(_config(False), graph=graph)
        for fold in (True, False):
            for on in (False, True):
                seqs.net.fold_norms, seqs.net.gemv_swiglu_out = fold, on
                seqs.net.graphs.clear()
                for lengths in ([12], [8, 40, 300, 5, 6, 7, 9, 2]):
                    key = f"graph{int(graph)}-fold{int(fold)}-on{int(on)}-seqs{len(lengths)}"
                    res[key] = _prefill_then_decode(seqs, lengths, 2)
    seqs = _seqs(_config(True))  # the MoE network's expert launches (the shared expert fused into them)
    for comb in (False, True):
        for on in (False, True):
            seqs.net.moe_combine_fused, seqs.net.gemv_swiglu_out = comb, on
            for lengths in ([12], [12, 17, 130]):
                res[f"moe-combine{int(comb)}-on{int(on)}-seqs{len(lengths)}"] = _prefill_then_decode(
                    seqs, lengths, 3
                )
    return res


def rtail() -> dict[str, Any]:
    """The MoE network (the shared expert fused into the experts' weight, and apart) with ``moe_route_router`` off
    and on, one and three decoding sequences, eagerly: the kernels launched (name -> count) per phase."""
    res: dict[str, Any] = {}
    for shared in (256, 512):
        seqs = _seqs(_config(True, shared))
        for on in (False, True):
            seqs.net.moe_route_router = on
            for lengths in ([12], [12, 17, 130]):
                res[f"shared{shared}-on{int(on)}-seqs{len(lengths)}"] = _prefill_then_decode(seqs, lengths, 3)
    return res


def bulk() -> dict[str, Any]:
    """The dense and MoE networks' 1- and 8-lane decode (prefill too) with linear.GV_BULK off and on, from graphs:
    the family of each GEMV instance launched (name -> {family: launches})."""
    import ninfer.cuda.linear as linear

    res: dict[str, Any] = {}
    default, kernel = linear.GV_BULK, linear.kernel
    families: dict[str, dict[str, int]] = {}

    def traced(family: str, instances: Any, name: str) -> Any:
        f = families.setdefault(name, {})
        f[family] = f.get(family, 0) + 1
        return kernel(family, instances, name)

    linear.kernel = traced
    for moe in (False, True):
        seqs = _seqs(_config(moe), graph=True)
        for on in (False, True):
            linear.GV_BULK = on
            seqs.net.graphs.clear()
            families.clear()
            _prefill_then_decode(seqs, [8, 40, 5, 6, 7, 9, 2, 3], 2)
            _prefill_then_decode(seqs, [12], 2)
            res[f"moe{int(moe)}-bulk{int(on)}"] = {k: dict(v) for k, v in families.items()}
    linear.GV_BULK, linear.kernel = default, kernel
    return res


def graph() -> dict[str, Any]:
    """Decode through captured graphs (the capture's warm-up step runs eagerly and traces the prefetch order; each
    step then replays the graph of its lane count), dense and MoE with every decode switch on."""
    res: dict[str, Any] = {}
    for moe in (False, True):
        seqs = _seqs(_config(moe), graph=True)
        net = seqs.net
        net.gemv_prefetch = net.moe_route_fused = net.moe_combine_fused = True
        out = _prefill_then_decode(seqs, [12, 30, 5], 3)
        res["moe" if moe else "dense"] = {**out, "next": len(net.gemv_next)}
    return res


def engine() -> dict[str, Any]:
    """The engine over the demo artifact on the CUDA runner (no graphs): a batch of requests, then a session's
    second turn that resumes the first turn's prefix."""
    import tempfile

    from ninfer.cuda.model import load_cuda
    from ninfer.demo import build_demo
    from ninfer.engine import Engine
    from ninfer.model import load

    path = build_demo(Path(tempfile.mkdtemp()) / "demo.ninfer")
    model = load(path)
    model.net, model.backend = load_cuda(path, cuda_graph=False, progress=False), "cuda"
    out: dict[str, Any] = {}
    with Engine.from_model(model, max_context=512, kv_capacity=4096, max_concurrency=4) as eng:
        hs = [eng.submit(list(range(3, 40 + 9 * i)), max_tokens=6, ignore_eos=True, seed=i) for i in range(5)]
        done = [h.result(timeout=120) for h in hs]
        out["batch"] = [[c.usage.completion_tokens, c.error] for c in done]
        first = list(range(5, 200))
        eng.submit(first, max_tokens=4, ignore_eos=True).result(timeout=120)
        again = eng.submit(first + [7, 8, 9], max_tokens=4, ignore_eos=True).result(timeout=120)
        out["reuse"] = [again.usage.cached_tokens, again.usage.completion_tokens, again.error]
    return out


def _gdn_calls(act: Any) -> dict[str, tuple[int, Any]]:
    """Each GDN wrapper on zero inputs of activation dtype ``act`` (1 sequence of 5 rows, HK 1, HV 2, dk = dv =
    16): name -> (out's width, call with ``out``)."""
    import cupy

    from ninfer.cuda.gdn import causal_conv, gdn_chunked, gdn_decode, gdn_recurrent

    hk, hv, dk, dv, rows = 1, 2, 16, 16, 5
    c = 2 * hk * dk + hv * dv
    f32 = lambda *shape: cupy.zeros(shape, dtype=np.float32)  # noqa: E731
    starts, slots = cupy.asarray(np.array([0, rows], np.int32)), cupy.zeros(1, np.int32)
    conv_w, conv_state = f32(c, 4), f32(1, c, 3)
    x, z = cupy.zeros((rows, c), dtype=act), cupy.zeros((rows, hv * dv), dtype=act)
    rule = (cupy.zeros((rows, hv), dtype=act), cupy.zeros((rows, hv), dtype=act), f32(hv), f32(hv),
            f32(1, hv, dk, dv), starts, slots)  # fmt: skip
    return {
        "causal_conv": (c, lambda o: causal_conv(x, conv_w, conv_state, starts, slots, out=o)),
        "gdn_recurrent": (hv * dv, lambda o: gdn_recurrent(x, *rule, n_k_heads=hk, out=o)),
        "gdn_chunked": (hv * dv, lambda o: gdn_chunked(x, *rule, n_k_heads=hk, out=o)),
        "gdn_decode": (hv * dv, lambda o: gdn_decode(x, conv_w, conv_state, *rule, z, f32(dv), 1e-6, n_k_heads=hk,
                                                     out=o)),
    }  # fmt: skip


def gdn_out() -> dict[str, str]:
    """The GDN wrappers' ``out`` checks (no model): per wrapper, activation dtype and ``out`` (``ok``: the
    activations' dtype and rows; ``dtype``: the other activation dtype; ``rows``: one row short) the KernelError
    message, or "ok" where the call was accepted."""
    import cupy

    from ninfer.cuda.loader import KernelError

    res: dict[str, str] = {}
    for act, other in ((np.float32, np.uint16), (np.uint16, np.float32)):
        for name, (width, call) in _gdn_calls(act).items():
            for case, (rows, dt) in {"ok": (5, act), "dtype": (5, other), "rows": (4, act)}.items():
                key = f"{name}-{np.dtype(act).name}-{case}"
                try:
                    call(cupy.zeros((rows, width), dtype=dt))
                    res[key] = "ok"
                except KernelError as e:
                    res[key] = str(e)
    return res


if __name__ == "__main__":
    print(
        json.dumps(
            {
                "moe": moe,
                "dense": dense,
                "graph": graph,
                "w8": w8,
                "gdnp": gdnp,
                "attnws": attnws,
                "bulk": bulk,
                "swiglu": swiglu,
                "rtail": rtail,
                "engine": engine,
                "gdn_out": gdn_out,
            }[sys.argv[1]]()
        )
    )
