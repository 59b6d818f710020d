"""The body of `ninfer serve`: Ray, the actor, the warm-up, uvicorn, and an orderly shutdown."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Any

import ray
import uvicorn
from ninfer.actors.actor_start import start_actor
from ninfer.actors.client import AsyncEngineClient, EngineClient, GenerationError
from ninfer.actors.engine_actor import EngineActor
from ninfer.actors.messages import ActorInfo, ActorSpec
from ninfer.actors.router import ReplicaRouter

from ninfer.architectures import CUDA_ARCHITECTURES
from ninfer.artifact import open_artifact
from ninfer.cuda import options as cuda_options

from .app import build_app
from .auth import KeyFileError, KeyRing, load_key_file
from .config import ServerConfig
from .gate import Drain, DrainingServer
from .http_guard import guarded_protocol
from .openai_chat import ChatLimits
from .replicas import start_router
from .reqlog import RequestLog, RequestLogError
from .service import Service

__all__ = ["serve", "resolve_backend", "visible_gpus", "cuda_refusal", "actor_spec"]


def _log(msg: str) -> None:
    print(f"ninfer serve: {msg}", file=sys.stderr, flush=True)


def visible_gpus() -> int:
    """CUDA devices cupy sees (0 without cupy, a driver or a device)."""
    try:
        import cupy  # noqa: PLC0415

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no cupy, no driver, no device: all mean no GPU
        return 0


def resolve_backend(backend: str, arch: str | None, *, gpus: int | None = None) -> tuple[str, str]:
    """The backend to run and why. ``auto`` is cuda when a GPU is visible (``gpus``, default: ask cupy) and the
    CUDA backend has a target for the artifact's architecture ``arch`` (upstream v1 files give theirs too, as
    ``serve`` reads it through ``open_artifact``); the NumPy reference otherwise. An explicit backend is kept as it
    is."""
    if backend != "auto":
        return backend, f"--backend {backend}"
    if (visible_gpus() if gpus is None else gpus) < 1:
        return "reference", "no GPU visible"
    if arch not in CUDA_ARCHITECTURES:
        what = "upstream v1 artifacts" if arch is None else f"architecture {arch!r}"
        return "reference", f"a GPU is visible, but the CUDA backend has no target for {what} yet"
    return "cuda", "a GPU is visible"


def cuda_refusal(cfg: ServerConfig, backend: str, arch: str | None, *, gpus: int | None = None) -> str | None:
    """Why ``backend`` cannot start here, before Ray does (else None): the CUDA backend with no GPU visible (the
    actor would wait forever for one; with ``--ray-address`` the cluster may have one elsewhere) or for an
    architecture it has no kernels for."""
    if backend != "cuda":
        return None
    if arch not in CUDA_ARCHITECTURES:
        what = "upstream v1 artifacts" if arch is None else f"architecture {arch!r}"
        return f"--backend cuda: the CUDA backend has no kernels for {what} yet; use --backend reference"
    if not cfg.ray_address and (visible_gpus() if gpus is None else gpus) < 1:
        return (
            "--backend cuda: no GPU is visible on this machine (cupy sees no CUDA device); "
            "use --backend reference, or --ray-address of a cluster with one"
        )
    return None


def actor_spec(cfg: ServerConfig, backend: str) -> ActorSpec:
    options: dict[str, object] = {}
    if backend == "cuda":
        options = {"cuda_graph": cfg.cuda_graph, **cuda_options.backend_options(cfg)}
        if cfg.memory_reserve_gib:  # GPU memory the runner's plan leaves to other programs
            options["memory_reserve_bytes"] = int(cfg.memory_reserve_gib * (1 << 30))
    elif backend == "null":
        options = {"step_s": cfg.null_step_ms / 1000, "busy": cfg.null_busy}
    template = {"preserve_thinking": True} if cfg.preserve_thinking else {}
    return ActorSpec(
        artifact=os.path.abspath(cfg.artifact),
        backend=backend,
        model_id=cfg.model_id,
        engine=cfg.engine,
        backend_options=options,
        template_defaults=template,
        stream_interval_s=cfg.stream_interval_ms / 1000,
        gpu_share=cfg.gpu_share,
        blas_threads=_blas_threads(),
        allow_unregistered_shape=cfg.allow_unregistered_shape,
    )


def _blas_threads() -> int:
    """The operator's OMP_NUM_THREADS, if set, also applies inside the actor (Ray would otherwise pin 1)."""
    v = os.environ.get("OMP_NUM_THREADS", "")
    return int(v) if v.isdigit() else 0


