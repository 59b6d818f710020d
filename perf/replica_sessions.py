"""Concurrent agent sessions over HTTP (perf/bench_replicas.py ``sessions``) and their summary.

A session: a system prompt every session shares (an agent's instructions and tools), the session's own task, then
per turn the model's answer (sent back with its reasoning: the server runs with ``--preserve-thinking``, so the
next prompt extends the previous one) and a tool result. Every request streams greedy tokens with ignore_eos, so
each turn generates exactly ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from typing import Any

import httpx

__all__ = ["run_sessions", "session_summary"]

SYSTEM = (
    "You are a coding agent working in a repository. Use the tools to read files, run commands and edit code; "
    "explain each step briefly. Tools: read_file(path), run(command), edit(path, old, new), search(query). "
) * 8


def tool_result(session: int, turn: int, chars: int) -> str:
    line = f"[session {session} turn {turn}] output line: value={session * 131 + turn * 17} status=ok; "
    return (line * (chars // len(line) + 1))[:chars]


async def _turn(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    t0, ttft = time.perf_counter(), None
    text: dict[str, list[str]] = {"content": [], "reasoning_content": []}
    usage: dict[str, Any] = {}
    async with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=1800) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "error": (await r.aread()).decode()[:300]}
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                for k, parts in text.items():
                    if ch["delta"].get(k):
                        ttft = ttft if ttft is not None else time.perf_counter() - t0
                        parts.append(ch["delta"][k])
    return {
        "status": 200,
        "ttft_s": ttft,
        "latency_s": time.perf_counter() - t0,
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "content": "".join(text["content"]),
        "reasoning": "".join(text["reasoning_content"]),
    }


async def _session(
    client: httpx.AsyncClient, url: str, model: str, s: int, turns: int, max_tokens: int, tool_chars: int
) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {s}: fix the failing test number {s} in module m{s}.py."},
    ]
    rows = []
    for t in range(turns):
        body = {"model": model, "messages": msgs, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        row = await _turn(client, url, body)
        rows.append(
            {"session": s, "turn": t, **{k: v for k, v in row.items() if k not in ("content", "reasoning")}}
        )
        if row["status"] != 200:
            break
        msgs += [
            {"role": "assistant", "content": row["content"], "reasoning_content": row["reasoning"]},
            {"role": "user", "content": tool_result(s, t, tool_chars)},
        ]
    return rows


async def run_sessions(
    url: str, model: str, sessions: int, turns: int, max_tokens: int, tool_chars: int
) -> list[dict[str, Any]]:
    """Every turn of ``sessions`` concurrent sessions, as rows."""
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=sessions + 4)) as client:
        got = await asyncio.gather(
            *(_session(client, url, model, s, turns, max_tokens, tool_chars) for s in range(sessions))
        )
    return [row for rows in got for row in rows]


def _counter(metrics: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", metrics, re.M)
    return float(m.group(1)) if m else 0.0


def session_summary(rows: list[dict[str, Any]], wall_s: float, metrics: str) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == 200]
    first = [r["ttft_s"] for r in ok if r["turn"] == 0 and r["ttft_s"] is not None]
    follow = [r for r in ok if r["turn"] > 0]
    prev = {(r["session"], r["turn"]): r["prompt_tokens"] for r in ok}
    reused = [r for r in follow if r["cached_tokens"] >= prev.get((r["session"], r["turn"] - 1), 1 << 60)]
    fu_ttft = sorted(r["ttft_s"] for r in follow if r["ttft_s"] is not None)
    hits = _counter(metrics, "ninfer_router_affinity_hits_total")
    return {
        "requests": len(rows),
        "failed": len(rows) - len(ok),
        "wall_s": round(wall_s, 3),
        "decode_tok_s": sum(r["completion_tokens"] for r in ok) / wall_s,
        "prompt_tokens": sum(r["prompt_tokens"] for r in ok),
        "cached_tokens": sum(r["cached_tokens"] for r in ok),
        "ttft_first_s": statistics.median(first) if first else 0.0,
        "ttft_followup_s": statistics.median(fu_ttft) if fu_ttft else 0.0,
        "ttft_followup_p90_s": fu_ttft[int(0.9 * (len(fu_ttft) - 1))] if fu_ttft else 0.0,
        "followups": len(follow),
        "followup_reuse_rate": len(reused) / len(follow) if follow else 0.0,
        "router_affinity_hits": hits,
        "router_hit_rate": hits / len(follow) if follow else 0.0,
        "router_least_loaded": _counter(metrics, "ninfer_router_least_loaded_total"),
        "rows": rows,
    }
