"""`ninfer serve --replicas N`: the replicas behind the endpoint, their router, and their metrics
(docs/replicas.md).

Without ``--replicas`` the server runs one engine actor, named ``--actor-name``, and talks to it directly. With
``--replicas N`` (N >= 1) it runs N actors ``NAME-0`` .. ``NAME-{N-1}`` of the same artifact and settings and
puts a ``ReplicaRouter`` (actors/router.py) between them and the API.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import ray
from ninfer.actors.client import AsyncEngineClient
from ninfer.actors.engine_actor import EngineActor
from ninfer.actors.messages import ActorInfo, ActorSpec
from ninfer.actors.replicas import replica_name, start_replicas
from ninfer.actors.route_prompt import PromptBlocks
from ninfer.actors.router import ReplicaRouter
from ninfer.actors.routing import RouterConfig

from .config import ServerConfig

__all__ = ["start_router", "router_config"]


def _log(msg: str) -> None:
    print(f"ninfer serve: {msg}", file=sys.stderr, flush=True)


def router_config(cfg: ServerConfig) -> RouterConfig:
    return RouterConfig(block_tokens=cfg.engine.page_size, poll_interval_s=cfg.route_poll_ms / 1000)


def start_router(
    cfg: ServerConfig, spec: ActorSpec, warm_up: Callable[[Any], None], actor_cls: type = EngineActor
) -> tuple[ReplicaRouter, list[Any], ActorInfo]:
    """Start (or, detached, find) the replicas, warm each up, and build their router. Returns the router, the
    actor handles (the caller kills them at shutdown unless detached) and the first replica's info."""
    n = cfg.replicas or 1
    _log(f"loading {cfg.artifact} on {n} {spec.backend} replicas ({replica_name(cfg.actor_name, 0)}, ...)")
    t0 = time.perf_counter()
    handles = start_replicas(
        spec, n, name=cfg.actor_name, namespace=cfg.ray_namespace, detached=cfg.detached, actor_cls=actor_cls
    )
    _log(f"{n} replicas loaded in {time.perf_counter() - t0:.1f} s")
    infos: list[ActorInfo] = ray.get([h.info.remote() for h in handles])
    for h in handles:
        warm_up(h)
    rc = router_config(cfg)
    blocks = PromptBlocks.from_artifact(cfg.artifact, rc.block_tokens, infos[0].max_context)
    router = ReplicaRouter(
        [AsyncEngineClient(h) for h in handles],
        [(i.max_concurrency, i.queue_depth) for i in infos],
        rc,
        blocks,
        names=[str(i) for i in range(n)],
    )
    return router, handles, infos[0]
