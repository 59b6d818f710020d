"""Which of the repository's files and threads one streamed chat request runs through, on the demo model.

    python -m ninfer.perf.request_path [--max-tokens 16] [--json]

The whole path runs in this process: the HTTP app (Litestar, through httpx's ASGI transport), the engine actor
called directly where Ray would carry its messages (the two process boundaries, API -> actor -> API, are counted
from the topology, not traced), the engine and the reference model. A profiler hook records every function of the
repository that runs between the request's start and its last byte, by file and by thread. Files are grouped into
the corridor (api, actors, engine, frontend, ninfer/model.py: what a request walks through) and the model
(reference, artifact, formats, flash_next, cuda: what computes it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

CORRIDOR = ("api", "actors", "ninfer/engine", "ninfer/frontend", "ninfer/model.py")


class _Trace:
    """Repository files run, per thread, while ``on`` (a profiler hook on every thread)."""

    def __init__(self, roots: dict[str, str]) -> None:
        self.roots = roots  # directory -> the repository-relative name it is shown under
        self.on = False
        self.files: dict[str, set[int]] = defaultdict(set)

    def _rel(self, path: str) -> str | None:
        for root, name in self.roots.items():
            if path.startswith(root):
                return name + path[len(root) :]
        return None

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if self.on and event == "call":
            rel = self._rel(frame.f_code.co_filename)
            if rel is not None:
                self.files[rel].add(threading.get_ident())

    def install(self) -> None:
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)


def _roots() -> dict[str, str]:
    import ninfer.actors
    import ninfer.api

    import ninfer

    out = {}
    for mod, name in ((ninfer, "ninfer"), (ninfer.api, "api"), (ninfer.actors, "actors")):
        out[str(Path(mod.__file__).parent) + os.sep] = name + "/"
    return out


class _Remote:
    """The actor called in this process with Ray's calling convention (``actor.method.remote(...)``): what the
    API's ``AsyncEngineClient`` calls, without Ray between (its two process boundaries are counted, not traced)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def __getattr__(self, name: str) -> Any:
        import inspect
        from types import SimpleNamespace

        fn = getattr(self.actor, name)
        if inspect.isasyncgenfunction(fn):

            async def items(*args: Any) -> Any:
                async for item in fn(*args):
                    yield asyncio.sleep(0, result=item)  # an ObjectRef: awaited for the item

            return SimpleNamespace(remote=items)
        return SimpleNamespace(
            remote=lambda *args: asyncio.ensure_future(fn(*args))
        )  # runs even if not awaited


def _backend(actor: Any) -> Any:
    from ninfer.actors.client import AsyncEngineClient

    return AsyncEngineClient(_Remote(actor))


def _actor(artifact: str) -> Any:
    from ninfer.actors.engine_actor import EngineActor
    from ninfer.actors.messages import ActorSpec

    settings = {"max_concurrency": 2, "queue_depth": 2, "max_context": 512, "kv_capacity": 4096}
    try:
        from ninfer.engine import EngineConfig

        return EngineActor(ActorSpec(artifact=artifact, backend="reference", engine=EngineConfig(**settings)))
    except TypeError:  # a tree whose ActorSpec takes the engine settings as a dict
        return EngineActor(ActorSpec(artifact=artifact, backend="reference", engine=settings))


def _app(actor: Any) -> Any:
    from ninfer.api.app import build_app
    from ninfer.api.config import ServerConfig
    from ninfer.api.openai_chat import ChatLimits
    from ninfer.api.service import Service

    limits = ChatLimits(model_id="ninfer-demo", max_context=512, default_max_tokens=64)
    svc = Service(config=ServerConfig(artifact="demo.ninfer"), backend=_backend(actor), limits=limits)
    return build_app(svc, None)


async def _stream(app: Any, max_tokens: int) -> str:
    import httpx

    body = {"model": "ninfer-demo", "messages": [{"role": "user", "content": "tell me a story"}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}  # fmt: skip
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            return "".join([line async for line in r.aiter_lines()])


def trace(max_tokens: int) -> dict[str, Any]:
    from ninfer.demo import build_demo

    art = build_demo(os.path.join(tempfile.mkdtemp(), "demo.ninfer"))
    t = _Trace(_roots())
    t.install()  # before the actor starts its engine thread, so that thread is hooked too
    actor = _actor(art)
    app = _app(actor)

    async def run() -> str:
        await _stream(app, 2)  # warm-up: imports and first-call work stay out of the count
        t.on = True
        out = await _stream(app, max_tokens)
        t.on = False
        return out

    out = asyncio.run(run())
    asyncio.run(actor.shutdown())
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    assert "[DONE]" in out, out[-300:]
    files = sorted(t.files)
    corridor = [f for f in files if f.startswith(CORRIDOR)]
    threads = {tid for ids in t.files.values() for tid in ids}
    return {
        "files": len(files),
        "corridor_files": len(corridor),
        "model_files": len(files) - len(corridor),
        "threads": len(threads),
        "process_boundaries": 2,  # API -> actor (Ray call), actor -> API (Ray streaming items)
        "corridor": corridor,
        "model": [f for f in files if f not in corridor],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    res = trace(a.max_tokens)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"{res['files']} files ({res['corridor_files']} corridor + {res['model_files']} model), "
              f"{res['threads']} threads, {res['process_boundaries']} process boundaries")  # fmt: skip
        for f in res["corridor"]:
            print("  ", f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
