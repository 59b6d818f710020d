"""Tensor-core prefill attention (cuda_src/attention_prefill.cu) against NumPy causal attention on the decoded cache.

GPU tests (marked ``gpu``): fresh random inputs, several shapes (head dims 32-256, GQA groups 1-8, page sizes
16/64, lengths 1-1100, several sequences packed with different start positions, i.e. chunks that continue a
prefix), float32 and bf16 q, outputs poisoned with NaN and cache slots past each sequence's end poisoned with NaN
(the kernel must never read them). Both mma.sync kernels (``variant="gqa"``: a KV head's query heads in one block;
``variant="head"``: one query head per block) against the reference and against each other bitwise (the same
arithmetic per row), and a row's bits against its batch, its block and the prompt's chunking; the wgmma kernel
(``variant="wg"``, sm_90a, D = 256: the GQA block with its products as warpgroup MMAs) against the reference and
the mma.sync kernel, and its rows' bits against their batch, chunking and key splits as the GQA kernel's; the
warp-specialized kernel (``variant="ws"``) bitwise the wgmma kernel at precision "bf16" under each of its options. CPU test: a NumPy mirror of the kernel's block/segment/tile loop (which rows
form a segment, which KV tiles are visited, which keys each row keeps) checked against the reference.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from ninfer.cuda.attention_prefill import BLOCK_ROWS, block_keys
from ninfer.formats import bf16_decode, bf16_encode, bf16_round
from ninfer.reference import ops

F32 = np.float32
TOL = {"float": 5e-5, "bf16": 1.2e-2}  # normalised max error per q dtype
BF16_NAN = 0x7FC0
# (HQ, HKV, D, page size, start positions, new rows per sequence)
CASES = (
    (8, 8, 64, 16, [0], [1]),
    (4, 2, 64, 64, [0, 0, 0], [17, 64, 65]),
    (8, 2, 128, 16, [0, 30, 100], [300, 9, 65]),
    (8, 1, 128, 64, [0], [1100]),
    (6, 2, 256, 16, [5, 0], [64, 300]),
    (24, 4, 256, 64, [1000, 0], [100, 17]),
    (2, 1, 256, 16, [0], [1100]),
    (4, 2, 32, 16, [3, 0], [40, 1]),
    (16, 2, 256, 16, [0, 300], [700, 40]),  # the 35B-A3B's heads
    (24, 4, 256, 16, [0], [600]),  # the 27B's heads
)


def _inputs(rng: np.random.Generator, shape: tuple[int, ...], t: str) -> np.ndarray:
    x = rng.standard_normal(shape).astype(F32)
    return bf16_round(x) if t == "bf16" else x


def _pages(rng: np.random.Generator, lens: list[int], page: int) -> tuple[np.ndarray, int]:
    per = [max(1, -(-n // page)) for n in lens]
    total = sum(per) + 3
    perm = rng.permutation(total).astype(np.int32)
    table = np.zeros((len(lens), max(per)), dtype=np.int32)
    at = 0
    for b, p in enumerate(per):
        table[b, :p] = perm[at : at + p]
        at += p
    return table, total


def _problem(rng: np.random.Generator, case: tuple, t: str) -> dict[str, Any]:
    """Random q and caches; cache slots not holding a sequence's position < its length are NaN (bf16 words)."""
    hq, hkv, d, page, starts, news = case
    lens = [s + n for s, n in zip(starts, news, strict=True)]
    table, total = _pages(rng, lens, page)
    kc = bf16_encode(_inputs(rng, (total, page, hkv, d), "bf16"))
    vc = bf16_encode(_inputs(rng, (total, page, hkv, d), "bf16"))
    live = np.zeros(total * page, dtype=bool)
    for b, n in enumerate(lens):
        p = np.arange(n)
        live[table[b, p // page] * page + p % page] = True
    kc.reshape(total * page, -1)[~live] = BF16_NAN
    vc.reshape(total * page, -1)[~live] = BF16_NAN
    q = _inputs(rng, (sum(news), hq, d), t)
    row_seq = np.repeat(np.arange(len(news)), news).astype(np.int32)
    row_pos = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, news, strict=True)]).astype(
        np.int32
    )
    ref = np.empty(q.shape, dtype=np.float64)
    at = 0
    for b, (s, n) in enumerate(zip(starts, news, strict=True)):
        seq_k = bf16_decode(kc[table[b]]).reshape(-1, hkv, d)[: lens[b]]
        seq_v = bf16_decode(vc[table[b]]).reshape(-1, hkv, d)[: lens[b]]
        ref[at : at + n] = ops.attention(q[at : at + n], seq_k, seq_v, s)
        at += n
    return dict(q=q, kc=kc, vc=vc, table=table, row_seq=row_seq, row_pos=row_pos, ref=ref, max_len=max(lens))


