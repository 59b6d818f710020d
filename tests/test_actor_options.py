"""The engine actor's Ray options (pure CPU: nothing starts Ray).

One named concurrency group, and the control methods in Ray's default group: Ray starts each named group's event-loop
thread with a lambda that reads its loop variable late, so with two named groups a thread that starts late runs the
other group's loop and leaves its own unrun (a replica of the CI run at ac20592 never answered ``health``).
"""

from __future__ import annotations

import inspect

from ninfer.actors.actor_start import actor_options
from ninfer.actors.engine_actor import CTL_CONCURRENCY, GEN_GROUP, EngineActor
from ninfer.actors.messages import ActorSpec

from ninfer.engine import EngineConfig

CONTROL = {"cancel", "count_tokens", "stats", "route_state", "prompt_blocks", "health", "info", "shutdown"}
STREAMS = {"generate", "subscribe", "open"}


def _groups() -> dict[str, str | None]:
    return {
        name: getattr(f, "__ray_concurrency_group__", None)
        for name, f in inspect.getmembers(EngineActor, inspect.isfunction)
        if not name.startswith("_")
    }


def test_one_named_group_sized_for_lanes_and_queue() -> None:
    spec = ActorSpec(
        artifact="a.ninfer", backend="reference", engine=EngineConfig(max_concurrency=3, queue_depth=5)
    )
    opts = actor_options(spec, name="n", namespace="ns", detached=False)
    assert opts["concurrency_groups"] == {GEN_GROUP: 3 + 5 + 64}
    assert opts["max_concurrency"] == CTL_CONCURRENCY >= 2


def test_streams_in_the_named_group_and_control_in_the_default_one() -> None:
    groups = _groups()
    assert set(groups) == CONTROL | STREAMS, (
        "a new public method: put it in a group here and in engine_actor.py"
    )
    assert {n for n, g in groups.items() if g == GEN_GROUP} == STREAMS
    assert {n for n, g in groups.items() if g is None} == CONTROL
