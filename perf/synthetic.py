"""Synthetic models at the real registered shapes, built directly on the GPU (never through a file).

Every matrix gets the exact device layout of its weight format (``ninfer.formats`` plane offsets): random code
planes, and scale planes set to moderate constants so that every weight is finite and the activations stay
bounded through all layers (timings do not depend on the values; NaNs could mislead the MoE router). Vectors
(norms, GDN gate parameters, conv taps) are drawn like the demo model's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ninfer.config import ModelConfig
from ninfer.cuda.nvfp4_layout import to_device_layout
from ninfer.cuda.upload import is_vector, plane_offsets
from ninfer.cuda.weights import PLANES, DeviceWeight
from ninfer.formats import get_format
from ninfer.reference.weights import expected_shapes

__all__ = ["synthetic_tensors", "random_weight", "PROFILES"]

PROFILES = {
    "nvfp4": "NVFP4G16_E4M3S",
    "fp8": "FP8E4M3_F32ROW",
    "q4": "Q4G64_F16S",
    "w8": "W8G32_F16S",
    "bf16": "BF16",
}
_E4M3_ONE = 0x38  # e4m3 code of 1.0


def _random_bytes(rs: Any, n: int) -> Any:
    import cupy

    words = rs.randint(0, 2**31 - 1, size=(n + 3) // 4, dtype=np.int32)
    return cupy.ascontiguousarray(words.view(np.uint8)[:n])


def random_weight(fmt: str, shape: tuple[int, ...], rs: Any, std: float) -> DeviceWeight:
    """One ``fmt`` tensor of ``shape`` with weights of roughly ``std`` spread, generated on the device."""
    import cupy

    codec = get_format(fmt)
    size = codec.encoded_size(shape)
    k = shape[-1]
    if fmt == "BF16":
        x = rs.standard_normal(size // 2, dtype=np.float32) * np.float32(std)
        data = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return DeviceWeight(fmt, shape, data, (0, 0, 0))
    host = np.empty(size, np.uint8)  # never touched: only the codec's plane offsets are read from it
    views = codec.views(host, shape)  # type: ignore[attr-defined]
    data = _random_bytes(rs, size)
    offs = plane_offsets(fmt, shape, host)
    for name, off in zip(PLANES[fmt], offs, strict=False):
        nbytes = views[name].nbytes
        if name == "scale" and fmt == "NVFP4G16_E4M3S":
            data[off : off + nbytes] = _E4M3_ONE
        elif name == "global":  # e2m1 magnitudes average ~2.7
            data[off : off + 4] = cupy.asarray(np.array([std / 2.7], np.float32).view(np.uint8))
        elif name == "scale" and fmt.startswith(("Q", "W8")):  # f16 group scales; codes average ~q/2
            qmax = {"Q4G64_F16S": 8, "Q5G64_F16S": 16, "Q6G64_F16S": 32, "W8G32_F16S": 128}[fmt]
            s = np.float16(2.0 * std / qmax).view(np.uint16)
            data[off : off + nbytes] = cupy.asarray(np.full(nbytes // 2, s, np.uint16).view(np.uint8))
        elif name == "scale":  # fp8 row / tensor scales (f32)
            data[off : off + nbytes] = cupy.asarray(
                np.full(nbytes // 4, std / 100.0, np.float32).view(np.uint8)
            )
        elif name == "codes" and fmt.startswith("FP8"):
            data[off : off + nbytes] &= 0xBF  # exponent <= 7: no NaN codes, |code| < 2
    del k
    return to_device_layout(DeviceWeight(fmt, shape, data, offs))


def _vector(cfg: ModelConfig, name: str, shape: tuple[int, ...], rs: Any) -> Any:
    import cupy

    if name.endswith("conv1d.weight"):
        return rs.uniform(-0.5, 0.5, (shape[0], shape[-1])).astype(np.float32)
    if name.endswith("A_log"):
        return cupy.log(rs.uniform(1.0, 16.0, shape)).astype(np.float32)
    if name.endswith("linear_attn.norm.weight"):
        return (1.0 + 0.1 * rs.standard_normal(shape)).astype(np.float32)
    return (0.1 * rs.standard_normal(shape)).astype(np.float32)  # offset norms (zero-centred), dt_bias


def synthetic_tensors(
    cfg: ModelConfig, profile: str = "nvfp4", seed: int = 0, *, mtp: bool = False
) -> dict[str, Any]:
    """Device tensors of the whole text model in ``profile`` (``PROFILES``); ``mtp``: also the MTP head's."""
    import cupy

    fmt = PROFILES.get(profile, profile)
    rs = cupy.random.RandomState(seed)
    out: dict[str, Any] = {}
    for name, shape in expected_shapes(cfg, mtp=mtp).items():
        if is_vector(name):
            out[name] = _vector(cfg, name, tuple(shape), rs)
        else:
            std = 1.0 if name == "embed_tokens.weight" else float(shape[-1]) ** -0.5
            out[name] = random_weight(fmt, tuple(shape), rs, std)
    cupy.cuda.Device().synchronize()
    return out