def _start_ray(cfg: ServerConfig) -> None:
    if cfg.ray_address:
        _log(f"joining Ray at {cfg.ray_address}")
        ray.init(address=cfg.ray_address, namespace=cfg.ray_namespace, log_to_driver=True)
    else:
        _log("starting a local Ray instance")
        if cfg.detached:
            _log("note: --detached without --ray-address: the actor ends with this process's local Ray")
        ray.init(namespace=cfg.ray_namespace, include_dashboard=False, log_to_driver=True)


def _start_actor(cfg: ServerConfig, spec: ActorSpec, actor_cls: type) -> Any:
    if cfg.detached:
        try:
            handle = ray.get_actor(cfg.actor_name, namespace=cfg.ray_namespace)
            _log(f"using the running detached actor {cfg.actor_name!r}")
            return handle
        except ValueError:
            pass
    _log(f"loading {cfg.artifact} on the {spec.backend} backend (actor {cfg.actor_name!r})")
    t0 = time.perf_counter()
    handle = start_actor(
        spec, name=cfg.actor_name, namespace=cfg.ray_namespace, detached=cfg.detached, actor_cls=actor_cls
    )
    _log(f"model loaded in {time.perf_counter() - t0:.1f} s")
    return handle


def _start_engines(
    cfg: ServerConfig, spec: ActorSpec, actor_cls: type
) -> tuple[Any, ReplicaRouter | None, list[Any], ActorInfo]:
    """The API's engine backend: the one actor, or with ``--replicas`` the router over the replicas
    (api/replicas.py); then the router (or None), the actor handles and the (first) actor's info."""
    if cfg.replicas is not None:
        router, handles, info = start_router(cfg, spec, _warm_up, actor_cls)
        return router, router, handles, info
    handle = _start_actor(cfg, spec, actor_cls)
    info: ActorInfo = ray.get(handle.info.remote())
    _warm_up(handle)
    return AsyncEngineClient(handle), None, [handle], info


def _warm_up(handle: Any) -> None:
    _log("warming up")
    try:
        EngineClient(handle).chat([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0)
    except GenerationError as e:  # a failed warm-up is only reported, as upstream does
        _log(f"warm-up failed: {e}")


def _server_start_record(
    cfg: ServerConfig, info: ActorInfo, keyring: KeyRing | None, argv: list[str]
) -> dict[str, Any]:
    size = os.path.getsize(cfg.artifact) if os.path.exists(cfg.artifact) else None
    return {
        "server": {
            "host": cfg.host,
            "port": cfg.port,
            "public_model_id": info.model_id,
            "api_key_configured": keyring is not None,
            "api_key_count": len(keyring) if keyring else 0,
            "cors_enabled": cfg.cors,
            "max_request_bytes": cfg.max_request_bytes,
            "request_log_jsonl": cfg.request_log_jsonl,
            "default_output_tokens": cfg.default_max_tokens,
            "actor_name": cfg.actor_name,
            "replicas": cfg.replicas,
            "detached": cfg.detached,
        },
        "artifact": {"path": os.path.abspath(cfg.artifact), "size_bytes": size},
        "engine": {
            "device": info.backend,
            "max_context": info.max_context,
            "max_concurrency": info.max_concurrency,
            "queue_depth": info.queue_depth,
            "prefix_reuse": info.prefix_reuse,
            **info.engine_config,
        },
        "memory_plan": {**info.memory_plan, "reserve_gib": cfg.memory_reserve_gib},
        "argv": argv,  # no secrets on the command line: keys come from a file
    }


def _http_server(cfg: ServerConfig, app: Any, drain: Drain) -> DrainingServer:
    """uvicorn with the connection guard (head deadline, connection cap), its keep-alive timeout and the drain
    in front of its own shutdown (which then only has to close idle connections)."""
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        http=guarded_protocol(cfg.header_timeout_s, cfg.max_connections),
        timeout_keep_alive=cfg.keep_alive_timeout_s,  # type: ignore[arg-type] - a float works
        log_level="warning",
        timeout_graceful_shutdown=3,
        lifespan="on",
    )
    return DrainingServer(config, drain)


