"""`ninfer serve ART`: start or join Ray, create the engine actor, serve the HTTP API until SIGINT/SIGTERM.

Start-up order: validate options, open the key file and the request log, start the actor (which loads the
model), warm up with one short request, then bind and print where the server listens — so ``GET /health``
answers only once the server can generate.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ninfer.cuda import options as cuda_options
from ninfer.engine.config import MOE_PREFILL_CHUNK, PREFILL_CHUNK, EngineConfig

from .config import (
    BACKENDS,
    GDN_STATE_DTYPES,
    KV_DTYPES,
    SPEC_MODES,
    ServerConfig,
    ServerConfigError,
    engine_config,
)

__all__ = ["register", "run_serve", "config_from_args"]


def register(subparsers: Any) -> None:
    """Add the ``serve`` subcommand to the ``ninfer`` CLI."""
    engine = EngineConfig()  # the defaults of the engine flags left unset
    p = subparsers.add_parser(
        "serve", help="serve an artifact over HTTP (OpenAI-compatible) through a Ray actor"
    )
    p.add_argument("artifact", help="the .ninfer artifact (or upstream v1 file) to serve")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8010, help="port to listen on (default 8010)")
    p.add_argument(
        "--model-id", default=None, help="public model id (default: the artifact's model identity)"
    )
    p.add_argument(
        "--max-context", type=int, default=None, help="per-request limit on prompt + output tokens"
    )
    p.add_argument(
        "--kv-capacity", type=int, default=None, help="KV tokens shared by requests and retained prefixes"
    )
    p.add_argument("--max-concurrency", type=int, default=None, help="requests that run at once (1..8)")
    p.add_argument(
        "--queue-depth",
        type=int,
        default=None,
        help="requests that may wait (default 16); beyond it: HTTP 429",
    )
    p.add_argument(
        "--kv-dtype",
        default=None,
        choices=KV_DTYPES,
        help=f"KV cache element type (default {engine.kv_dtype})",
    )
    p.add_argument(
        "--gdn-state-dtype",
        default=None,
        choices=GDN_STATE_DTYPES,
        help=f"GDN recurrent state element type (default {engine.gdn_state_dtype})",
    )
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help=f"prompt tokens per prefill step (default {PREFILL_CHUNK}, MoE models {MOE_PREFILL_CHUNK})",
    )
    p.add_argument(
        "--spec", default=None, choices=SPEC_MODES, help="speculative decoding: mtp drafts with the MTP head"
    )
    p.add_argument(
        "--draft-tokens", type=int, default=None, help="draft tokens per round with --spec mtp (1..5)"
    )
    p.add_argument(
        "--preserve-thinking", action="store_true", help="keep earlier turns' thinking in the prompt"
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=8192,
        help="output budget of a request that gives none (default 8192; at most the context)",
    )
    p.add_argument("--api-key-file", default=None, help="keys, one per line, optionally prefixed 'name:'")
    p.add_argument("--request-log-jsonl", default=None, help="append one JSON line per request event")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: cuda when a GPU is present")
    p.add_argument(
        "--no-cuda-graph",
        action="store_true",
        help="CUDA backend: decode steps launched eagerly, not as graphs",
    )
    p.add_argument(
        "--null-step-ms",
        type=float,
        default=1.5,
        help="--backend null (benchmarks of the stack): the time of one engine step; no model runs",
    )
    p.add_argument(
        "--null-busy",
        action="store_true",
        help="--backend null: the step spins holding the GIL (as the CUDA engine's thread does) instead of sleeping",
    )
    cuda_options.add_arguments(p)  # --activations, --prefill-inputs, --prefill-attention, --prefill-gdn, ...
    p.add_argument(
        "--no-prefix-reuse",
        action="store_true",
        help="never reuse a retained prompt prefix's KV (prefix cache off)",
    )
    p.add_argument(
        "--host-cache-gib",
        type=float,
        default=None,
        help="host memory (GiB) for retained prefixes spilled from the GPU (docs/tiering.md); 0: none; "
        "default: half the available host memory, at most 32 GiB and 16x the device pool (CUDA), none (reference)",
    )
    p.add_argument(
        "--memory-reserve-gib",
        type=float,
        default=0.0,
        help="GPU memory (GiB) the CUDA memory plan leaves free for the desktop and other programs",
    )
    p.add_argument(
        "--gpu-share",
        type=float,
        default=1.0,
        help="the fraction of one GPU the engine actor asks Ray for (CUDA backend; default 1: the whole GPU). "
        "Below 1, several servers may share a GPU: give each a --kv-capacity or --memory-reserve-gib that fits",
    )
    p.add_argument("--cors", action="store_true", help="answer browsers' cross-origin requests (any origin)")
    p.add_argument(
        "--prompt-tokens-details",
        action="store_true",
        help="report the prefix-cache hits in Chat Completions usage (prompt_tokens_details.cached_tokens)",
    )
    p.add_argument(
        "--max-request-mib", type=int, default=384, help="request body cap, checked before parsing"
    )
    p.add_argument("--ray-address", default=None, help="join this Ray cluster (default: start a local one)")
    p.add_argument(
        "--detached", action="store_true", help="the actor outlives this process (Python jobs keep it)"
    )
    p.add_argument(
        "--actor-name",
        default="ninfer-engine",
        help="the engine actor's Ray name, for Python jobs' connect() (default ninfer-engine)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="run N engine actors (one GPU each on CUDA) behind a prefix-affinity router; "
        "actors are named ACTOR-NAME-0.. (default: one actor, no router)",
    )
    p.add_argument(
        "--route-poll-ms",
        type=float,
        default=500.0,
        help="with --replicas: how often the router reads each replica's load and retained prefixes",
    )
    p.add_argument(
        "--allow-unregistered-shape",
        action="store_true",
        help="serve an artifact whose shape is not a registered one (tiny test models)",
    )
    p.add_argument(
        "--stream-interval-ms",
        type=float,
        default=50.0,
        help="least time between two streamed items of a request",
    )
    _connection_options(p)
    p.set_defaults(func=run_serve)


def _connection_options(p: Any) -> None:
    g = p.add_argument_group("connections and shutdown")
    g.add_argument(
        "--header-timeout-s",
        type=float,
        default=10.0,
        help="a request head must be complete this long after it (or the connection) started; else closed",
    )
    g.add_argument(
        "--body-timeout-s", type=float, default=30.0, help="most time between two pieces of a body (then 408)"
    )
    g.add_argument(
        "--body-deadline-s",
        type=float,
        default=60.0,
        help="the whole body must arrive this long after the head was complete (then 408)",
    )
    g.add_argument(
        "--send-timeout-s",
        type=float,
        default=60.0,
        help="a streamed answer whose client takes none of it this long is cancelled (its lane freed)",
    )
    g.add_argument(
        "--keep-alive-timeout-s", type=float, default=5.0, help="an idle kept-alive connection is closed"
    )
    g.add_argument(
        "--max-connections", type=int, default=256, help="open connections; one more gets 503 and is closed"
    )
    g.add_argument(
        "--shutdown-grace-s",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT: new requests get 503 while running ones get this long to finish",
    )


def config_from_args(a: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        artifact=a.artifact,
        host=a.host,
        port=a.port,
        model_id=a.model_id,
        engine=engine_config(  # unset flags: the engine's defaults (EngineConfig, the one source)
            max_context=a.max_context,
            kv_capacity=a.kv_capacity,
            max_concurrency=a.max_concurrency,
            queue_depth=a.queue_depth,
            kv_dtype=a.kv_dtype,
            gdn_state_dtype=a.gdn_state_dtype,
            prefill_chunk=a.prefill_chunk,
            prefix_reuse=False if a.no_prefix_reuse else None,
            spec=a.spec,
            draft_tokens=a.draft_tokens,
            host_cache_gib=a.host_cache_gib,
        ),
        preserve_thinking=a.preserve_thinking,
        default_max_tokens=a.default_max_tokens,
        api_key_file=a.api_key_file,
        request_log_jsonl=a.request_log_jsonl,
        backend=a.backend,
        null_step_ms=a.null_step_ms,
        null_busy=a.null_busy,
        cuda_graph=not a.no_cuda_graph,
        **{o.name: getattr(a, o.name) for o in cuda_options.CUDA_OPTIONS},
        cors=a.cors,
        prompt_tokens_details=a.prompt_tokens_details,
        max_request_mib=a.max_request_mib,
        ray_address=a.ray_address,
        detached=a.detached,
        actor_name=a.actor_name,
        allow_unregistered_shape=a.allow_unregistered_shape,
        stream_interval_ms=a.stream_interval_ms,
        header_timeout_s=a.header_timeout_s,
        body_timeout_s=a.body_timeout_s,
        body_deadline_s=a.body_deadline_s,
        send_timeout_s=a.send_timeout_s,
        keep_alive_timeout_s=a.keep_alive_timeout_s,
        max_connections=a.max_connections,
        shutdown_grace_s=a.shutdown_grace_s,
        memory_reserve_gib=a.memory_reserve_gib,
        gpu_share=a.gpu_share,
        replicas=a.replicas,
        route_poll_ms=a.route_poll_ms,
    )


def check_artifact(cfg: ServerConfig) -> None:
    """Refuse, before Ray starts, an artifact that cannot be served: damaged, unregistered, or of an
    unregistered shape (tiny test checkpoints) without ``--allow-unregistered-shape``."""
    from ninfer.artifact import open_artifact

    art = open_artifact(cfg.artifact, verify="manifest")
    if cfg.engine.spec == "mtp" and not getattr(art.model_config, "mtp_num_hidden_layers", 0):
        raise ServerConfigError(
            f"--spec mtp: {cfg.artifact} carries no MTP weights (mtp.*); serve it without --spec"
        )
    if not art.shape_registered and not cfg.allow_unregistered_shape:
        raise ServerConfigError(
            f"{cfg.artifact}: the artifact's shape is not a registered {art.model_id} shape; "
            "pass --allow-unregistered-shape to serve it anyway"
        )


def run_serve(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
        check_artifact(cfg)
    except (ServerConfigError, ValueError) as e:  # ArtifactError is a ValueError
        print(f"ninfer serve: error: {e}", file=sys.stderr)
        return 2
    from .server import serve  # noqa: PLC0415 - ray/litestar load only when serving

    return serve(cfg, argv=list(sys.argv))
