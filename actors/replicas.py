"""Engine replicas on Ray: starting them, and the Python job's client that pins one or routes (docs/replicas.md).

Replica ``i`` of the server whose actor name is ``NAME`` is the actor ``NAME-i`` in the server's namespace: a job
finds them by name. From any job on the cluster::

    from ninfer.actors import connect_replicas
    client = connect_replicas()                 # routed: prefix affinity, then the least-loaded replica
    print(client.chat([{"role": "user", "content": "hi"}], max_tokens=8).text)
    pinned = connect_replicas(replica=1)        # an EngineClient of replica 1 only
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import ray

from ninfer.engine.core import Finish, TokenDelta

from .actor_start import start_actor
from .client import DEFAULT_ACTOR_NAME, DEFAULT_NAMESPACE, EngineClient, GenerationError, join_ray
from .engine_actor import EngineActor
from .job_request import check_request_id
from .messages import ActorInfo, ActorSpec, ActorStats, Failed, GenerateRequest, Health, encode_requests
from .routing import ReplicaView, RouterConfig, merge_stats, rank

__all__ = ["replica_name", "start_replicas", "find_replicas", "connect_replicas", "RoutedEngineClient"]


def replica_name(base: str, index: int) -> str:
    return f"{base}-{index}"


def start_replicas(
    spec: ActorSpec,
    n: int,
    *,
    name: str,
    namespace: str,
    detached: bool = False,
    actor_cls: type = EngineActor,
) -> list[Any]:
    """``n`` engine actors of ``spec`` (one GPU each on the CUDA backend), started together; a detached replica
    that is already running under its name is used as it is. Ray must be initialised."""
    if spec.backend == "cuda":
        gpus = ray.cluster_resources().get("GPU", 0)
        if gpus < n:
            raise RuntimeError(f"--replicas {n}: the Ray cluster has {gpus:g} GPUs; each replica needs one")
    handles: list[Any] = [None] * n
    for i in range(n):
        if detached:
            try:
                handles[i] = ray.get_actor(replica_name(name, i), namespace=namespace)
                continue
            except ValueError:
                pass
        handles[i] = start_actor(
            spec,
            name=replica_name(name, i),
            namespace=namespace,
            detached=detached,
            wait=False,
            actor_cls=actor_cls,
        )
    try:
        ray.get([h.health.remote() for h in handles])  # every engine loaded (a failed load surfaces here)
    except ray.exceptions.RayActorError as e:
        for h in handles:
            ray.kill(h, no_restart=True)
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        raise RuntimeError(f"an engine replica failed to start: {lines[-1] if lines else e}") from None
    return handles


def find_replicas(name: str = DEFAULT_ACTOR_NAME, *, namespace: str = DEFAULT_NAMESPACE) -> list[Any]:
    """The handles of ``name-0``, ``name-1``, ... as far as they exist."""
    out = []
    while True:
        try:
            out.append(ray.get_actor(replica_name(name, len(out)), namespace=namespace))
        except ValueError:
            return out


def connect_replicas(
    name: str = DEFAULT_ACTOR_NAME,
    *,
    replica: int | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    address: str | None = "auto",
    cfg: RouterConfig | None = None,
) -> EngineClient:
    """A client of the replicas of the server whose actor name is ``name``: pinned to ``replica``, or routed."""
    join_ray(
        address, namespace, f"the engine replicas {replica_name(name, 0)!r}... (namespace {namespace!r})"
    )
    handles = find_replicas(name, namespace=namespace)
    if not handles:
        raise ValueError(
            f"no replicas named {replica_name(name, 0)!r}... in namespace {namespace!r}: is "
            f"`ninfer serve ART --replicas N --actor-name {name}` running on the Ray cluster? "
            "(a server without --replicas: use connect)"
        )
    if replica is not None:
        if not 0 <= replica < len(handles):
            raise ValueError(f"replica: {replica} is not one of 0..{len(handles) - 1}")
        return EngineClient(handles[replica])
    return RoutedEngineClient(handles, cfg or RouterConfig())


class RoutedEngineClient(EngineClient):
    """An ``EngineClient`` whose every request goes where the router's policy sends it (actors/routing.py). It
    asks a replica for the prompt's block hashes (a job has no tokenizer) and the replicas for their state
    (at most every ``poll_interval_s``), then tries them in order: 429 or a gone replica moves to the next."""

    def __init__(self, handles: list[Any], cfg: RouterConfig) -> None:
        super().__init__(handles[0])
        self.cfg = cfg
        self.views = [ReplicaView(index=i, name=str(i), client=h, capacity=1) for i, h in enumerate(handles)]
        self._polled = -1e9

    def replica(self, index: int) -> EngineClient:
        """A client pinned to one replica."""
        return EngineClient(self.views[index].client)

    def _refresh(self) -> None:
        if time.monotonic() - self._polled < self.cfg.poll_interval_s:
            return
        sent = time.monotonic()
        refs = [v.client.route_state.remote(self.cfg.block_tokens, v.version) for v in self.views]
        for v, ref in zip(self.views, refs, strict=True):
            try:
                v.apply(ray.get(ref, timeout=self.cfg.probe_timeout_s))
                v.poll_sent, v.poll_done = sent, time.monotonic()
            except Exception:  # gone or restarting: out of rotation until it answers again
                v.down()
        self._polled = time.monotonic()

    def _order(self, req: GenerateRequest) -> tuple[list[ReplicaView], list[int]]:
        self._refresh()
        r = rank(self.views, [], self.cfg)
        blocks: list[int] | Failed = []
        if r.order:
            blocks = ray.get(
                r.order[0].client.prompt_blocks.remote(encode_requests([req]), self.cfg.block_tokens)
            )
        if isinstance(blocks, Failed):
            raise GenerationError(blocks)
        return rank(self.views, blocks, self.cfg).order, blocks

    def _stream(self, req: GenerateRequest) -> Iterator[TokenDelta | Finish]:
        order, blocks = self._order(req)
        if not order:
            raise GenerationError(Failed(code="no_replica", message="no engine replica is up", status=503))
        for k, view in enumerate(order):
            it = EngineClient(view.client)._stream(req)
            try:
                first = next(it)
            except GenerationError as e:
                if k + 1 < len(order) and (e.code == "queue_full" or e.status == 503):
                    continue  # full or gone: the next replica
                raise
            except StopIteration:
                return
            view.routed += 1
            admitted = time.monotonic()
            view.remember(blocks, self.cfg.recent_ttl_s, admitted)
            try:
                yield first
                yield from it
            finally:
                view.retired(admitted, time.monotonic())
            return

    def cancel(self, request_id: str) -> bool:
        """Cancel ``request_id`` wherever it runs (the replica holding it says True)."""
        rid = check_request_id(request_id)
        return any(ray.get([v.client.cancel.remote(rid) for v in self.views]))

    def stats(self) -> ActorStats:
        return merge_stats(ray.get([v.client.stats.remote() for v in self.views]))

    def health(self) -> Health:
        hs = []
        for v in self.views:
            try:
                hs.append(ray.get(v.client.health.remote(), timeout=self.cfg.probe_timeout_s).ok)
            except Exception:
                hs.append(False)
        status = {v.name: "ok" if ok else "unavailable" for v, ok in zip(self.views, hs, strict=True)}
        return Health(ok=any(hs), replicas=status)

    def info(self) -> ActorInfo:
        return ray.get(self.views[0].client.info.remote())
