"""Grammar overhead at 8 lanes: the same greedy requests with and without a JSON-schema mask, in one run.

    python -m ninfer.perf.bench_grammar [ARTIFACT] [--lanes 8] [--tokens 256] [--rounds 3]

Reports tokens/s both ways, the mask time per token (the hook's own time, measured inside it) and the step time,
so the mask's cost can be read against the step it overlaps (the engine computes masks on a worker thread while
the model step runs).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "tags", "score", "ok"],
    "additionalProperties": False,
}


class _Timed:
    """Wraps a mask hook and accumulates the time spent in it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def __call__(self, generated: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.inner(generated)
        finally:
            self.seconds += time.perf_counter() - t
            self.calls += 1


def _round(eng: Any, prompts: list[list[int]], tokens: int, make_mask: Any) -> tuple[float, float, int]:
    hooks = [make_mask() for _ in prompts]
    t0 = time.perf_counter()
    handles = [
        eng.submit(p, max_tokens=tokens, temperature=0.0, ignore_eos=True, token_mask=h)
        for p, h in zip(prompts, hooks, strict=True)
    ]
    n = sum(len(h.result().token_ids) for h in handles)
    dt = time.perf_counter() - t0
    mask_s = sum(h.seconds for h in hooks if h is not None)
    return n / dt, mask_s, n


def main(argv: list[str] | None = None) -> int:
    from ninfer.demo import build_demo
    from ninfer.engine import Engine
    from ninfer.frontend.grammar import GrammarCompiler, RequestGrammar
    from ninfer.model import load

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifact", nargs="?")
    ap.add_argument("--lanes", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    path = a.artifact or build_demo(tempfile.mkdtemp() + "/demo.ninfer")
    model = load(path)
    tok = model.tokenizer
    compiler = GrammarCompiler(tok.hf, model.config.vocab_size, tok.eos_token_ids)
    compiled = compiler.json_schema(SCHEMA)

    def masked() -> _Timed:
        return _Timed(
            RequestGrammar(compiled, vocab_size=model.config.vocab_size, thinking=False, think_end_id=None)
        )

    prompts = [tok.encode(f"Describe item {i} as JSON.") for i in range(a.lanes)]
    eng = Engine.from_model(
        model,
        max_concurrency=a.lanes,
        queue_depth=a.lanes,
        max_context=a.tokens + 64,
        kv_capacity=a.lanes * (a.tokens + 64) * 2,
        prefix_reuse=False,
    )
    free, constrained, mask_per_tok = [], [], []
    try:
        for _ in range(a.rounds):
            free.append(_round(eng, prompts, a.tokens, lambda: None)[0])
            tps, mask_s, n = _round(eng, prompts, a.tokens, masked)
            constrained.append(tps)
            mask_per_tok.append(mask_s / n)
    finally:
        eng.close()
    f, c, m = statistics.median(free), statistics.median(constrained), statistics.median(mask_per_tok)
    step = a.lanes / f
    print(
        f"lanes {a.lanes}, {a.tokens} tokens each, vocabulary {model.config.vocab_size}, median of {a.rounds}"
    )
    print(f"unconstrained {f:8.1f} tok/s   (step {step * 1e3:.2f} ms)")
    print(f"json schema   {c:8.1f} tok/s   ({(1 - c / f) * 100:+.1f}% cost)")
    print(f"mask time     {m * 1e6:8.1f} us per token ({m * a.lanes / step * 100:.1f}% of a step's time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
