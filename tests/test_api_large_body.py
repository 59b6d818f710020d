"""A large body does not stall the API's event loop: decoded in steps on a worker thread (api/bulk_json.py,
api/validation.py:prepare), it lets the loop run every few milliseconds; the in-steps decode gives what the
one-call decode gives, errors included (in-process app, a scripted engine backend)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import msgspec
import pytest
from ninfer.api.app import build_app
from ninfer.api.bulk_json import decode_in_steps
from ninfer.api.config import ServerConfig
from ninfer.api.gate import Drain
from ninfer.api.openai_chat import ChatLimits
from ninfer.api.openai_chat_models import ChatMessage, ChatRequest
from ninfer.api.service import Service
from test_api_robust import MODEL, Scripted

ONE = msgspec.json.Decoder(ChatRequest)
ITEMS = msgspec.json.Decoder(list[ChatMessage])


def _both(body: bytes) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for decode in (lambda: ONE.decode(body), lambda: decode_in_steps(body, ONE, "messages", ITEMS)):
        try:
            out.append(("ok", decode()))
        except msgspec.MsgspecError as e:
            out.append((type(e).__name__, str(e)))
    return out


def test_the_in_steps_decode_equals_the_one_call_decode() -> None:
    tricky = [{"role": "user", "content": 'x},{"a": ]' * (i % 3)} for i in range(3000)]
    tricky += [
        {"role": "user", "content": [{"type": "text", "text": "}, {"}, {"type": "text", "text": "b"}]}
    ] * 3000
    tricky += [{"role": "assistant", "content": "y" * 30000}] * 40  # windows past 256 KiB
    bad = [*tricky[:4000], {"role": 5}, *tricky[4000:]]
    last = json.dumps({"model": "m", "messages": tricky}).encode()
    bodies = [
        last,
        json.dumps({"messages": tricky, "model": "m", "stop": ["}"]}, indent=2).encode(),  # pretty, not last
        json.dumps({"model": '"messages": [', "metadata": {"messages": [{}]}, "messages": tricky}).encode(),
        last[:-1] + b', "messages": []}',  # the key twice: the last one counts
        json.dumps({"model": "m", "messages": bad}).encode(),
        json.dumps({"model": 7, "messages": tricky}).encode(),
        last[:-3],  # truncated
        last[: len(last) // 2] + b"@" + last[len(last) // 2 :],
    ]
    for body in bodies:
        one, steps = _both(body)
        assert one == steps
    assert _both(bodies[4])[1][1] == "Expected `str`, got `int` - at `$.messages[4000].role`"


async def _worst_loop_gap(app: Any, body: bytes) -> tuple[float, httpx.Response]:
    gaps: list[float] = []
    done = asyncio.Event()

    async def beat() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(beat())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        r = await c.post("/v1/chat/completions", content=body, timeout=60,
                         headers={"content-type": "application/json"})  # fmt: skip
    done.set()
    await task
    return max(gaps), r


@pytest.mark.slow
def test_a_huge_body_does_not_stall_the_event_loop() -> None:
    """1.5 million messages (50 MB): one msgspec call decoding it held the GIL ~0.25-0.35 s, the loop's longest
    pause with it (2-core CPU host); decoded in steps, what is left is freeing the request at its end (~0.17 s)."""
    cfg = ServerConfig(artifact="a.ninfer", max_request_mib=256)
    svc = Service(config=cfg, backend=Scripted(), limits=ChatLimits(MODEL, 1 << 30, 16), drain=Drain(0.2))
    one = {"role": "user", "content": ""}
    body = json.dumps({"model": MODEL, "max_tokens": 2, "messages": [one] * 1_500_000}).encode()
    worst, r = asyncio.run(_worst_loop_gap(build_app(svc, None), body))
    assert r.status_code == 200, r.text
    assert len(svc.backend.requests[0].messages) == 1_500_000
    assert worst < 0.25, f"the event loop stalled {worst:.3f} s"
