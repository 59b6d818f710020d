"""The model's tensors on the device: matrices as ``DeviceWeight`` (stored format, dequantized in the kernels),
norm vectors, GDN gate parameters and conv taps as float32 vectors.

Three ways in: :func:`upload_artifact` (memory-mapped artifact blobs through pinned staging, with a progress
bar), :func:`encode_weights` + :func:`upload_encoded` (a ``WeightSource`` encoded on the host, for tests), and
``ninfer.perf.synthetic`` (random bytes generated on the GPU). Only the text model is uploaded (no MTP head).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ninfer.artifact.inventory import expected_shapes
from ninfer.config import ModelConfig
from ninfer.cuda.nvfp4_layout import to_device_layout
from ninfer.cuda.weights import FORMAT_STRUCTS, DeviceWeight, plane_offsets
from ninfer.formats import FORMATS

if TYPE_CHECKING:
    from ninfer.reference.weights import WeightSource  # a Protocol: any name -> float32 array source

__all__ = [
    "is_vector",
    "plane_offsets",
    "upload_artifact",
    "encode_weights",
    "upload_encoded",
    "tensor_bytes",
]

STAGE_BYTES = 64 << 20  # pinned staging buffer: large enough to reach full PCIe bandwidth per copy


def is_vector(name: str) -> bool:
    """Tensors the kernels read as float32 (norms, GDN gate parameters, conv taps), not as a weight matrix."""
    return name.endswith(
        ("norm.weight", "norm_embedding.weight", "norm_hidden.weight", "A_log", "dt_bias", "conv1d.weight")
    )  # the MTP head's pre-fc norms end in _embedding / _hidden


def _vector(cfg: ModelConfig, name: str, x: np.ndarray) -> Any:
    import cupy

    x = np.asarray(x, dtype=np.float32)
    if name.endswith("conv1d.weight"):
        x = x.reshape(x.shape[0], x.shape[-1])  # [C, 1, K] -> [C, K]
    return cupy.asarray(np.ascontiguousarray(x))


def _progress(total: int, show: bool) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # progress is cosmetic
        show = False
    if not show:

        class _Null:
            def update(self, n: int) -> None: ...

            def close(self) -> None: ...

        return _Null()
    return tqdm(total=total, unit="B", unit_scale=True, desc="upload weights")


def upload_artifact(art: Any, *, progress: bool = True) -> dict[str, Any]:
    """Every text-model tensor (and the MTP head's, when the artifact carries one) of an opened artifact on the
    device. Matrix blobs are copied verbatim from the
    memory map through one pinned staging buffer (page-in, then an async copy); unsupported matrix formats
    (FP32) are re-encoded as BF16."""
    import cupy

    cfg = art.model_config
    names = list(expected_shapes(cfg, mtp=getattr(cfg, "mtp_num_hidden_layers", 0) > 0))
    bar = _progress(sum(int(art.tensor_info(n)["nbytes"]) for n in names), progress)
    mem = cupy.cuda.alloc_pinned_memory(STAGE_BYTES)
    stage = np.frombuffer(mem, np.uint8, STAGE_BYTES)
    stream = cupy.cuda.Stream(non_blocking=True)
    out: dict[str, Any] = {}
    try:
        for name in names:
            info = art.tensor_info(name)
            fmt, shape = info["format"], tuple(int(d) for d in info["shape"])
            if is_vector(name) or fmt not in FORMAT_STRUCTS:
                x = art.tensor(name)
                out[name] = _vector(cfg, name, x) if is_vector(name) else _encode_upload("BF16", x)
            else:
                raw = art.raw(name)
                dev = cupy.empty(raw.size, dtype=np.uint8)
                for off in range(0, raw.size, STAGE_BYTES):
                    n = min(STAGE_BYTES, raw.size - off)
                    stage[:n] = raw[off : off + n]
                    cupy.cuda.runtime.memcpyAsync(dev.data.ptr + off, stage.ctypes.data, n, 1, stream.ptr)
                    stream.synchronize()  # the staging buffer is refilled next
                out[name] = to_device_layout(
                    DeviceWeight(fmt, shape, dev, plane_offsets(fmt, shape, np.asarray(raw)))
                )
            bar.update(int(info["nbytes"]))
    finally:
        bar.close()
    return out


def _encode_upload(fmt: str, x: np.ndarray) -> DeviceWeight:
    from ninfer.cuda.weights import upload_weight

    return upload_weight(fmt, tuple(x.shape), FORMATS[fmt].encode(np.asarray(x, np.float32), x.shape))


def encode_weights(
    cfg: ModelConfig, weights: WeightSource, fmt_for: Callable[[str], str] | str = "BF16"
) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """Host encodings ``name -> (format, shape, bytes)`` of every text-model matrix (vectors: FP32)."""
    pick = (lambda _n: fmt_for) if isinstance(fmt_for, str) else fmt_for
    out = {}
    for name, shape in expected_shapes(cfg, mtp=False).items():
        x = np.asarray(weights.get(name), np.float32)
        fmt = "FP32" if is_vector(name) else pick(name)
        out[name] = (fmt, tuple(shape), FORMATS[fmt].encode(x, shape))
    return out


def upload_encoded(cfg: ModelConfig, encoded: Mapping[str, tuple[str, tuple[int, ...], np.ndarray]]) -> dict:
    """Device tensors from :func:`encode_weights` output."""
    from ninfer.cuda.weights import upload_weight

    out: dict[str, Any] = {}
    for name, (fmt, shape, buf) in encoded.items():
        if is_vector(name):
            out[name] = _vector(cfg, name, FORMATS[fmt].decode(buf, shape))
        else:
            out[name] = upload_weight(fmt, shape, buf)
    return out


def tensor_bytes(tensors: Mapping[str, Any]) -> int:
    """Device bytes held by a tensor dict (``DeviceWeight`` data or plain arrays)."""
    return int(sum((t.data.nbytes if isinstance(t, DeviceWeight) else t.nbytes) for t in tensors.values()))
