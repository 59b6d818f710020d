"""Runs the CUDA runner's prefill and decode with no GPU (perf/nogpu.py, as tests/host_path_driver.py does) under
perf/profile_step.py's ``profile()`` and prints, as JSON, how its event spans cover the launches. A subprocess of
tests/test_profile_attribution.py::

    python tests/profile_driver.py eager|graph|kernels

Every CuPy event record and every kernel launch (CuPy's path and the driver's) is stamped from one counter, so a
launch lies inside the spans ``(start, end)`` whose stamps enclose its own: the check needs nothing of the profile
but the ``{name: [(start, end), ...]}`` it yields.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from host_path_driver import NVFP4, _config, _seqs, nogpu  # installs the stand-ins (cupy)

_STAMP = itertools.count(1)
# (stamp, CUfunction handle, whether its stream was capturing a graph) of every launch, in launch order
LOG: list[tuple[int, int, bool]] = []
CAPTURED_EVENTS: list[int] = []  # stamps of events recorded while the current stream captured


def _capturing() -> bool:
    cuda = nogpu._CUDA
    return cuda.get_current_stream().ptr in cuda.capturing


def _stamped(cls: Any, method: str, handle: Callable[..., int]) -> None:
    """``cls.method`` logging each launch (its kernel's handle from the call's arguments) before it runs."""
    real = getattr(cls, method)

    def call(self: Any, *a: Any, **k: Any) -> Any:
        LOG.append((next(_STAMP), handle(self, *a), _capturing()))
        return real(self, *a, **k)

    setattr(cls, method, call)


def _record(self: Any, stream: Any = None) -> None:
    self.stamp = next(_STAMP)
    if _capturing():
        CAPTURED_EVENTS.append(self.stamp)


_stamped(nogpu._Function, "__call__", lambda f, *a: f.ptr)
_stamped(nogpu._CountedLaunch, "__call__", lambda d, cfg, func, *a: func)
nogpu._Event.record = _record  # type: ignore[method-assign]


def _kernels() -> dict[int, tuple[str, str]]:
    """CUfunction handle -> (source, name) of every kernel the loader has looked up (a name may recur in several
    sources: gemv.cu and gemv_w8.cu both have ``gemv_mma<FragNVFP4, float, 8>``)."""
    from ninfer.cuda import loader

    return {fn.ptr: key for key, (_, fn) in loader._FUNCTIONS.items()}


def _cover(spans: dict[str, list[tuple[Any, Any]]], since: int) -> dict[str, Any]:
    """Each launch logged after stamp ``since``: its kernel and the spans that enclose it (none: it escaped; two:
    nested spans counted it twice)."""
    edges = sorted((s.stamp, e.stamp, name) for name, pairs in spans.items() for s, e in pairs)
    kernels, out = _kernels(), []
    for stamp, handle, captured in (x for x in LOG if x[0] > since):
        names = [name for s, e, name in edges if s < stamp < e]
        out.append({"kernel": kernels[handle], "spans": names, "captured": captured})
    return {
        "launches": out,
        "spans": sum(len(p) for p in spans.values()),
        "captured_events": len(CAPTURED_EVENTS),
    }


def _phases(seqs: Any, lengths: list[int], steps: int) -> dict[str, Callable[[], None]]:
    net, sids = seqs.net, [seqs.new() for _ in lengths]
    rng = np.random.default_rng(2)

    def prefill() -> None:  # each prompt in its own call: GEMV rows, expert lanes, GEMMs, chunked GDN
        for s, n in zip(sids, lengths, strict=True):
            net.lm_head(seqs.forward(s, rng.integers(0, 2048, n))[-1:])

    def decode() -> None:
        for _ in range(steps):
            net.lm_head(seqs.forward_batch(np.zeros(len(sids), np.int64), sids))

    return {"prefill": prefill, "decode": decode}


# (name, MoE, format, switches of the network): the prefill and decode paths profile_step meets, and their variants
NETS = (
    ("dense", False, NVFP4, {}),
    ("dense-nofold-swiglu", False, NVFP4, {"fold_norms": False, "gemv_swiglu_out": True}),
    ("dense-bf16", False, "BF16", {}),
    ("moe", True, NVFP4, {}),
    ("moe-fused", True, NVFP4, {"moe_route_fused": True, "moe_combine_fused": True, "gemv_prefetch": True}),
    ("moe-router-swiglu", True, NVFP4, {"moe_route_router": True, "gemv_swiglu_out": True}),
)
LENGTHS = [1, 6, 12, 40, 130, 300, 400]


def run(graph: bool, key: Any = None) -> dict[str, Any]:
    """Each network of NETS: its prefill and decode phases under ``profile()`` (``profile(key)`` if given),
    eagerly or (``graph``) decoding through captured graphs; then a decode after the profile has ended."""
    from perf.profile_step import profile

    res: dict[str, Any] = {}
    for name, moe, fmt, switches in NETS:
        seqs = _seqs(_config(moe), fmt, graph=graph)
        seqs.net.keep_prefill_operands(leave=16 << 30)  # as profile_step: the kept fp16 operands' path
        for attr, value in switches.items():
            setattr(seqs.net, attr, value)
        for phase, fn in _phases(seqs, LENGTHS if not graph else [3, 12], 2).items():
            since = next(_STAMP)
            with profile(*(() if key is None else (key,))) as spans:
                fn()
            res[f"{name}-{phase}"] = _cover(spans, since)
            before = sum(len(p) for p in spans.values())
            fn()  # the profile undone: nothing more is timed
            res[f"{name}-{phase}"]["after"] = sum(len(p) for p in spans.values()) - before
    return res


def kernels() -> dict[str, Any]:
    """``profile(by_kernel)`` and ``profile(by_source)`` over the eager phases; then what the loader and the driver
    hold, and what a stand-in kept past its run (``held``: its type, launches, spans) does when called."""
    from ninfer.cuda import launch, loader
    from ninfer.cuda.activation import SOURCES
    from perf.launch_spans import by_kernel, by_source, profile

    driver = launch._driver
    out: dict[str, Any] = {"by_kernel": run(False, by_kernel), "by_source": run(False, by_source)}
    out["loader"] = sorted({type(fn).__name__ for fn in loader.looked_up().values()})
    out["undone"] = [launch._driver is driver, loader._HOOK is None]
    with profile() as spans:
        held = loader.kernel("activation.cu", SOURCES["activation.cu"], "swiglu<float>")
    n = len(LOG)
    held((1,), (32,), ())
    out["held"] = [type(held).__name__, len(LOG) - n, sum(len(p) for p in spans.values())]
    return out


if __name__ == "__main__":
    case = sys.argv[1]
    res = {"eager": lambda: run(False), "graph": lambda: run(True), "kernels": kernels}[case]()
    print(json.dumps(res))
