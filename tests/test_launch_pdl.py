"""The PDL launch path's host side (ninfer/cuda/launch.py) without a GPU: the driver structs have the CUDA ABI's
sizes and offsets, and kernel arguments become the ctypes values of the kernels' parameter types. The launch itself
runs in every GPU test that captures a decode graph (tests/test_cuda_model.py: graph == eager, bitwise)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from ninfer.cuda.launch import _Attr, _c_arg, _Config
from ninfer.cuda.loader import KernelError


def test_driver_structs_match_the_cuda_abi() -> None:
    # CUlaunchAttribute: id, 4 bytes of padding, a 64-byte value union; CUlaunchConfig: 7 uints, stream, attrs, n
    assert ctypes.sizeof(_Attr) == 72 and _Attr.value.offset == 8
    assert ctypes.sizeof(_Config) == 56
    assert (_Config.shared.offset, _Config.stream.offset, _Config.attrs.offset, _Config.num_attrs.offset) == (
        24,
        32,
        40,
        48,
    )


def test_arguments_become_the_parameter_types() -> None:
    class Buf:
        class data:  # noqa: N801 - a CuPy array's .data.ptr
            ptr = 0xDEAD0000

    a = [
        _c_arg(x)
        for x in (Buf(), np.int32(-3), np.int64(1 << 40), np.float32(0.5), np.uint32(7), np.uint64(0))
    ]
    assert isinstance(a[0], ctypes.c_void_p) and a[0].value == 0xDEAD0000
    assert isinstance(a[1], ctypes.c_int32) and a[1].value == -3
    assert isinstance(a[2], ctypes.c_int64) and a[2].value == 1 << 40
    assert isinstance(a[3], ctypes.c_float) and a[3].value == 0.5
    assert isinstance(a[4], ctypes.c_uint32) and a[4].value == 7
    assert (
        isinstance(a[5], ctypes.c_uint64) and a[5].value == 0
    )  # gdn_step's null pointers without an epilogue
    with pytest.raises(KernelError):
        _c_arg(3)  # a Python int has no fixed width: the wrappers pass NumPy scalars


def test_launch_configs_are_cached_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from ninfer.cuda import launch as la

    stream = types.SimpleNamespace(ptr=0x5000)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(la, "_CONFIGS", {})
    monkeypatch.setattr(la, "_allow_non_portable", lambda func: None)

    def fields(cfg: Any) -> tuple[Any, ...]:
        attrs = [
            (cfg.attrs[i].id, cfg.attrs[i].value.flag, tuple(cfg.attrs[i].value.dims))
            for i in range(cfg.num_attrs)
        ]
        return (tuple(cfg.grid), tuple(cfg.block), cfg.shared, cfg.stream, attrs)

    for pdl, cluster in ((False, None), (True, None), (False, (1, 2)), (True, (1, 2))):
        a, _ = la._config(7, (132,), (384,), 4096, pdl, cluster)
        assert la._config(7, (132,), (384,), 4096, pdl, cluster)[0] is a  # the same object, values unchanged
        assert fields(a) == fields(la._build_config((132,), (384,), 4096, 0x5000, pdl, cluster)[0])
        assert fields(a)[:4] == ((132, 1, 1), (384, 1, 1), 4096, 0x5000)
    assert la._config(7, [132], [384], 4096, False, None)[0].grid[0] == 132  # lists: built, not cached
    stream.ptr = 0x6000  # another stream: another configuration
    assert la._config(7, (132,), (384,), 4096, False, None)[0].stream == 0x6000
