"""Starting the engine actor on Ray: its options (resources, concurrency groups, restarts) and ``start_actor``."""

from __future__ import annotations

import os
from typing import Any

import ray

from .engine_actor import CTL_CONCURRENCY, GEN_GROUP, EngineActor
from .messages import ActorSpec

__all__ = ["actor_options", "start_actor"]


def actor_options(spec: ActorSpec, *, name: str, namespace: str, detached: bool) -> dict[str, Any]:
    """Ray options: a GPU (or the ``gpu_share`` of one) for the CUDA backend, none for the reference; the gen group is sized so that a burst
    beyond lanes + queue still reaches ``generate`` at once and gets its 429 instead of waiting in Ray."""
    lanes, depth = spec.engine.max_concurrency, spec.engine.queue_depth
    opts: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "num_gpus": spec.gpu_share if spec.backend == "cuda" else 0,
        "num_cpus": 0,
        "max_restarts": -1,
        "max_task_retries": 0,
        "max_concurrency": CTL_CONCURRENCY,  # Ray's default group: the control methods (engine_actor.py)
        "concurrency_groups": {GEN_GROUP: lanes + depth + 64},
        "get_if_exists": False,
    }
    if detached:
        opts["lifetime"] = "detached"
    if spec.backend == "reference":
        # Ray pins OMP_NUM_THREADS=1 in workers without CPUs; the NumPy reference wants the node's BLAS threads
        n = str(spec.blas_threads or os.cpu_count() or 1)
        opts["runtime_env"] = {
            "env_vars": {k: n for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        }
    return opts


def start_actor(
    spec: ActorSpec,
    *,
    name: str,
    namespace: str,
    detached: bool = False,
    wait: bool = True,
    actor_cls: type = EngineActor,
) -> Any:
    """Create the named actor (Ray must be initialised) and return its handle, once the engine is loaded unless
    ``wait`` is false. ``actor_cls``: an ``EngineActor`` subclass (perf/ loads synthetic weights with one)."""
    opts = actor_options(spec, name=name, namespace=namespace, detached=detached)
    # concurrency groups are not settable in .options()
    cls = ray.remote(concurrency_groups=opts.pop("concurrency_groups"))(actor_cls)
    handle = cls.options(**opts).remote(spec)
    if not wait:
        return handle
    try:  # a failed __init__ (bad artifact, engine settings, ...) surfaces here
        ray.get(handle.health.remote())
    except ray.exceptions.RayActorError as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        raise RuntimeError(f"the engine actor failed to start: {lines[-1] if lines else e}") from None
    return handle
