"""Weight formats: exact NumPy encode/decode, one registry keyed by format id.

```python
fmt = FORMATS["Q4G64_F16S"]                 # fmt.id, fmt.layout
buf = fmt.encode(x_f32, shape)              # 1-D uint8 array of fmt.encoded_size(shape) bytes
w = fmt.decode(buf, shape)                  # float32 (I32: int32), shape
rows = fmt.decode_rows(buf, shape, r0, r1)  # float32 [r1-r0, shape[-1]] of the prod(shape[:-1]) row view
```
Quantizing formats also expose ``views(buf, shape)`` (named plane views for device upload). Every error is a
``FormatError`` (a ``ValueError``). Bounds and layouts are documented in each module.

| id | layout | module |
|---|---|---|
| BF16 FP32 I32 | contiguous-le-v1 | bf16 |
| Q4G64_F16S Q5G64_F16S Q6G64_F16S W8G32_F16S | row-split-k128-v1 | groupint |
| NVFP4G16_E4M3S | nvfp4-rows-k128-v1 | nvfp4 |
| FP8E4M3_F32ROW / FP8E4M3_F32T | fp8-rows-v1 / fp8-tensor-v1 | fp8 |
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from .bf16 import BF16Format, FP32Format, I32Format, bf16_decode, bf16_encode, bf16_round
from .common import Format, FormatError, align_up
from .fp8 import E4M3_MAX, FP8RowFormat, FP8TensorFormat, e4m3_decode, e4m3_encode, e4m3_table
from .groupint import ENCODER as GROUPINT_ENCODER
from .groupint import GROUPINT, GroupIntFormat, f16_rne, quantize_groups
from .nvfp4 import E2M1_VALUES, NVFP4Format, e2m1_decode, e2m1_encode

__all__ = [
    "FORMATS",
    "LAYOUTS",
    "Format",
    "FormatError",
    "GroupIntFormat",
    "GROUPINT_ENCODER",
    "get_format",
    "encoded_size",
    "align_up",
    "bf16_encode",
    "bf16_decode",
    "bf16_round",
    "e4m3_encode",
    "e4m3_decode",
    "e4m3_table",
    "E4M3_MAX",
    "e2m1_encode",
    "e2m1_decode",
    "E2M1_VALUES",
    "f16_rne",
    "quantize_groups",
]

FORMATS: MappingProxyType[str, Format] = MappingProxyType(
    {
        f.id: f
        for f in (
            BF16Format(),
            FP32Format(),
            I32Format(),
            *GROUPINT,
            NVFP4Format(),
            FP8RowFormat(),
            FP8TensorFormat(),
        )
    }
)

# layout id -> format ids stored under it
LAYOUTS: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {
        lay: tuple(f.id for f in FORMATS.values() if f.layout == lay)
        for lay in {f.layout for f in FORMATS.values()}
    }
)


def get_format(format_id: str) -> Format:
    """The format with this id, or a ``FormatError`` listing the known ids."""
    try:
        return FORMATS[format_id]
    except (KeyError, TypeError):
        raise FormatError(f"unknown weight format {format_id!r} (known: {' '.join(FORMATS)})") from None


def encoded_size(format_id: str, shape: Sequence[int]) -> int:
    return get_format(format_id).encoded_size(shape)