def _setup_logging() -> None:
    """The API's own log lines (5xx, drain, refused connections) on stderr beside the ``ninfer serve:`` ones."""
    log = logging.getLogger("ninfer.api")
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("ninfer serve: %(levelname)s %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False


def serve(cfg: ServerConfig, argv: list[str], actor_cls: type = EngineActor) -> int:
    """Serve until SIGINT/SIGTERM. ``actor_cls``: the engine actors' class (perf/bench_replicas.py
    passes a subclass that loads synthetic weights)."""
    _setup_logging()
    try:
        keyring = load_key_file(cfg.api_key_file) if cfg.api_key_file else None
        reqlog = RequestLog(cfg.request_log_jsonl, artifact=cfg.artifact) if cfg.request_log_jsonl else None
    except (KeyFileError, RequestLogError) as e:
        _log(f"error: {e}")
        return 2
    try:  # a clear message now rather than a failed actor creation later
        arch = open_artifact(cfg.artifact, verify="manifest").model_config.arch
    except (ValueError, OSError) as e:
        _log(f"error: {e}")
        return 2
    backend, why = resolve_backend(cfg.backend, arch)
    refusal = cuda_refusal(cfg, backend, arch)
    if refusal is not None:
        _log(f"error: {refusal}")
        return 2
    _log(f"backend: {backend} ({why})")
    spec = actor_spec(cfg, backend)
    _start_ray(cfg)
    handles: list[Any] = []
    try:
        backend_, router, handles, info = _start_engines(cfg, spec, actor_cls)
        limits = ChatLimits(
            model_id=info.model_id, max_context=info.max_context, default_max_tokens=cfg.default_max_tokens
        )
        svc = Service(
            config=cfg,
            backend=backend_,
            limits=limits,
            reqlog=reqlog,
            template_defaults=spec.template_defaults,  # --preserve-thinking: every request starts from these
            drain=Drain(cfg.shutdown_grace_s),
            replicas=router,
        )
        if reqlog is not None:
            reqlog.write("server_start", **_server_start_record(cfg, info, keyring, argv))
        server = _http_server(cfg, build_app(svc, keyring), svc.drain)
        auth = f"bearer ({len(keyring)} keys)" if keyring else "disabled"
        _log(f"listening on http://{cfg.host}:{cfg.port} (model id: {info.model_id}, auth: {auth})")
        try:
            server.run()  # the drain, then uvicorn's graceful shutdown (a second signal re-raises it after)
        except KeyboardInterrupt:
            return 130
        except SystemExit:  # (Ray's driver SIGTERM handler turns SIGTERM into SystemExit)
            pass
        if signal.SIGINT in server.signals:  # Ctrl-C: drained as for SIGTERM, the shell's status for SIGINT
            return 130
        return 0 if server.started else 1
    except Exception as e:
        _log(f"error: {type(e).__name__}: {e}")
        return 1
    finally:
        _log("shutting down")
        if reqlog is not None:
            reqlog.close()
        if not cfg.detached:
            for h in handles:
                ray.kill(h, no_restart=True)
        ray.shutdown()