def _err(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape
    assert np.isfinite(got).all(), f"non-finite output ({np.count_nonzero(~np.isfinite(got))} values)"
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def _run(
    cp: Any,
    pr: dict[str, Any],
    t: str,
    rows: np.ndarray | None = None,
    variant: str = "gqa",
    split_keys: int | None = 0,
    precision: str = "exact",
) -> np.ndarray:
    """The kernel's output for launch rows ``rows``; ``split_keys`` 0 (no key splits: the bitwise checks between
    kernels and launches), None (the wrapper's choice) or keys per split."""
    from ninfer.cuda.attention_prefill import attention_prefill

    rows = np.arange(pr["q"].shape[0]) if rows is None else rows
    q = pr["q"][rows]
    qd = cp.asarray(bf16_encode(q) if t == "bf16" else q)
    out = cp.full(q.shape, BF16_NAN, dtype=np.uint16) if t == "bf16" else cp.full(q.shape, np.nan, dtype=F32)
    attention_prefill(qd, cp.asarray(pr["kc"]), cp.asarray(pr["vc"]), cp.asarray(pr["table"]),
                      cp.asarray(pr["row_seq"][rows]), cp.asarray(pr["row_pos"][rows]), max_len=pr["max_len"],
                      out=out, variant=variant, split_keys=split_keys, precision=precision)  # fmt: skip
    h = cp.asnumpy(out)
    return bf16_decode(h) if t == "bf16" else h


@pytest.mark.gpu
@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"hq{c[0]}-hkv{c[1]}-d{c[2]}-p{c[3]}-n{sum(c[5])}")
def test_prefill_matches_reference(t: str, case: tuple) -> None:
    """Both kernels against the reference, and bitwise against each other."""
    cp = pytest.importorskip("cupy")
    pr = _problem(np.random.default_rng([CASES.index(case), t == "bf16"]), case, t)
    got = _run(cp, pr, t)
    err = _err(got, pr["ref"])
    assert err <= TOL[t], f"normalised max error {err:.3e} > {TOL[t]:.1e}"
    old = _run(cp, pr, t, variant="head")
    assert _err(old, pr["ref"]) <= TOL[t]
    assert np.array_equal(got.view(np.uint32), old.view(np.uint32)), (
        f"GQA and one-head kernels differ: max |diff| {np.max(np.abs(got - old)):.3e}"
    )


def _need_wg() -> None:
    from ninfer.cuda.loader import compute_capability, family_supported

    if not family_supported("attention_wg.cu", compute_capability()):
        pytest.skip("the wgmma kernel is compiled for sm_90a only")


WG_CASES = tuple(c for c in CASES if c[2] == 256)


