"""Group-int formats ``Q4G64_F16S Q5G64_F16S Q6G64_F16S W8G32_F16S``, layout ``row-split-k128-v1``.

docs/formats.md §2. Codes are signed (two's complement, no zero point); each group of G columns of a row has one
IEEE binary16 multiplier: ``w[n, k] = f32(scale[n, k // G]) * f32(q[n, k])``.

Encoder ``MAXABS_F16_RECIP_RNE_V1`` per group: ``amax = max|x|``; zero -> scale +0, codes 0; else
``s = f16_rne(f32(amax / qmax))``, ``s == 0 -> 2^-24`` (0x0001), ``s == inf`` -> error,
``inv = f32(1 / s)``, ``q = clamp(rint_even(f32(x * inv)), qmin, qmax)`` (reciprocal-then-multiply is normative).
Non-finite input is rejected.

Error bound (tested): ``|w - x| <= s * (1/2 + qmax * 2^-23) + max(0, |x| - (qmax + 1/2) * s)``: half a step
(up to the f32 rounding of ``x * inv``) unless the code clamps, which only a subnormal f16 scale (rounded down
by more than 1/(2 qmax)) can cause; for normal scales ``s <= amax / qmax * (1 + 2^-11)``.

Layout for ``[N, K]`` (rank > 2: ``prod(shape[:-1])`` rows): ``K_pad = align_up(K, 128)``, ``gpr = K_pad / G``;
planes ``base @0`` (``N*gpr*32`` B), ``high @ align_up(base, 256)`` (``N*gpr*H`` B, H = 8 for Q5, 16 for Q6,
else 0) and LE f16 ``scale @ hi + align_up(high, 256)``; planes are row-major over (row, group). Base plane:
byte j = ``u[2j] & 0xF | (u[2j+1] & 0xF) << 4`` with ``u = q mod 2^b`` (W8: one int8 per lane); high plane:
bits >= 4 of each lane as an LSB-first bit stream. Padding columns and whole padding groups hold code 0; whole
padding groups have scale 0. Check: Q5 ``[2, 130]`` is 528 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .common import CHUNK_ELEMS, Buffer, Format, FormatError, align_up, padded_row_chunks

__all__ = [
    "GroupIntFormat",
    "f16_rne",
    "quantize_groups",
    "GROUPINT",
    "WIDTH_ORDER",
    "widest",
    "widen",
    "widen_planes",
]

ROW_SPLIT = "row-split-k128-v1"
ENCODER = "MAXABS_F16_RECIP_RNE_V1"
_BASE_BYTES = 32  # per group: 64 lanes x 4 bits, or 32 lanes x 8 bits
_F16_MIN_SUB = np.array([1], dtype=np.uint16).view(np.float16)[0]  # 2^-24


def f16_rne(x: np.ndarray) -> np.ndarray:
    """float32 -> float16, round to nearest even (NumPy's cast is IEEE RNE incl. subnormals; overflow -> inf)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16)


def quantize_groups(g: np.ndarray, qmin: int, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """MAXABS_F16_RECIP_RNE_V1 on float32 groups ``g[..., G]`` -> (int16 codes, float16 scales ``g.shape[:-1]``)."""
    amax = np.abs(g).max(axis=-1)
    s = f16_rne(amax / np.float32(qmax))
    s = np.where((s == 0) & (amax > 0), _F16_MIN_SUB, s)
    if np.isinf(s).any():
        bad = np.argwhere(np.isinf(s))[0].tolist()
        raise FormatError(
            f"{ENCODER}: group {bad} has amax {amax[tuple(bad)]} beyond the float16 scale range"
        )
    s32 = s.astype(np.float32)
    inv = np.float32(1) / np.where(s32 == 0, np.float32(1), s32)  # f32(1/s); zero groups give code 0 anyway
    q = np.clip(np.rint(g * inv[..., None]), qmin, qmax).astype(np.int16)
    return q, s


@dataclass(frozen=True, repr=False)
class GroupIntFormat(Format):
    id: str
    bits: int
    group: int
    qmax: int
    qmin: int
    high_bytes: int  # H: high-plane bytes per group
    layout: str = ROW_SPLIT
    min_rank: int = 2

    # ---- geometry ----------------------------------------------------------------------------------
    def geometry(self, shape: Sequence[int]) -> dict[str, int]:
        rows, cols = self.rows_cols(shape)
        gpr = align_up(cols, 128) // self.group
        base = rows * gpr * _BASE_BYTES
        hi = align_up(base, 256)
        sc = hi + align_up(rows * gpr * self.high_bytes, 256)
        return {"rows": rows, "cols": cols, "gpr": gpr, "hi": hi, "sc": sc, "total": sc + rows * gpr * 2}

    def encoded_size(self, shape: Sequence[int]) -> int:
        return self.geometry(shape)["total"]

    def views(self, buf: Buffer, shape: Sequence[int]) -> dict[str, np.ndarray]:
        """Plane views: ``base`` u8 ``[N, gpr*32]``, ``high`` u8 ``[N, gpr*H]``, ``scale`` <f2 ``[N, gpr]``."""
        geo = self.geometry(shape)
        b = self.as_bytes(buf, shape)
        n, gpr = geo["rows"], geo["gpr"]
        return {
            "base": b[: n * gpr * _BASE_BYTES].reshape(n, gpr * _BASE_BYTES),
            "high": b[geo["hi"] : geo["hi"] + n * gpr * self.high_bytes].reshape(n, gpr * self.high_bytes),
            "scale": b[geo["sc"] : geo["total"]].view("<f2").reshape(n, gpr),
        }

    # ---- encode --------------------------------------------------------------------------------------
    def encode(self, x: np.ndarray, shape: Sequence[int] | None = None) -> np.ndarray:
        arr = self.as_input(x, shape)
        self.check_finite(arr)
        geo = self.geometry(arr.shape)
        out = np.zeros(geo["total"], dtype=np.uint8)
        v = self.views(out, arr.shape)
        x2 = arr.reshape(geo["rows"], geo["cols"])
        kpad = geo["gpr"] * self.group
        for a, blk in padded_row_chunks(x2, kpad):  # padding columns are 0 -> code 0 / scale 0
            b = a + blk.shape[0]
            q, s = quantize_groups(blk.reshape(blk.shape[0], geo["gpr"], self.group), self.qmin, self.qmax)
            v["scale"][a:b] = s
            self._pack(q.reshape(blk.shape[0], kpad), v["base"][a:b], v["high"][a:b])
        return out

    def _pack(self, q: np.ndarray, base: np.ndarray, high: np.ndarray) -> None:
        if self.bits == 8:
            base[:] = q.astype(np.int8).view(np.uint8)
            return
        u = (q & ((1 << self.bits) - 1)).astype(np.uint8)
        base[:] = (u[:, 0::2] & 0xF) | ((u[:, 1::2] & 0xF) << 4)
        hb = u >> 4
        if self.bits == 5:
            high[:] = np.packbits(hb, axis=1, bitorder="little")
        elif self.bits == 6:
            high[:] = hb[:, 0::4] | (hb[:, 1::4] << 2) | (hb[:, 2::4] << 4) | (hb[:, 3::4] << 6)

    # ---- decode --------------------------------------------------------------------------------------
    def codes(self, buf: Buffer, shape: Sequence[int], r0: int, r1: int) -> np.ndarray:
        """Signed codes of rows ``[r0, r1)`` as int16 ``[r1-r0, K_pad]`` (padding columns included)."""
        self.check_row_range(shape, r0, r1)
        v = self.views(buf, shape)
        base = v["base"][r0:r1]
        if self.bits == 8:
            q = base.view(np.int8).astype(np.int16)
            if (q == -128).any():
                raise FormatError(f"{self.id}: illegal code 0x80 in rows [{r0}, {r1})")
            return q
        u = np.empty((base.shape[0], base.shape[1] * 2), dtype=np.int16)
        u[:, 0::2] = base & 0xF
        u[:, 1::2] = base >> 4
        high = v["high"][r0:r1]
        if self.bits == 5:
            u |= np.unpackbits(high, axis=1, bitorder="little").astype(np.int16) << 4
        elif self.bits == 6:
            hb = np.stack([(high >> sh) & 3 for sh in (0, 2, 4, 6)], axis=2).reshape(u.shape)
            u |= hb.astype(np.int16) << 4
        return u - ((u >> (self.bits - 1)) << self.bits)  # two's complement sign extension

    def decode_rows(self, buf: Buffer, shape: Sequence[int], r0: int, r1: int) -> np.ndarray:
        _, cols = self.check_row_range(shape, r0, r1)
        v = self.views(buf, shape)
        out = np.empty((r1 - r0, cols), dtype=np.float32)
        step = max(1, CHUNK_ELEMS // align_up(cols, 128))
        for a in range(r0, r1, step):
            b = min(a + step, r1)
            q = self.codes(buf, shape, a, b)
            s = v["scale"][a:b].astype(np.float32)
            w = q.reshape(b - a, s.shape[1], self.group).astype(np.float32) * s[:, :, None]
            out[a - r0 : b - r0] = w.reshape(b - a, -1)[:, :cols]
        return out


GROUPINT = (
    GroupIntFormat("Q4G64_F16S", bits=4, group=64, qmax=7, qmin=-8, high_bytes=0),
    GroupIntFormat("Q5G64_F16S", bits=5, group=64, qmax=15, qmin=-16, high_bytes=8),
    GroupIntFormat("Q6G64_F16S", bits=6, group=64, qmax=31, qmin=-32, high_bytes=16),
    GroupIntFormat("W8G32_F16S", bits=8, group=32, qmax=127, qmin=-127, high_bytes=0),
)


# ---- lossless widening --------------------------------------------------------------------------------------
# Every code of a format fits the codes of each later one, and a 64-wide group is two 32-wide groups with the same
# scale, so re-packing a tensor into a later format keeps every decoded value bit for bit.
WIDTH_ORDER = ("Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S", "W8G32_F16S")
_BY_ID = {f.id: f for f in GROUPINT}


def widest(format_ids: Sequence[str]) -> str | None:
    """The latest of ``format_ids`` in ``WIDTH_ORDER`` (all must be group-int formats), else None."""
    if not format_ids or any(f not in _BY_ID for f in format_ids):
        return None
    return max(format_ids, key=WIDTH_ORDER.index)


def _lane_codes(xp: object, fmt: GroupIntFormat, base: object, high: object) -> object:
    """Signed codes int16 ``[N, lanes]`` of one tensor's base/high planes (``xp``: numpy or cupy)."""
    n = base.shape[0]  # type: ignore[attr-defined]
    if fmt.bits == 8:
        return base.view(xp.int8).astype(xp.int16)  # type: ignore[attr-defined]
    u = xp.empty((n, base.shape[1] * 2), dtype=xp.int16)  # type: ignore[attr-defined]
    u[:, 0::2] = base & 0xF
    u[:, 1::2] = base >> 4
    if fmt.bits > 4:
        per = 8 // (fmt.bits - 4)  # lanes per high byte: 8 (Q5) or 4 (Q6)
        width = fmt.bits - 4
        shifts = xp.arange(per, dtype=xp.uint8) * width  # type: ignore[attr-defined]
        hb = (high[:, :, None] >> shifts) & ((1 << width) - 1)  # type: ignore[index]
        u |= hb.reshape(n, -1).astype(xp.int16) << 4  # type: ignore[attr-defined]
    return u - ((u >> (fmt.bits - 1)) << fmt.bits)


def widen_planes(
    xp: object, src: str, dst: str, base: object, high: object, scale: object
) -> tuple[object, object, object]:
    """Planes of format ``dst`` holding exactly the values of a ``src`` tensor's planes (``views()`` shapes:
    base u8 ``[N, gpr*32]``, high u8 ``[N, gpr*H]``, scale f16 ``[N, gpr]``); ``dst`` must not come before
    ``src`` in ``WIDTH_ORDER``. Works on numpy or cupy planes (``xp``)."""
    fs, fd = _BY_ID[src], _BY_ID[dst]
    if WIDTH_ORDER.index(dst) < WIDTH_ORDER.index(src):
        raise FormatError(f"cannot widen {src} to the narrower {dst}")
    q = _lane_codes(xp, fs, base, high)
    n = q.shape[0]  # type: ignore[attr-defined]
    if fd.group != fs.group:  # 64-wide groups split in two 32-wide groups of the same scale
        scale = xp.repeat(scale, fs.group // fd.group, axis=1)  # type: ignore[attr-defined]
    if fd.bits == 8:
        return q.astype(xp.int8).view(xp.uint8), xp.zeros((n, 0), xp.uint8), scale  # type: ignore[attr-defined]
    u = (q & ((1 << fd.bits) - 1)).astype(xp.uint8)  # type: ignore[attr-defined]
    out_base = (u[:, 0::2] & 0xF) | ((u[:, 1::2] & 0xF) << 4)
    hb = u >> 4
    if fd.bits == 4:
        return out_base, xp.zeros((n, 0), xp.uint8), scale  # type: ignore[attr-defined]
    width = fd.bits - 4
    per = 8 // width
    shifts = xp.arange(per, dtype=xp.uint8) * width  # type: ignore[attr-defined]
    out_high = (hb.reshape(n, -1, per) << shifts).sum(axis=2, dtype=xp.uint8)  # type: ignore[attr-defined]
    return out_base, out_high, scale


def widen(buf: Buffer, shape: Sequence[int], src: str, dst: str) -> np.ndarray:
    """The ``dst`` encoding (1-D uint8) of a ``src``-encoded tensor of ``shape``, value for value."""
    if src == dst:
        return _BY_ID[src].as_bytes(buf, shape).copy()
    v = _BY_ID[src].views(buf, shape)
    out = np.zeros(_BY_ID[dst].encoded_size(shape), np.uint8)
    d = _BY_ID[dst].views(out, shape)
    d["base"][:], d["high"][:], d["scale"][:] = widen_planes(np, src, dst, v["base"], v["high"], v["scale"])
    return out
