"""The Python-job client (``ninfer.actors.connect``): its arguments checked before anything is sent, a caller's
``request_id`` to cancel by, and ``connect`` errors that name the actor looked for. The actor runs in-process
(no Ray): a stand-in handle calls it with Ray's calling convention on a loop of its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import ray
from ninfer.actors import client as client_mod
from ninfer.actors.client import EngineClient, GenerationError, connect
from ninfer.actors.engine_actor import EngineActor
from ninfer.actors.job_request import job_request
from ninfer.actors.messages import ActorSpec

from ninfer.engine import EngineConfig

USER = [{"role": "user", "content": "hello"}]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.generate("123"), "prompt_ids: must be a sequence of token ids"),
        (lambda c: c.generate([]), "prompt_ids: must be non-empty"),
        (lambda c: c.generate([1, "2"]), r"prompt_ids\[1\]: must be a non-negative integer"),
        (lambda c: c.generate([1, -2]), r"prompt_ids\[1\]"),
        (lambda c: c.generate([1.5]), r"prompt_ids\[0\]"),
        (lambda c: c.stream([True]), r"prompt_ids\[0\]"),
        (lambda c: c.chat("hi"), "messages: must be a list of chat messages"),
        (lambda c: c.chat({"role": "user", "content": "hi"}), "messages: must be a list"),
        (lambda c: c.chat([]), "messages: must be non-empty"),
        (lambda c: c.stream_chat(["hi"]), r"messages\[0\]: must be a dict"),
        (lambda c: c.chat([{"content": "x"}]), r"messages\[0\].role: must be a string"),
        (lambda c: c.chat(USER, template_kwargs=["x"]), "template_kwargs: must be a dict"),
        (lambda c: c.generate([1], temprature=0.5), "temprature: not a sampling setting"),
        (lambda c: c.generate([1], max_tokens="8"), r"sampling: Expected `int \| null`, got `str` - at `\$.max_tokens`"),
        (lambda c: c.generate([1], stop=[1]), r"\$.stop\[0\]"),
        (lambda c: c.generate([1], temperature=-1.0), "temperature: must be >= 0"),
        (lambda c: c.generate([1], top_k=-1), "top_k: must be an integer >= 0"),
        (lambda c: c.generate([1], max_tokens=0), "max_tokens: must be a positive integer"),
        (lambda c: c.generate([1], request_id=""), "request_id: must be a non-empty string"),
        (lambda c: c.generate([1], request_id=7), "request_id: must be a non-empty string"),
        (lambda c: c.generate([1], request_id="x" * 257), "request_id: at most 256 characters"),
        (lambda c: c.cancel(None), "request_id: must be a non-empty string"),
    ],
)  # fmt: skip
def test_bad_arguments_are_value_errors_before_anything_is_sent(call: Any, message: str) -> None:
    client = EngineClient(object())  # any use of the handle would be an AttributeError
    with pytest.raises(ValueError, match=message):
        call(client)


def test_what_a_job_may_pass_is_converted() -> None:
    """NumPy ids and budgets, one stop string, an int temperature: the request the actor expects."""
    r = job_request(
        prompt_ids=np.array([3, 4]),
        messages=None,
        template=None,
        max_tokens=np.int64(4),
        stop="x",
        temperature=1,
    )
    assert r.prompt_ids == (3, 4) and r.request_id.startswith("job-") and r.client == "python-job"
    assert r.sampling.max_tokens == 4 and type(r.sampling.max_tokens) is int
    assert r.sampling.stop == ("x",) and r.sampling.temperature == 1.0 and r.sampling.top_p is None
    mine = job_request(prompt_ids=None, messages=USER, template={"enable_thinking": False}, request_id="mine")
    assert mine.request_id == "mine" and mine.messages == tuple(USER)


class _Handle:
    """``handle.method.remote(...)`` on an in-process actor: its coroutines run on a loop in another thread,
    ``generate`` gives its items one by one as Ray's streaming generator does (``ray.get`` is patched to wait)."""

    def __init__(self, actor: EngineActor) -> None:
        self.actor = actor
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def _run(self, coro: Any) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def _items(self, req: Any) -> Iterator[concurrent.futures.Future]:
        gen = self.actor.generate(req)
        while True:
            fut = self._run(gen.__anext__())
            try:
                fut.result()
            except StopAsyncIteration:
                return
            yield fut

    def __getattr__(self, name: str) -> Any:
        if name == "generate":
            return SimpleNamespace(remote=self._items)
        fn = getattr(self.actor, name)
        return SimpleNamespace(remote=lambda *a: self._run(fn(*a)))

    def close(self) -> None:
        self._run(self.actor.shutdown()).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


@pytest.fixture
def client(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EngineClient]:
    from ninfer.demo import build_demo

    art = build_demo(tmp_path_factory.mktemp("job") / "demo.ninfer")
    cfg = EngineConfig(max_concurrency=2, queue_depth=2, max_context=512, kv_capacity=4096)
    handle = _Handle(EngineActor(ActorSpec(artifact=art, backend="reference", engine=cfg)))
    real_get = ray.get
    monkeypatch.setattr(
        client_mod.ray,
        "get",
        lambda x, **kw: x.result() if isinstance(x, concurrent.futures.Future) else real_get(x),
    )
    yield EngineClient(handle)
    handle.close()


def test_a_caller_cancels_its_request_by_its_id(client: EngineClient) -> None:
    """``request_id=`` names the request: another thread cancels it by that id, its stream ends with the
    Finish; a second request under an id still running is refused (a cancel could not tell them apart)."""
    got: dict[str, Any] = {}
    long = {"max_tokens": 400, "temperature": 0.0, "ignore_eos": True}
    t = threading.Thread(target=lambda: got.update(r=client.generate([1, 2, 3], request_id="mine", **long)))
    t.start()
    for _ in range(500):
        if client.stats().lanes_busy == 1:
            break
        time.sleep(0.01)
    with pytest.raises(GenerationError) as ei:
        client.generate([1, 2], request_id="mine", max_tokens=2)
    assert ei.value.code == "duplicate_request_id" and ei.value.status == 400
    assert client.cancel("mine") is True
    t.join(timeout=30)
    r = got["r"]
    assert r.request_id == "mine" and r.finish_reason == "cancelled" and len(r.token_ids) < 400
    assert client.cancel("mine") is False  # over: nothing to cancel
    again = client.generate([1, 2], request_id="mine", max_tokens=2, temperature=0.0, ignore_eos=True)
    assert len(again.token_ids) == 2  # the id is free again once its request ended


def test_connect_names_the_actor_it_looked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cluster(**kw: Any) -> None:
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_cluster)
    with pytest.raises(
        ConnectionError, match="cannot reach a running Ray cluster to find the engine actor 'eng'"
    ):
        connect("eng")

    def no_actor(name: str, namespace: str) -> None:
        raise ValueError(f"Failed to look up actor with name '{name}'")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_actor", no_actor)
    with pytest.raises(
        ValueError, match=r"no engine actor 'eng' in namespace 'jobs' on the Ray cluster.*--actor-name eng"
    ):
        connect("eng", namespace="jobs")