@pytest.mark.gpu
@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("case", WG_CASES, ids=lambda c: f"hq{c[0]}-hkv{c[1]}-p{c[3]}-n{sum(c[5])}")
def test_prefill_wg_matches_reference(t: str, case: tuple) -> None:
    """The wgmma kernel against the reference, the mma.sync kernel (within fp32 rounding: the tensor cores'
    internal sums of the two instructions need not agree bit for bit) and "auto", which picks it here."""
    cp = pytest.importorskip("cupy")
    _need_wg()
    from ninfer.cuda.attention_prefill import pick_variant

    assert pick_variant(case[2], case[0] // case[1]) == "wg"
    pr = _problem(np.random.default_rng([CASES.index(case), t == "bf16", 7]), case, t)
    got = _run(cp, pr, t, variant="wg")
    err = _err(got, pr["ref"])
    assert err <= TOL[t], f"normalised max error {err:.3e} > {TOL[t]:.1e}"
    sync = _run(cp, pr, t, variant="gqa")
    assert _err(got, sync) <= (2e-6 if t == "float" else TOL[t]), "wgmma and mma.sync kernels disagree"
    assert np.array_equal(_run(cp, pr, t, variant="auto").view(np.uint32), got.view(np.uint32))


# the wgmma kernel's rounded operands (PRECISIONS): normalised max error against the exact reference. P rounded to
# bf16 moves each probability by <= 2^-9 of itself; q rounded too moves each score by ~2^-9 of |q||k| / sqrt(D).
PREC_TOL = {"p-bf16": 4e-3, "bf16": 8e-3}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", sorted(PREC_TOL))
@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("case", WG_CASES, ids=lambda c: f"hq{c[0]}-hkv{c[1]}-p{c[3]}-n{sum(c[5])}")
def test_prefill_wg_precision_matches_reference(t: str, case: tuple, precision: str) -> None:
    """The rounded precisions against the exact reference within their rounding, "auto" picking the same kernel,
    and not the exact kernel's bits (the rounding is applied); key splits agree with the unsplit launch."""
    cp = pytest.importorskip("cupy")
    _need_wg()
    pr = _problem(np.random.default_rng([CASES.index(case), t == "bf16", 11]), case, t)
    got = _run(cp, pr, t, variant="wg", precision=precision)
    err = _err(got, pr["ref"])
    tol = max(PREC_TOL[precision], TOL[t])
    assert err <= tol, f"normalised max error {err:.3e} > {tol:.1e}"
    auto = _run(cp, pr, t, variant="auto", precision=precision)
    assert np.array_equal(auto.view(np.uint32), got.view(np.uint32))
    exact = _run(cp, pr, t, variant="wg")
    assert not np.array_equal(exact.view(np.uint32), got.view(np.uint32)), "the rounding changed no bit"
    # a split rounds its P under its own running max: agreement with the unsplit launch at P's rounding
    split = _run(cp, pr, t, variant="wg", precision=precision, split_keys=512)
    assert _err(split, pr["ref"]) <= tol, "key splits against the reference"
    assert _err(split, got) <= tol, "key splits against the unsplit launch"


WS_OPTIONS = ((False, False), (False, True), (True, False), (True, True))


@pytest.mark.gpu
@pytest.mark.parametrize("options", WS_OPTIONS, ids=lambda o: f"ov{int(o[0])}-pp{int(o[1])}")
@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("case", WG_CASES, ids=lambda c: f"hq{c[0]}-hkv{c[1]}-p{c[3]}-n{sum(c[5])}")
def test_prefill_ws_is_the_wg_kernel(t: str, case: tuple, options: tuple[bool, bool]) -> None:
    """The warp-specialized kernel (variant "ws", each of its overlap / ping-pong options) is bitwise the "wg"
    kernel at precision "bf16" (the same products in the same order per accumulator; only the staging and the issue
    order change), unsplit and with key splits, over several packed sequences; NaN in every cache slot past a
    sequence's end is never read."""
    cp = pytest.importorskip("cupy")
    _need_wg()
    import ninfer.cuda.attention_prefill as ap

    pr = _problem(np.random.default_rng([CASES.index(case), t == "bf16", 13]), case, t)
    keep = ap.WS_OPTIONS
    ap.WS_OPTIONS = options
    try:
        for sk in (0, 512):
            want = _run(cp, pr, t, variant="wg", precision="bf16", split_keys=sk)
            got = _run(cp, pr, t, variant="ws", precision="bf16", split_keys=sk)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
                f"split_keys={sk}: ws differs from wg, max |diff| {np.max(np.abs(got - want)):.3e}"
            )
    finally:
        ap.WS_OPTIONS = keep


