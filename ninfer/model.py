"""``ninfer.load``: an artifact plus a backend, as a model with ``.logits()`` and ``.generate()``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from ninfer.artifact import Artifact, open_artifact
from ninfer.config import ModelConfig
from ninfer.flash_next.config import FlashNextConfig

__all__ = ["Model", "load", "BackendError", "CUDA_ARCHITECTURES"]

DEFAULT_PREFILL_CHUNK = 64
# Architectures the CUDA backend has kernels for; every other one (Flash-Next's qwen4_exp) runs on the reference.
CUDA_ARCHITECTURES = ("qwen3_5", "qwen3_5_moe")


class BackendError(RuntimeError):
    """The requested backend cannot run here (no GPU, missing package)."""


class Model:
    """A loaded model. ``net`` is the backend network; on the reference backend the architecture's reference
    (``ninfer.reference.Qwen36`` for Qwen3.5/3.6, ``ninfer.flash_next.FlashNext`` for qwen4_exp)."""

    def __init__(self, artifact: Artifact | Any, net: Any, backend: str) -> None:
        self.artifact = artifact
        self.config: ModelConfig | FlashNextConfig = artifact.model_config
        self.net = net
        self.backend = backend
        self.tokenizer = _tokenizer(artifact)
        self.chat_template = _chat_template(artifact, self.tokenizer)
        gen = artifact.resource("generation_config")
        self.generation_defaults: dict[str, Any] = json.loads(gen) if gen else {}

    @property
    def model_id(self) -> str:
        return self.artifact.model_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.config.eos_token_ids

    @property
    def token_limit(self) -> int:
        """Ids at or above this are padded vocabulary rows the tokenizer never produces; never sampled."""
        return self.tokenizer.vocab_size if self.tokenizer is not None else self.config.vocab_size

    def logits(self, token_ids: Sequence[int], prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> np.ndarray:
        """Logits [T, V] float32 for every position, through chunked prefill and the carried state."""
        ids = _as_ids(token_ids, self.config.vocab_size)
        state = self.net.new_state()
        out = [
            self.net.lm_head(self.net.forward(ids[i : i + prefill_chunk], state))
            for i in range(0, len(ids), prefill_chunk)
        ]
        return np.concatenate(out, axis=0).astype(np.float32, copy=False)

    def generate(
        self,
        token_ids: Sequence[int],
        max_new_tokens: int,
        greedy: bool = True,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    ) -> list[int]:
        """Prefill the prompt in chunks, then decode one token at a time with the recurrent state."""
        ids = _as_ids(token_ids, self.config.vocab_size)
        stops = set(self.eos_token_ids if stop_token_ids is None else stop_token_ids)
        rng = np.random.default_rng(seed)
        state = self.net.new_state()
        for i in range(0, len(ids), prefill_chunk):
            h = self.net.forward(ids[i : i + prefill_chunk], state)
        out: list[int] = []
        for _ in range(max_new_tokens):
            logits = self.net.lm_head(h[-1:])[0, : self.token_limit].astype(np.float64)
            tok = int(np.argmax(logits)) if greedy else _sample(logits, temperature, top_k, top_p, rng)
            out.append(tok)
            if tok in stops:
                break
            h = self.net.forward(np.array([tok], dtype=np.int64), state)
        return out


def _sample(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator
) -> int:
    z = logits / max(temperature, 1e-6)
    if top_k > 0:
        z[z < np.sort(z)[-min(top_k, z.size)]] = -np.inf
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        keep = np.cumsum(p[order]) - p[order] < top_p
        mask = np.zeros_like(p, dtype=bool)
        mask[order[keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return int(rng.choice(p.size, p=p))


def _as_ids(token_ids: Sequence[int], vocab: int) -> np.ndarray:
    ids = np.asarray(list(token_ids), dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError("token_ids: expected a non-empty sequence of token ids")
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"token_ids: ids must be in 0..{vocab - 1}")
    return ids


def _tokenizer(art: Artifact) -> Any:
    raw = art.resource("tokenizer")
    if raw is None:
        return None
    from ninfer.frontend import Tokenizer

    cfg_raw = art.resource("tokenizer_config")
    return Tokenizer.from_json_bytes(raw, json.loads(cfg_raw) if cfg_raw else None)


def _chat_template(art: Artifact, tokenizer: Any) -> Any:
    src = art.resource("chat_template")
    if src is None or tokenizer is None:
        return None
    from ninfer.frontend import ChatTemplate

    return ChatTemplate(src.decode("utf-8"), tokenizer)


def load(
    path: str | os.PathLike[str],
    backend: Literal["reference", "cuda"] = "reference",
    *,
    verify: Literal["full", "manifest"] = "full",
    upstream_config: ModelConfig | None = None,
    backend_options: dict[str, Any] | None = None,
) -> Model:
    """Open, check and load an artifact on ``backend``. Upstream v1 files load too; they carry no config, so
    their identity's pinned config is used unless ``upstream_config`` gives another (small test files).
    ``backend_options`` go to the backend (CUDA: ``ninfer.cuda.model.load_cuda``'s options)."""
    from ninfer.artifact.upstream import UpstreamArtifact, is_upstream_v1

    art: Any = (
        UpstreamArtifact(path, upstream_config)
        if upstream_config is not None and is_upstream_v1(path)
        else open_artifact(path, verify=verify)
    )
    if backend == "reference":
        from ninfer.artifact.registry import architecture

        net = architecture(art.model_config.arch).build_reference(art.model_config, art.weights())
        return Model(art, net, backend)
    if backend == "cuda":
        return Model(art, _cuda_net(art, backend_options or {}), backend)
    raise ValueError(f"backend: unknown backend {backend!r} (reference, cuda)")


def _cuda_net(art: Any, options: dict[str, Any]) -> Any:
    if art.model_config.arch not in CUDA_ARCHITECTURES:
        raise BackendError(f"the CUDA backend has no kernels for architecture {art.model_config.arch!r} yet")
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as e:  # no cupy, no driver or no device
        raise BackendError(f"backend 'cuda' needs an NVIDIA GPU with cupy: {e}") from None
    from ninfer.cuda.model import load_cuda

    return load_cuda(art, **options)
