"""Greedy and seeded outputs of the engine, ``Model.generate`` and the actor on one artifact, as JSON.

    python -m ninfer.perf.check_outputs [ARTIFACT] [--backend reference|cuda] [-o out.json] [--compare before.json]

A refactor that must not change behaviour runs this before and after and compares: the engine's tokens, texts and
finish reasons for a fixed set of requests (greedy and seeded, every sampling knob, stop strings, batched and
solo, prefix reuse on a second turn), and what ``Model.generate`` gives for the same prompts.
Without ARTIFACT the demo artifact is built in a temporary directory. The script runs on older trees too (copy it
into one to record its outputs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

REQUESTS: list[dict[str, Any]] = [
    {"max_tokens": 24, "temperature": 0.0},
    {"max_tokens": 24, "temperature": 0.0, "ignore_eos": True},
    {"max_tokens": 24, "temperature": 0.8, "seed": 7},
    {"max_tokens": 24, "temperature": 1.0, "seed": 11, "top_k": 20},
    {"max_tokens": 24, "temperature": 0.7, "seed": 3, "top_p": 0.9, "min_p": 0.05},
    {"max_tokens": 24, "temperature": 1.2, "seed": 5, "presence_penalty": 0.5, "frequency_penalty": 0.3},
    {"max_tokens": 24, "temperature": 0.9, "seed": 9, "repetition_penalty": 1.3, "ignore_eos": True},
    {"max_tokens": 24, "temperature": 1.0, "seed": 13, "stop": ["e"]},
]
PROMPTS = ["Hello, ninfer", "tell me a story about a lighthouse", "1 2 3 4 5 6 7 8"]
ENGINE = {"max_concurrency": 4, "queue_depth": 32, "max_context": 512, "kv_capacity": 8192}


def engine_outputs(art: str, backend: str) -> dict[str, Any]:
    try:
        from ninfer.model import open_engine
    except ImportError:  # a tree from before ninfer.open_engine (to record the "before" side of a change)
        from ninfer.engine import Engine

        open_engine = Engine.open

    out: dict[str, Any] = {}
    with open_engine(art, backend=backend, **ENGINE) as eng:
        tok = eng.tokenizer
        prompts = [tok.encode(p) for p in PROMPTS]
        for mode in ("solo", "batched"):
            rows = []
            handles = []
            for p in prompts:
                for r in REQUESTS:
                    h = eng.submit(p, **r)
                    if mode == "solo":
                        rows.append(_row(h.result()))
                    else:
                        handles.append(h)
            rows += [_row(h.result()) for h in handles]
            out[mode] = rows
        # a second turn that resumes from the first turn's checkpoint
        first = eng.submit(prompts[1], max_tokens=16, temperature=0.0).result()
        again = eng.submit(prompts[1] + first.token_ids + prompts[0], max_tokens=16, temperature=0.0).result()
        out["second_turn"] = [_row(first), _row(again)]
    return out


def model_outputs(art: str, backend: str) -> dict[str, Any]:
    from ninfer.model import load

    m = load(art, backend=backend)
    prompts = [m.tokenizer.encode(p) for p in PROMPTS]
    return {
        "greedy": [m.generate(p, 24, greedy=True) for p in prompts],
        "seeded": [m.generate(p, 24, greedy=False, temperature=0.8, seed=7) for p in prompts],
    }


def _row(c: Any) -> dict[str, Any]:
    return {"token_ids": list(c.token_ids), "text": c.text, "finish_reason": c.finish_reason}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact", nargs="?")
    p.add_argument("--backend", default="reference", choices=["reference", "cuda"])
    p.add_argument("-o", "--output")
    p.add_argument("--compare", help="a JSON file written by an earlier run: report every difference")
    a = p.parse_args(argv)
    from ninfer.demo import build_demo

    art = a.artifact or build_demo(os.path.join(tempfile.mkdtemp(), "demo.ninfer"))
    res = {"engine": engine_outputs(art, a.backend), "model": model_outputs(art, a.backend)}
    text = _dump(res)
    if a.output:
        with open(a.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if a.compare:
        with open(a.compare, encoding="utf-8") as f:
            before = json.load(f)
        res = json.loads(_dump(res))
        diffs = [k for k in _paths(before) if _get(before, k) != _get(res, k)]
        for k in diffs:
            print(f"differs: {'/'.join(map(str, k))}")
        print(f"{len(diffs)} of {len(list(_paths(before)))} outputs differ")
        return 1 if diffs else 0
    return 0


def _dump(res: dict[str, Any]) -> str:
    """JSON with one output (a row or a token list) per line."""
    lines = ["{"]
    items = [(f"{top}/{k}", v) for top, sub in res.items() for k, v in sub.items()]
    for i, (key, rows) in enumerate(items):
        body = ",\n  ".join(json.dumps(r, ensure_ascii=False) for r in rows)
        lines.append(f' "{key}": [\n  {body}\n ]' + ("," if i < len(items) - 1 else ""))
    return "\n".join(lines + ["}"])


def _paths(d: Any, prefix: tuple[Any, ...] = ()) -> Any:
    if isinstance(d, dict) and "token_ids" not in d:
        for k, v in d.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(d, list) and d and isinstance(d[0], dict | list):
        for i, v in enumerate(d):
            yield from _paths(v, (*prefix, i))
    else:
        yield prefix


def _get(d: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        try:
            d = d[k]
        except (KeyError, IndexError, TypeError):
            return None
    return d


if __name__ == "__main__":
    sys.exit(main())
