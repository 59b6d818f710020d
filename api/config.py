"""ServerConfig: every `ninfer serve` option, built once from the command line and validated in one place."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ninfer.cuda import options as cuda_options
from ninfer.engine.config import GDN_STATE_DTYPES, KV_DTYPES, SPEC_MODES, EngineConfig, EngineConfigError

__all__ = [
    "ServerConfig",
    "ServerConfigError",
    "BACKENDS",
    "KV_DTYPES",
    "GDN_STATE_DTYPES",
    "SPEC_MODES",
    "engine_config",
]

BACKENDS = ("auto", "reference", "cuda", "null")  # null: no model, tokens at a fixed step time (benchmarks)
RAY_NAMESPACE = "ninfer"
SERVER_QUEUE_DEPTH = 16  # the server's default admission queue (the engine's own default is 8)


class ServerConfigError(ValueError):
    """An invalid server option; the message names the flag."""


def engine_config(**settings: Any) -> EngineConfig:
    """The ``EngineConfig`` of ``ninfer serve``'s engine flags (None: the engine's default), its errors naming
    the flag (``max_concurrency`` -> ``--max-concurrency``)."""
    kw = {k: v for k, v in settings.items() if v is not None}
    kw.setdefault("queue_depth", SERVER_QUEUE_DEPTH)
    try:
        return EngineConfig(**kw)
    except EngineConfigError as e:
        name, _, rest = str(e).partition(":")
        raise ServerConfigError(f"--{name.replace('_', '-')}:{rest}") from None


def _default_engine() -> EngineConfig:
    return engine_config()


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    artifact: str
    host: str = "127.0.0.1"
    port: int = 8010
    model_id: str | None = None  # None: the artifact's model identity
    engine: EngineConfig = field(default_factory=_default_engine)  # the engine's settings, the one source
    preserve_thinking: bool = False
    default_max_tokens: int = 8192
    api_key_file: str | None = None
    request_log_jsonl: str | None = None
    backend: str = "auto"
    null_step_ms: float = 1.5  # --backend null: the time of one engine step (no model runs)
    null_busy: bool = False  # --backend null: the step spins holding the GIL (as the CUDA engine's thread) instead of sleeping
    cuda_graph: bool = True
    # the CUDA backend's precision and memory options (ninfer/cuda/options.py: choices, help, docs/cuda.md: costs)
    activations: str = cuda_options.DEFAULTS["activations"]  # fp32 (exact operands) or bf16 (faster prefill)
    prefill_inputs: str = cuda_options.DEFAULTS["prefill_inputs"]  # prefill GEMM inputs with fp32 activations
    prefill_attention: str = cuda_options.DEFAULTS["prefill_attention"]  # prefill attention operands
    prefill_gdn: str = cuda_options.DEFAULTS["prefill_gdn"]  # the chunked GDN prefill's scratch
    prefill_weights: str = cuda_options.DEFAULTS["prefill_weights"]  # fp16 prefill operands kept resident
    cors: bool = False
    # chat usage.prompt_tokens_details.cached_tokens (off: upstream's contract compares a request's usage
    # streamed and unstreamed, and the second of two identical requests reuses more of its prompt)
    prompt_tokens_details: bool = False
    max_request_mib: int = 384
    ray_address: str | None = None
    detached: bool = False
    actor_name: str = "ninfer-engine"
    ray_namespace: str = RAY_NAMESPACE
    allow_unregistered_shape: bool = False
    stream_interval_ms: float = 50.0  # least time between two streamed actor items of one request
    header_timeout_s: float = (
        10.0  # a request head must be complete this long after it started (or the connection)
    )
    body_timeout_s: float = 30.0  # most time between two pieces of a request body (408 after it)
    body_deadline_s: float = 60.0  # most time for a whole request body, from the complete head (408 after it)
    send_timeout_s: float = 60.0  # a stream whose client takes none of its data this long is cancelled
    keep_alive_timeout_s: float = 5.0  # an idle kept-alive connection is closed after this long
    max_connections: int = 256  # open connections; one more is answered 503 and closed
    shutdown_grace_s: float = 30.0  # on SIGTERM: time running requests get to finish before they are ended
    memory_reserve_gib: float = 0.0  # GPU memory the CUDA memory plan leaves free for other programs
    gpu_share: float = 1.0  # the fraction of a GPU the actor asks Ray for (CUDA): < 1 lets servers share one
    replicas: int | None = None  # None: one actor, no router; N: N replica actors behind the router
    route_poll_ms: float = 500.0  # how often the router reads each replica's load and retained prefixes

    def __post_init__(self) -> None:
        def positive(flag: str, v: int | None) -> None:
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise ServerConfigError(f"{flag}: must be a positive integer, got {v!r}")

        if not 1 <= self.port <= 65535:
            raise ServerConfigError(f"--port: must be in 1..65535, got {self.port}")
        cuda_options.check(self, ServerConfigError)
        positive("--default-max-tokens", self.default_max_tokens)
        positive("--max-request-mib", self.max_request_mib)
        if self.backend not in BACKENDS:
            raise ServerConfigError(f"--backend: must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not 0 <= self.null_step_ms <= 1000:
            raise ServerConfigError(f"--null-step-ms: must be in 0..1000, got {self.null_step_ms}")
        if not 0 <= self.stream_interval_ms <= 1000:
            raise ServerConfigError(
                f"--stream-interval-ms: must be in 0..1000, got {self.stream_interval_ms}"
            )
        for flag, v, hi in (
            ("--header-timeout-s", self.header_timeout_s, 3600),
            ("--body-timeout-s", self.body_timeout_s, 3600),
            ("--body-deadline-s", self.body_deadline_s, 3600),
            ("--send-timeout-s", self.send_timeout_s, 3600),
            ("--keep-alive-timeout-s", self.keep_alive_timeout_s, 3600),
        ):
            if not 0 < v <= hi:
                raise ServerConfigError(f"{flag}: must be in (0, {hi}] seconds, got {v}")
        if not 0 <= self.shutdown_grace_s <= 3600:
            raise ServerConfigError(
                f"--shutdown-grace-s: must be in 0..3600 seconds, got {self.shutdown_grace_s}"
            )
        positive("--max-connections", self.max_connections)
        if not 0 <= self.memory_reserve_gib <= 1024:
            raise ServerConfigError(
                f"--memory-reserve-gib: must be in 0..1024 GiB, got {self.memory_reserve_gib}"
            )
        if not 0 < self.gpu_share <= 1:
            raise ServerConfigError(f"--gpu-share: must be in (0, 1], got {self.gpu_share}")
        if self.replicas is not None and (not isinstance(self.replicas, int) or not 1 <= self.replicas <= 64):
            raise ServerConfigError(f"--replicas: must be in 1..64, got {self.replicas!r}")
        if not 10 <= self.route_poll_ms <= 60000:
            raise ServerConfigError(f"--route-poll-ms: must be in 10..60000, got {self.route_poll_ms}")
        if self.model_id is not None and not self.model_id.strip():
            raise ServerConfigError("--model-id: must be non-empty")
        if not self.actor_name:
            raise ServerConfigError("--actor-name: must be non-empty")
        if self.request_log_jsonl is not None and not self.request_log_jsonl:
            raise ServerConfigError("--request-log-jsonl: must be non-empty")

    @property
    def max_request_bytes(self) -> int:
        return self.max_request_mib << 20
