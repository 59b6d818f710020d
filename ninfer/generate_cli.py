"""``ninfer generate``: one prompt through a one-lane engine in this process, with the server's runner, sampler
and sampling defaults, so a seeded run gives the server's tokens."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ninfer.cli_args import add_backend_argument

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``generate`` subcommand to the ``ninfer`` CLI."""
    g = sub.add_parser("generate", help="generate from an artifact")
    g.add_argument("artifact", help="the .ninfer artifact (or upstream v1 file) to load")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prompt", metavar="TEXT", help="a user message (rendered with the chat template unless --raw)"
    )
    src.add_argument(
        "--messages", metavar="FILE", help='JSON file with a list of chat messages ([{"role": "user", ...}])'
    )
    src.add_argument("--prompt-ids", metavar="IDS", help="comma-separated token ids (1,2,3)")
    g.add_argument("--raw", action="store_true", help="tokenize --prompt as is, without the chat template")
    g.add_argument(
        "--max-new", type=int, default=64, metavar="N", help="most tokens to generate (default 64)"
    )
    g.add_argument("--greedy", action="store_true", help="argmax decoding (default: sample)")
    g.add_argument("--temperature", type=float, default=None, help="default: the artifact's, else 1")
    g.add_argument("--top-p", type=float, default=None, help="default: the artifact's, else 1 (no cut)")
    g.add_argument("--top-k", type=int, default=None, help="default: the artifact's, else 0 (no cut)")
    g.add_argument(
        "--seed", type=int, default=None, help="sampling seed (the server's seed gives its tokens)"
    )
    add_backend_argument(g)
    g.add_argument("--json", action="store_true", help="one JSON object: prompt_tokens, token_ids, text, ...")
    g.set_defaults(func=_cmd_generate)


def _prompt_ids(a: argparse.Namespace, model: Any) -> list[int]:
    if a.prompt_ids is not None:
        parts = [x.strip() for x in a.prompt_ids.split(",") if x.strip()]
        bad = next((x for x in parts if not x.lstrip("-").isdigit()), None)
        if bad is not None:
            raise ValueError(f"--prompt-ids: {bad!r} is not an integer token id (expected e.g. 1,2,3)")
        return [int(x) for x in parts]
    if model.tokenizer is None:
        raise ValueError("this artifact has no tokenizer: use --prompt-ids")
    if a.messages is not None:
        try:
            with open(a.messages, encoding="utf-8") as f:
                messages = json.load(f)
        except OSError as e:
            raise ValueError(f"--messages {a.messages}: cannot read: {e.strerror}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"--messages {a.messages}: not a UTF-8 JSON file: {e}") from None
    elif a.raw:
        return model.tokenizer.encode(a.prompt)
    else:
        messages = [{"role": "user", "content": a.prompt}]
    if model.chat_template is None:
        raise ValueError("this artifact has no chat template: use --raw or --prompt-ids")
    return model.chat_template.render_ids(messages, add_generation_prompt=True)


def _cmd_generate(a: argparse.Namespace) -> int:
    from ninfer.model import load

    model = load(a.artifact, backend=a.backend)
    ids = _prompt_ids(a, model)
    t0 = time.perf_counter()
    # the server's engine, runner and sampler, and its defaults for what is left out (the artifact's generation
    # defaults, each setting on its own): a seeded run gives the server's tokens for a request with the same
    # settings. --greedy is the server's temperature 0: the artifact's penalties still apply, as they do there
    sampling = model.sampling_defaults
    if a.greedy:
        sampling.pop("temperature", None)
    given = {"temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k}
    sampling.update({k: v for k, v in given.items() if v is not None})
    c = model.complete(ids, a.max_new, greedy=a.greedy, seed=a.seed, **sampling)
    dt = time.perf_counter() - t0
    out = list(c.token_ids)
    text = model.tokenizer.decode(out, skip_special_tokens=True) if model.tokenizer else None
    result = dict(
        prompt_tokens=len(ids),
        token_ids=out,
        text=text,
        finish_reason="stop" if c.finish_reason == "stop_token" else "length",
        seconds=round(dt, 4),
    )
    if a.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        print(text if text is not None else ",".join(map(str, out)))
        print(
            f"[{len(ids)} prompt tokens, {len(out)} generated in {dt:.2f}s, finish: {result['finish_reason']}]"
        )
    return 0
