"""What rounding the prefill GEMMs' float32 inputs would cost, measured on the NumPy reference (no GPU).

    python -m perf.fidelity_prefill --out perf/results

Today a prefill GEMM multiplies float32 activations as a bf16 hi + lo pair (two MMAs per product, error <= 2^-17 of
each input): exact up to fp32 summation order, and the reason prefill runs at half the tensor rate. One MMA needs
one 16-bit operand per input; candidates, each applied to every linear's input in the prompt's forward (more than 8
rows: the GEMM path; decode rows and the LM head row stay exact, as the GEMVs keep them):

  ``bf16``       round to bf16 (8 significant bits, error <= 2^-9);
  ``fp16-row``   scale each row by the power of two that brings its largest |value| into [2^14, 2^15), round to
                 fp16 (11 significant bits for every value above 2^-14 of the row's largest), scale back
                 (``ninfer.reference.ops.round_fp16_rows``, the CUDA fp16 mode's NumPy twin): the weights of the
                 folded formats (NVFP4: e2m1 x e4m3 x 2^-7, FP8 e4m3) are exact in fp16 too.

On the mid-size random models of tests/test_cuda_model.py (dense and MoE, NVFP4 weights, 300-token prompt then 20
teacher-forced decode steps), each candidate is compared with the exact reference: teacher-forced top-1 agreement
and mean KL(exact || candidate) over the 320 positions. Random tiny models have flat, near-tied logits (and, in the
MoE, near-tied router scores), so these are pessimistic for a trained model; they rank the candidates.

The prompt's attention (more than 8 query rows: the prefill kernel; decode keeps the exact kernel) has candidates
too, joined to a GEMM rounding by ``+`` (``--roundings fp16-row+p-bf16``): the prefill kernel multiplies its fp32
probabilities and (float32) q by the bf16 K / V cache as bf16 hi + lo pairs, two MMAs per product;

  ``p-bf16``     the probabilities P = e^(s - max) rounded to bf16 before P V (one MMA), the softmax sum from the
                 unrounded P (as flash-attention does);
  ``qp-bf16``    q rounded to bf16 too (one MMA for Q K^T as well).

The chunked GDN prefill has one, joined the same way (``--roundings fp16-row+p-bf16+gdn-bf16``): its prep stores
the state pass's inputs (normed q and k, W, A) in a float32 scratch that the state pass re-reads once per value
column block (docs/cuda.md, "What bounds the chunked GDN"); a bf16 scratch would halve those reads and let the state
pass's W S, Q S, A V' and K^T V' run as bf16 MMAs (S and V' split hi + lo) instead of 3xTF32:

  ``gdn-bf16``   q, k, W and A rounded to bf16 as the state pass reads them (``ops_gdn.gdn_chunked``'s ``scratch``);
                 U, the gates and the state stay float32.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ninfer.evaluate.perplexity import mean_kl

__all__ = ["ROUNDINGS", "ATTN_ROUNDINGS", "GDN_ROUNDINGS", "main"]

F32 = np.float32


def _bf16(x: np.ndarray) -> np.ndarray:
    from ninfer.formats import bf16_round

    return bf16_round(np.asarray(x, F32))


def _fp16_row(x: np.ndarray) -> np.ndarray:
    from ninfer.reference.ops import round_fp16_rows

    return round_fp16_rows(x)


ROUNDINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "bf16": _bf16,
    "fp16-row": _fp16_row,
    "exact": lambda x: x,  # GEMM inputs kept (to isolate an attention candidate: exact+p-bf16)
}
# attention candidates: (round q, round P)
ATTN_ROUNDINGS: dict[str, tuple[bool, bool]] = {"p-bf16": (False, True), "qp-bf16": (True, True)}
# chunked GDN candidates: the rounding of its state pass's scratch inputs
GDN_ROUNDINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"gdn-bf16": _bf16}


def _attention_rounded(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, start: int, *, rq: bool, rp: bool
) -> np.ndarray:
    """ops.attention with q and / or the unnormalised probabilities rounded to bf16 (the sum from the unrounded).
    The probabilities are e^(s - m) with m the row's largest score over its causal keys, as the kernel and
    ops.attention take it (the normalisation cancels m, but not its bf16 rounding of P). Figures recorded before
    this was fixed took m over all keys, future ones included: with large scores a row's probabilities could all
    underflow to 0 there (0/0)."""
    from ninfer.reference import ops

    t, hq, _ = q.shape
    scores, future = ops.attention_scores(_bf16(q) if rq else q, k, start)
    masked = np.where(future, -np.inf, scores)
    p = np.exp(masked - masked.max(axis=-1, keepdims=True)).astype(F32)
    total = p.sum(axis=-1, keepdims=True)  # [Hkv, G, T, 1]
    pv = ops.attention_values(_bf16(p) if rp else p, v)
    return (pv / total.transpose(2, 0, 1, 3).reshape(t, hq, 1)).astype(F32)


@contextlib.contextmanager
def _rounded(name: str) -> Iterator[None]:
    """Candidate ``name`` (a GEMM rounding, then optionally ``+`` an attention and / or a GDN rounding) applied to
    the reference."""
    from ninfer.reference import ops

    gemm, *rest = name.split("+")
    unknown = [r for r in rest if r not in ATTN_ROUNDINGS and r not in GDN_ROUNDINGS]
    if gemm not in ROUNDINGS or unknown:
        raise ValueError(f"unknown rounding in {name!r}")
    attention, chunked = ops.attention, ops.gdn_chunked
    for r in rest:
        if r in ATTN_ROUNDINGS:
            rq, rp = ATTN_ROUNDINGS[r]
            ops.attention = lambda q, k, v, start, rq=rq, rp=rp: (
                _attention_rounded(q, k, v, start, rq=rq, rp=rp)
                if q.shape[0] > 8
                else attention(q, k, v, start)
            )
        else:  # the reference runs every multi-token GDN call chunked (decode steps: gdn_recurrent)
            ops.gdn_chunked = functools.partial(chunked, scratch=GDN_ROUNDINGS[r])
    try:
        with _rounded_gemm_inputs(ROUNDINGS[gemm]):
            yield
    finally:
        ops.attention, ops.gdn_chunked = attention, chunked


@contextlib.contextmanager
def _rounded_gemm_inputs(fn: Callable[[np.ndarray], np.ndarray]) -> Iterator[None]:
    """Every ``ops.linear`` of more than 8 rows rounds its input with ``fn``; the LM head stays exact."""
    from ninfer.reference import ops

    linear, lm_head = ops.linear, ops.lm_head

    def rounded(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        rows = int(np.prod(x.shape[:-1]))
        return linear(fn(x) if rows > 8 else x, w)

    ops.linear = rounded
    ops.lm_head = lambda h, w: linear(h, w)
    try:
        yield
    finally:
        ops.linear, ops.lm_head = linear, lm_head


def _logits(ref: Any, ids: np.ndarray, prompt: int) -> np.ndarray:
    st = ref.new_state()
    out = [ref.lm_head(ref.forward(ids[:prompt], st))]
    out += [ref.lm_head(ref.forward(ids[i : i + 1], st)) for i in range(prompt, len(ids))]
    return np.concatenate(out).astype(np.float64)


def _mid(kind: str) -> tuple[Any, Any]:
    """The mid-size model of tests/test_cuda_model.py (its config and NVFP4-decoded weights, seed 7)."""
    from ninfer.cuda.upload import encode_weights
    from ninfer.demo import midsize_config, random_weights
    from ninfer.formats import FORMATS
    from ninfer.reference import DictWeights, Qwen36

    cfg = midsize_config(kind)
    enc = encode_weights(cfg, DictWeights(random_weights(cfg, seed=7)), "NVFP4G16_E4M3S")
    return cfg, Qwen36(cfg, DictWeights({n: FORMATS[f].decode(b, s) for n, (f, s, b) in enc.items()}))


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(prog="python -m perf.fidelity_prefill")
    p.add_argument("--kinds", default="dense,moe")
    p.add_argument("--roundings", default="bf16,fp16-row")
    p.add_argument("--prompt", type=int, default=300)
    p.add_argument("--decode", type=int, default=20)
    p.add_argument("--out", default=None, help="directory for fidelity_prefill.json")
    a = p.parse_args(argv)
    rows = []
    for kind in a.kinds.split(","):
        cfg, ref = _mid(kind)
        ids = np.random.default_rng(2).integers(0, cfg.vocab_size, a.prompt + a.decode)
        exact = _logits(ref, ids, a.prompt)
        for name in a.roundings.split(","):
            with _rounded(name):
                got = _logits(ref, ids, a.prompt)
            r = {"kind": kind, "rounding": name, "positions": len(ids),
                 "top1": float(np.mean(got.argmax(-1) == exact.argmax(-1))), "kl": mean_kl(exact, got),
                 "max_err": float(np.max(np.abs(got - exact)) / np.max(np.abs(exact)))}  # fmt: skip
            rows.append(r)
            print(
                f"{kind:5} {name:16} top-1 {r['top1']:.3f}  mean KL {r['kl']:.2e}  max err {r['max_err']:.2e}"
            )
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "fidelity_prefill.json").write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