@pytest.mark.gpu
@pytest.mark.parametrize("options", WS_OPTIONS, ids=lambda o: f"ov{int(o[0])}-pp{int(o[1])}")
def test_prefill_ws_long_prompt_and_chunks(options: tuple[bool, bool]) -> None:
    """The 27B's heads over 2,500 keys (40 tiles per segment: both consumer warpgroups' rings wrap many times), in
    one launch and as chunks continuing the prefix, bitwise "wg" at precision "bf16"."""
    cp = pytest.importorskip("cupy")
    _need_wg()
    import ninfer.cuda.attention_prefill as ap

    pr = _problem(np.random.default_rng(97), (24, 4, 256, 16, [0, 2300], [700, 200]), "float")
    keep = ap.WS_OPTIONS
    ap.WS_OPTIONS = options
    try:
        for rows in (None, np.arange(650, 900), np.arange(0, 37)):
            want = _run(cp, pr, "float", rows, variant="wg", precision="bf16")
            got = _run(cp, pr, "float", rows, variant="ws", precision="bf16")
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "ws differs from wg"
    finally:
        ap.WS_OPTIONS = keep


def test_precision_needs_the_wgmma_kernel() -> None:
    """A rounded precision is the wgmma kernel's: asked of another explicit variant, a clear error."""
    from ninfer.cuda._common import KernelError
    from ninfer.cuda.attention_prefill import attention_prefill

    z = np.zeros((1, 1, 64), dtype=F32)
    with pytest.raises(KernelError, match="precision"):
        attention_prefill(z, z, z, z, z, z, max_len=1, variant="gqa", precision="p-bf16")
    with pytest.raises(KernelError, match="precision"):
        attention_prefill(z, z, z, z, z, z, max_len=1, precision="fp8")
    with pytest.raises(KernelError, match="precision"):
        attention_prefill(z, z, z, z, z, z, max_len=1, variant="ws", precision="exact")


