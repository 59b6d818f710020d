"""The evaluation subcommands of the ``ninfer`` CLI: ``perplexity`` and ``bench-corpus``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec

from ninfer.cli_args import add_backend_argument

__all__ = ["register"]


def _cmd_perplexity(a: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ninfer.model import load

    from .perplexity import perplexity

    with open(a.text, encoding="utf-8") as f:
        text = f.read()
    model = load(a.artifact, backend=a.backend)
    if model.tokenizer is None:
        raise ValueError("this artifact has no tokenizer: perplexity needs one to read --text")
    ids = model.tokenizer.encode(text)
    context = a.context if a.context is not None else min(len(ids), 4096)
    stride = a.stride if a.stride is not None else max(1, context // 2)
    bar = tqdm(total=max(len(ids) - 1, 0), desc="perplexity", unit="tok", disable=a.quiet, file=sys.stderr)
    try:
        res = perplexity(model, ids, context=context, stride=stride, prefill_chunk=a.prefill_chunk,
                         progress=bar.update)  # fmt: skip
    finally:
        bar.close()
    out: dict[str, Any] = {"artifact": a.artifact, "model_id": model.model_id, "backend": a.backend,
                           "text": a.text, "prefill_chunk": a.prefill_chunk, **msgspec.structs.asdict(res)}  # fmt: skip
    print(json.dumps(out, indent=None if a.compact else 2))
    return 0


def _cmd_bench_corpus(a: argparse.Namespace) -> int:
    from .runner import RunOptions, run_corpus

    opts = RunOptions(
        url=a.url.rstrip("/"),
        fixtures=a.fixtures,
        out=a.out,
        request_log=a.request_log,
        concurrency=a.concurrency,
        repeat=a.repeat,
        seed=a.seed,
        api_key=a.api_key,
        timeout_s=a.timeout,
    )
    report = run_corpus(opts, log=None if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True)))
    print(report.markdown)
    return 0 if report.ok else 1


def register(sub: Any) -> None:
    """Add ``perplexity`` and ``bench-corpus`` to the ``ninfer`` subcommands."""
    p = sub.add_parser("perplexity", help="token-level NLL and perplexity of a text (sliding window)")
    p.add_argument("artifact", help="the .ninfer artifact (or upstream v1 file) to evaluate")
    p.add_argument("--text", required=True, help="UTF-8 text file, tokenized as is (no chat template)")
    p.add_argument("--context", type=int, default=None, help="window length in tokens (default min(T, 4096))")
    p.add_argument("--stride", type=int, default=None, help="window step in tokens (default context/2)")
    p.add_argument("--prefill-chunk", type=int, default=512, help="tokens per prefill call (default 512)")
    add_backend_argument(p)
    p.add_argument("--compact", action="store_true", help="one-line JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_perplexity)

    b = sub.add_parser("bench-corpus", help="replay request fixtures against a live server and report")
    b.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8010")
    b.add_argument("--fixtures", required=True, help="fixture directory (see docs/evaluation.md)")
    b.add_argument("--out", default="perf/results/corpus", help="directory for report.json/.md and PNGs")
    b.add_argument("--request-log", default=None, help="the server's --request-log-jsonl file to join")
    b.add_argument("--concurrency", type=int, default=1, help="sessions replayed at once (default 1)")
    b.add_argument("--repeat", type=int, default=1, help="replay the whole corpus R times (default 1)")
    b.add_argument("--seed", type=int, default=None, help="seed for chat requests without one (+ repeat)")
    b.add_argument("--api-key", default=None, help="bearer key for a server started with keys")
    b.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    b.set_defaults(func=_cmd_bench_corpus)
