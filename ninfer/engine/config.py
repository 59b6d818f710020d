"""``EngineConfig``: the frozen engine settings, validated once at start-up and passed down."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "EngineConfig",
    "EngineConfigError",
    "KV_DTYPES",
    "GDN_STATE_DTYPES",
    "SPEC_MODES",
    "MAX_DRAFT_TOKENS",
    "auto_host_cache_bytes",
    "HOST_CACHE_CAP_GIB",
    "default_prefill_chunk",
]

KV_DTYPES = ("bf16", "fp8")
GDN_STATE_DTYPES = ("fp32", "bf16")
SPEC_MODES = ("none", "mtp")
MAX_DRAFT_TOKENS = 5  # the most any target allows (Qwen3.6/3.8); a runner may allow fewer (Flash-Next: 4)
HOST_CACHE_CAP_GIB = 32.0  # the automatic host tier takes half the available host memory, at most this
HOST_CACHE_DEVICE_MULTIPLE = 16  # ... and at most this many times the device pool (KV pages and checkpoints)
GIB = 1 << 30
# the least default stride between GDN checkpoints (see EngineConfig.checkpoint_stride)
CHECKPOINT_STRIDE = 4096
# The default prefill chunk (EngineConfig.prefill_chunk = None): dense models 4096 tokens, MoE models 8192, whose
# expert GEMMs see twice the rows per expert. Measured (docs/cuda.md, "Prefill chunk"): the 27B gains nothing past
# 4096, the 35B-A3B ~4.7% at 8K and 32K prompts (H100, ead0b67).
PREFILL_CHUNK = 4096
MOE_PREFILL_CHUNK = 8192


def default_prefill_chunk(model_config: Any) -> int:
    """The prefill chunk a model gets when ``EngineConfig.prefill_chunk`` is None."""
    return MOE_PREFILL_CHUNK if getattr(model_config, "is_moe", False) else PREFILL_CHUNK


class EngineConfigError(ValueError):
    """An engine setting that cannot work, with the setting named."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    max_concurrency: int = 4
    """Lanes: requests that run at once (1..8)."""
    queue_depth: int = 8
    """Requests that may wait for a lane; one more is refused with ``QueueFull``."""
    max_context: int = 4096
    """Per-request limit on prompt + generated tokens."""
    kv_capacity: int = 32768
    """KV tokens in the shared page pool (active requests and retained prefixes); at least ``max_context``."""
    page_size: int = 16
    """Tokens per KV page: the unit of sharing between sequences."""
    kv_dtype: str = "bf16"
    """KV storage: ``bf16`` or ``fp8`` (e4m3 codes with one float32 scale per token and KV head)."""
    gdn_state_dtype: str = "fp32"
    """GDN conv and recurrent state between steps and in checkpoints: ``fp32`` or ``bf16`` (rounded on store)."""
    prefill_chunk: int | None = None
    """Most prompt tokens one lane computes in one step; also the step's prefill token budget. None: the model's
    default (``default_prefill_chunk``: 4096 dense, 8192 MoE), resolved by ``for_model`` when the engine or the
    runner is built."""
    prefix_reuse: bool = True
    """Retain finished sequences and resume new requests from their checkpoints."""
    checkpoint_stride: int | None = None
    """GDN checkpoints every this many tokens (plus end of prompt and end of generation); None: the larger of
    ``CHECKPOINT_STRIDE`` (4096) and the (resolved) ``prefill_chunk``, since a prompt's chunks are also cut at
    these positions (an explicit stride below the chunk makes the chunk no larger than the stride)."""
    checkpoint_budget_bytes: int | None = None
    """Bytes for GDN checkpoints (retained and being taken); None: 16 + 2 per lane snapshots of the model."""
    reserved_sequences: int = 64
    """Most recently active sequences whose latest end-of-prompt/end-of-generation checkpoints are reserved."""
    seed: int | None = None
    """Seed for sampled requests that bring none; None draws a fresh random seed per request."""
    spec: str = "none"
    """Speculative decoding: ``none``, or ``mtp`` (the artifact's MTP head drafts, the target verifies)."""
    draft_tokens: int = 0
    """Draft tokens per round with ``spec="mtp"`` (1..5; 0: the default 3); must stay 0 without ``spec``."""
    host_cache_gib: float | None = None
    """Host tier for retained prefixes (docs/tiering.md), GiB; 0: none; None: the backend's default (CUDA:
    half the available host memory, at most ``HOST_CACHE_CAP_GIB`` and ``HOST_CACHE_DEVICE_MULTIPLE`` times the
    device pool; the reference backend: none)."""
    tier_checksum: bool = False
    """Check every restore from the host tier bitwise against what was spilled (debug and tests; slower)."""

    def __post_init__(self) -> None:
        if self.checkpoint_stride is None and isinstance(self.prefill_chunk, int):  # resolved once, here
            object.__setattr__(self, "checkpoint_stride", max(CHECKPOINT_STRIDE, self.prefill_chunk))

        def positive(name: str) -> None:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise EngineConfigError(f"{name}: must be a positive integer, got {v!r}")

        for name in ("max_concurrency", "max_context", "kv_capacity", "page_size", "reserved_sequences"):
            positive(name)
        for name in ("prefill_chunk", "checkpoint_stride"):  # None until for_model resolves them
            if getattr(self, name) is not None:
                positive(name)
        if not 1 <= self.max_concurrency <= 8:
            raise EngineConfigError(f"max_concurrency: must be in 1..8, got {self.max_concurrency}")
        if (
            not isinstance(self.queue_depth, int)
            or isinstance(self.queue_depth, bool)
            or self.queue_depth < 0
        ):
            raise EngineConfigError(f"queue_depth: must be a non-negative integer, got {self.queue_depth!r}")
        if self.max_context < 2:
            raise EngineConfigError("max_context: must be at least 2 (one prompt token and one generated)")
        if self.num_pages < self.pages_for(self.max_context):
            raise EngineConfigError(
                f"kv_capacity: {self.kv_capacity} tokens ({self.num_pages} pages of {self.page_size}) cannot hold "
                f"one request of max_context={self.max_context}"
            )
        if self.kv_dtype not in KV_DTYPES:
            raise EngineConfigError(f"kv_dtype: must be one of {KV_DTYPES}, got {self.kv_dtype!r}")
        if self.gdn_state_dtype not in GDN_STATE_DTYPES:
            raise EngineConfigError(
                f"gdn_state_dtype: must be one of {GDN_STATE_DTYPES}, got {self.gdn_state_dtype!r}"
            )
        b = self.checkpoint_budget_bytes
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 0):
            raise EngineConfigError(
                f"checkpoint_budget_bytes: must be a non-negative integer or None, got {b!r}"
            )
        h = self.host_cache_gib
        if h is not None and (isinstance(h, bool) or not isinstance(h, int | float) or not 0 <= h <= 1 << 20):
            raise EngineConfigError(f"host_cache_gib: must be a number of GiB >= 0 or None (auto), got {h!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2**64):
            raise EngineConfigError(f"seed: must be an integer in 0..2^64-1 or None, got {self.seed!r}")
        self._check_spec()

    def _check_spec(self) -> None:
        if self.spec not in SPEC_MODES:
            raise EngineConfigError(f"spec: must be one of {SPEC_MODES}, got {self.spec!r}")
        k = self.draft_tokens
        if not isinstance(k, int) or isinstance(k, bool):
            raise EngineConfigError(f"draft_tokens: must be an integer, got {k!r}")
        if self.spec == "none" and k != 0:
            raise EngineConfigError("draft_tokens: needs spec='mtp' (--spec mtp)")
        if self.spec != "none" and not 0 <= k <= MAX_DRAFT_TOKENS:
            raise EngineConfigError(f"draft_tokens: must be in 1..{MAX_DRAFT_TOKENS}, got {k}")

    def for_model(self, model_config: Any) -> EngineConfig:
        """This configuration with ``prefill_chunk`` (and the stride that follows it) resolved for the model;
        itself when nothing is left to resolve."""
        if self.prefill_chunk is not None:
            return self
        return replace(
            self, prefill_chunk=default_prefill_chunk(model_config)
        )  # __post_init__ derives the stride

    # ---- derived values -------------------------------------------------------------------------------
    @property
    def num_draft(self) -> int:
        """Draft tokens per speculative round (0: no speculation)."""
        if self.spec == "none":
            return 0
        return self.draft_tokens or 3

    @property
    def num_pages(self) -> int:
        """Pages in the pool (kv_capacity rounded down to whole pages)."""
        return self.kv_capacity // self.page_size

    def pages_for(self, tokens: int) -> int:
        """Pages that hold ``tokens`` positions."""
        return -(-tokens // self.page_size)

    def checkpoint_budget(self, snapshot_bytes: int) -> int:
        """The checkpoint budget in bytes for a model whose GDN snapshot takes ``snapshot_bytes``."""
        if self.checkpoint_budget_bytes is not None:
            return self.checkpoint_budget_bytes
        return (16 + 2 * self.max_concurrency) * snapshot_bytes

    def host_tier(self, page_bytes: int, snapshot_bytes: int, auto_bytes: int) -> int:
        """Pages of ``page_bytes`` in the host tier (KV pages and GDN checkpoints share them): ``host_cache_gib``,
        or ``auto_bytes`` (at most ``HOST_CACHE_DEVICE_MULTIPLE`` times the device pool) when it is None; 0
        without prefix reuse or when it cannot hold one checkpoint and one page."""
        device = self.num_pages * page_bytes + self.checkpoint_budget(snapshot_bytes)
        auto = min(auto_bytes, HOST_CACHE_DEVICE_MULTIPLE * device)
        total = auto if self.host_cache_gib is None else int(self.host_cache_gib * GIB)
        n = total // page_bytes if self.prefix_reuse and total > 0 else 0
        return n if n > -(-snapshot_bytes // page_bytes) else 0


def auto_host_cache_bytes() -> int:
    """The automatic host tier: half the host memory available now, at most ``HOST_CACHE_CAP_GIB``."""
    import os

    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0
    return int(min(avail // 2, HOST_CACHE_CAP_GIB * GIB))