@pytest.mark.gpu
@pytest.mark.parametrize("t", ["float", "bf16"])
def test_prefill_rows_independent_of_batch(t: str) -> None:
    """A row's result is bitwise the same alone, in its chunk, or with the launch's rows in another order."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(31)
    pr = _problem(rng, (8, 2, 128, 16, [0, 40, 7], [70, 130, 3]), t)
    full = _run(cp, pr, t)
    perm = rng.permutation(full.shape[0])
    assert np.array_equal(_run(cp, pr, t, perm), full[perm]), "row order changed results"
    seq1 = np.arange(70, 200)
    assert np.array_equal(_run(cp, pr, t, seq1), full[seq1]), "sequence alone differs from the packed launch"
    assert np.array_equal(_run(cp, pr, t, seq1[-1:]), full[seq1[-1:]]), "single row differs"


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["gqa", "wg", "wg:p-bf16", "wg:bf16"])
@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("shape", [(24, 4, 256), (16, 2, 256)], ids=["27B", "35B-A3B"])
def test_prefill_rows_independent_of_chunking(t: str, shape: tuple, variant: str) -> None:
    """The models' head shapes: a prompt prefilled in one launch, in uneven chunks (each chunk a launch of its own
    rows, continuing the cached prefix), and packed with another sequence gives every row the same bits (at every
    precision of the wgmma kernel: ``variant:precision``)."""
    cp = pytest.importorskip("cupy")
    variant, _, prec = variant.partition(":")
    if variant == "wg":
        _need_wg()
    run = functools.partial(_run, precision=prec or "exact")
    rng = np.random.default_rng(77)
    pr = _problem(rng, (*shape, 16, [0, 0], [333, 50]), t)
    full = run(cp, pr, t, variant=variant)
    seq0 = np.arange(333)
    alone = run(cp, pr, t, seq0, variant=variant)
    assert np.array_equal(alone.view(np.uint32), full[seq0].view(np.uint32)), "packing with another sequence"
    for lo, hi in ((0, 1), (1, 37), (37, 200), (200, 333), (150, 151)):
        rows = np.arange(lo, hi)
        got = run(cp, pr, t, rows, variant=variant)
        assert np.array_equal(got.view(np.uint32), full[rows].view(np.uint32)), (
            f"chunk {lo}..{hi - 1} differs"
        )
    rev = seq0[::-1].copy()
    assert np.array_equal(run(cp, pr, t, rev, variant=variant).view(np.uint32), full[rev].view(np.uint32)), (
        "reversed rows"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["gqa", "wg"])
@pytest.mark.parametrize("t", ["float", "bf16"])
@pytest.mark.parametrize("shape", [(24, 4, 256), (16, 2, 256)], ids=["27B", "35B-A3B"])
def test_prefill_key_splits(t: str, shape: tuple, variant: str) -> None:
    """A follow-up turn's launch (few rows over a long prefix) takes key splits by default; merged, they agree with
    the unsplit kernel within fp32 rounding and with the reference; rows whose keys are all in the first split keep
    the unsplit bits; explicit splits of 512 and 1024 keys likewise."""
    cp = pytest.importorskip("cupy")
    from ninfer.cuda.attention_prefill import key_splits

    if variant == "wg":
        _need_wg()
    rng = np.random.default_rng(83)
    pr = _problem(rng, (*shape, 16, [0, 2500], [40, 64]), t)
    rows = pr["q"].shape[0]
    sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])
    auto = key_splits(rows, shape[0], shape[1], shape[2], pr["max_len"], sms)
    assert auto > 0, "a 104-row launch over 2.5K keys should split"
    full = _run(cp, pr, t, variant=variant)
    one_split = pr["row_pos"] < 512
    for sk in (None, 512, 1024):
        got = _run(cp, pr, t, split_keys=sk, variant=variant)
        assert _err(got, pr["ref"]) <= TOL[t], f"split_keys={sk}: against the reference"
        assert _err(got, full) <= (2e-6 if t == "float" else TOL[t]), f"split_keys={sk}: against the unsplit"
        if sk is not None:
            assert np.array_equal(got[one_split].view(np.uint32), full[one_split].view(np.uint32)), (
                f"split_keys={sk}: rows in the first split changed bits"
            )
    with pytest.raises(Exception, match="split_keys"):
        _run(cp, pr, t, split_keys=100, variant=variant)


@pytest.mark.gpu
def test_prefill_rejects_bad_arguments() -> None:
    cp = pytest.importorskip("cupy")
    from ninfer.cuda.attention_prefill import KernelError, attention_prefill

    q = cp.zeros((4, 8, 64), dtype=F32)
    kc = cp.zeros((2, 16, 2, 64), dtype=np.uint16)
    ids = cp.zeros(4, dtype=np.int32)
    table = cp.zeros((1, 2), dtype=np.int32)
    with pytest.raises(KernelError, match="k_cache"):
        attention_prefill(q, kc.astype(F32), kc.astype(F32), table, ids, ids, max_len=4)
    with pytest.raises(KernelError, match="head_dim"):
        attention_prefill(cp.zeros((4, 8, 48), dtype=F32), kc, kc, table, ids, ids, max_len=4)
    with pytest.raises(KernelError, match="max_len"):
        attention_prefill(q, kc, kc, table, ids, ids, max_len=33)
    with pytest.raises(KernelError, match="KV heads"):
        attention_prefill(cp.zeros((4, 3, 64), dtype=F32), kc, kc, table, ids, ids, max_len=4)
    with pytest.raises(KernelError, match="variant"):
        attention_prefill(q, kc, kc, table, ids, ids, max_len=4, variant="fast")


# ---- CPU: the kernel's tiling loop mirrored in NumPy ----------------------------------------------------------
def _mirror(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pr: dict[str, Any]) -> tuple[np.ndarray, set]:
    """The kernel's loops over blocks (64 rows), segments (maximal runs of one sequence), KV tiles (BN keys from
    0 to the segment's last position) and warps (16 rows; skip a tile past all their positions), with its masks
    and online softmax in float64. Returns the output and the (sequence, position) pairs read from the cache."""
    r_all, hq, d = q.shape
    hkv, page = kc.shape[2], kc.shape[1]
    bn, g = block_keys(d), hq // hkv
    seq, pos, table = pr["row_seq"], pr["row_pos"], pr["table"]
    out, read = np.full(q.shape, np.nan), set()
    for r0 in range(0, r_all, BLOCK_ROWS):
        nrows = min(BLOCK_ROWS, r_all - r0)
        s0 = 0
        while s0 < nrows:
            b, s1 = seq[r0 + s0], s0 + 1
            while s1 < nrows and seq[r0 + s1] == b:
                s1 += 1
            kend = int(pos[r0 + s0 : r0 + s1].max())
            lim = np.array([pos[r0 + i] if s0 <= i < s1 else -1 for i in range(BLOCK_ROWS)])
            m = np.full((BLOCK_ROWS, hq), -np.inf)
            l, acc = np.zeros((BLOCK_ROWS, hq)), np.zeros((BLOCK_ROWS, hq, d))
            qb = np.zeros((BLOCK_ROWS, hq, d))
            qb[:nrows] = q[r0 : r0 + nrows]
            for k0 in range(0, kend + 1, bn):
                keys = np.arange(k0, k0 + bn)
                ok = keys <= kend  # staged from the cache; the rest zero-filled
                kt, vt = np.zeros((bn, hkv, d)), np.zeros((bn, hkv, d))
                slot = table[b, keys[ok] // page] * page + keys[ok] % page
                kt[ok], vt[ok] = kc.reshape(-1, hkv, d)[slot], vc.reshape(-1, hkv, d)[slot]
                read.update((int(b), int(k)) for k in keys[ok])
                for w in range(BLOCK_ROWS // 16):
                    rows = slice(16 * w, 16 * w + 16)
                    if k0 > lim[rows].max():
                        continue
                    s = np.einsum("rhgd,khd->rhgk", qb[rows].reshape(16, hkv, g, d), kt).reshape(16, hq, bn)
                    s = np.where(keys[None, None, :] <= lim[rows, None, None], s / np.sqrt(d), -np.inf)
                    mn = np.maximum(m[rows], s.max(-1))
                    base = np.where(mn == -np.inf, 0.0, mn)
                    corr, p = np.exp(m[rows] - base), np.exp(s - base[..., None])
                    m[rows], l[rows] = mn, l[rows] * corr + p.sum(-1)
                    pv = np.einsum("rhgk,khd->rhgd", p.reshape(16, hkv, g, bn), vt).reshape(16, hq, d)
                    acc[rows] = acc[rows] * corr[..., None] + pv
            seg = np.arange(s0, s1)
            out[r0 + seg] = acc[seg] / l[seg][..., None]
            s0 = s1
    return out, read


@pytest.mark.parametrize("order", ["packed", "shuffled"])
def test_tiling_mirror_matches_reference(order: str) -> None:
    rng = np.random.default_rng(5)
    for case in ((4, 2, 64, 16, [0, 30, 100], [70, 9, 65]), (2, 1, 256, 64, [3, 0], [40, 1]), CASES[1]):
        pr = _problem(rng, case, "float")
        rows = np.arange(pr["q"].shape[0])
        if order == "shuffled":
            rows = rng.permutation(rows)
        sub = dict(pr, row_seq=pr["row_seq"][rows], row_pos=pr["row_pos"][rows])
        kc, vc = bf16_decode(pr["kc"]).astype(np.float64), bf16_decode(pr["vc"]).astype(np.float64)
        got, read = _mirror(pr["q"][rows].astype(np.float64), kc, vc, sub)
        assert _err(got, pr["ref"][rows]) < 1e-5
        lens = {b: int(pr["row_pos"][pr["row_seq"] == b].max()) + 1 for b in set(pr["row_seq"].tolist())}
        assert all(k < lens[b] for b, k in read), "a key past the sequence's last position was read"
