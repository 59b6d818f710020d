"""Small engine measurement on the demo model: prefix reuse over a 6-turn session, and steps/s.

    python -m ninfer.perf.bench_engine [--artifact PATH]

Builds the demo artifact in a temporary directory unless one is given. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

import numpy as np

from ninfer.engine import Engine

_USER = "<|im_end|>\n<|im_start|>user\nAnd then, question {k}?<|im_end|>\n<|im_start|>assistant\n<think>\n"


def session(model: Any, reuse: bool, turns: int = 6, max_tokens: int = 32) -> dict[str, Any]:
    """Token-level agent session: each turn appends the previous output and a user message."""
    enc = model.tokenizer.encode
    ctx = enc(
        "<|im_start|>system\n" + "You are a careful assistant. " * 40 + "<|im_end|>\n<|im_start|>user\n"
        "Hello<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    rows, t0 = [], time.perf_counter()
    with Engine.from_model(
        model,
        max_context=4096,
        kv_capacity=16384,
        prefill_chunk=256,
        checkpoint_stride=256,
        prefix_reuse=reuse,
    ) as eng:
        for k in range(turns):
            c = eng.submit(ctx, max_tokens=max_tokens, ignore_eos=True).result()
            rows.append(
                {
                    "prompt": c.usage.prompt_tokens,
                    "cached": c.usage.cached_tokens,
                    "ttft_ms": round(1e3 * c.metrics.ttft_s, 1),
                }
            )
            ctx = ctx + c.token_ids + enc(_USER.format(k=k))
        st = eng.stats()
    return {
        "turns": rows,
        "wall_s": round(time.perf_counter() - t0, 3),
        "prefill_tokens": st.prefill_tokens,
        "prefix_hit_tokens": st.prefix_hit_tokens,
        "checkpoints": st.checkpoints,
        "checkpoint_bytes": st.checkpoint_bytes,
    }


def throughput(model: Any, lanes: int, n: int = 8, max_tokens: int = 64) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 1000, 64).tolist() for _ in range(n)]
    with Engine.from_model(
        model, max_concurrency=lanes, queue_depth=n, max_context=1024, kv_capacity=16384, prefix_reuse=False
    ) as eng:
        t0 = time.perf_counter()
        for h in [eng.submit(p, max_tokens=max_tokens, ignore_eos=True) for p in prompts]:
            h.result()
        dt = time.perf_counter() - t0
        st = eng.stats()
    return {
        "lanes": lanes,
        "steps_per_s": round(st.steps / dt, 1),
        "tokens_per_s": round(st.decode_tokens / dt, 1),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", help="a .ninfer artifact (default: build the demo)")
    args = ap.parse_args(argv)
    from ninfer.model import load

    with tempfile.TemporaryDirectory() as tmp:
        path = args.artifact
        if path is None:
            from ninfer.demo import build_demo

            path = build_demo(f"{tmp}/demo.ninfer")
        model = load(path)
        out = {
            "session_reuse": session(model, True),
            "session_no_reuse": session(model, False),
            "throughput": [throughput(model, lanes) for lanes in (1, 4)],
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
