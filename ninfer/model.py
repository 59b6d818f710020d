"""``ninfer.load``: an artifact plus a backend, as a model with ``.logits()`` and ``.generate()``."""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ninfer.artifact import Artifact, open_artifact
from ninfer.config import ModelConfig
from ninfer.flash_next.config import FlashNextConfig

if TYPE_CHECKING:
    from ninfer.engine import Engine
    from ninfer.engine.config import EngineConfig
    from ninfer.engine.core import Completion, ModelRunner

__all__ = ["Model", "load", "open_engine", "BackendError", "SAMPLING_DEFAULT_KEYS"]

DEFAULT_PREFILL_CHUNK = 64
# the generation_config keys that are sampling defaults (SamplingParams fields of the same name)
SAMPLING_DEFAULT_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
# the SamplingParams fields ``generate`` takes (max_tokens is max_new_tokens; stop_after_token_id is the server's)
_SAMPLING_FIELDS = frozenset(SAMPLING_DEFAULT_KEYS) | {"seed", "stop", "ignore_eos"}
_SAMPLED = frozenset({"temperature", "top_k", "top_p", "min_p", "seed"})  # any of them asks for sampling
# what the null backend's runner emits, token by token (ordinary text: detokenization does its usual work)
_NULL_TEXT = (
    "Once upon a time a small engine served many streams, one token at a time, and every token crossed the "
    "actor, Ray and HTTP before a reader saw it. "
)


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

    def runner(self, engine_config: EngineConfig) -> ModelRunner:
        """The engine's runner for this model's backend (ninfer/engine/core.py's contract)."""
        if self.backend == "cuda":
            from ninfer.cuda.runner import CudaModelRunner

            return CudaModelRunner(self.net, self.config, engine_config)
        if self.backend == "null":
            from ninfer.engine.null_runner import NullRunner

            pool = self.tokenizer.encode(_NULL_TEXT, add_special_tokens=False) if self.tokenizer else [0]
            return NullRunner(self.config.vocab_size, pool, **self.net)
        from ninfer.engine.model_runner import ReferenceRunner

        return ReferenceRunner(self.net, self.config, engine_config)

    def logits(self, token_ids: Sequence[int], prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> np.ndarray:
        """Logits [T, V] float32 for every position, through chunked prefill and the carried state."""
        ids = self.config.token_ids(token_ids)
        feed = self.open_sequence(len(ids))
        out = [self.net.lm_head(feed(ids[i : i + prefill_chunk])) for i in range(0, len(ids), prefill_chunk)]
        return np.concatenate(out, axis=0).astype(np.float32, copy=False)

    def open_sequence(self, max_tokens: int) -> Callable[[np.ndarray], Any]:
        """A fresh sequence of up to ``max_tokens`` tokens, outside any engine: a function that appends token ids
        and returns their final-normed hidden rows (``self.net.lm_head`` turns them into logits). On the CUDA
        backend it allocates the network's pools for one sequence (``ninfer.cuda.sequences.Sequences``), which
        drops any engine runner's pools on the same network: not while an engine over this model is open."""
        if self.backend == "cuda":
            from ninfer.cuda.sequences import Sequences

            seqs = Sequences(self.net, slots=1, context=max(1, max_tokens))
            sid = seqs.new()
            return lambda ids: seqs.forward(sid, ids)
        state = self.net.new_state()
        return lambda ids: self.net.forward(ids, state)

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        """The artifact's generation defaults that are sampling settings: what the server uses for a request
        that leaves them out."""
        return {
            k: self.generation_defaults[k] for k in SAMPLING_DEFAULT_KEYS if k in self.generation_defaults
        }

    def generate(
        self,
        token_ids: Sequence[int],
        max_new_tokens: int,
        greedy: bool | None = None,
        *,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        prefill_chunk: int | None = None,
        **settings: Any,
    ) -> list[int]:
        """The generated ids (a stop token included), through a one-lane engine driven in this thread: the same
        runner, sampler and stop rules as the server, so a seeded call gives the server's tokens for the same
        prompt, settings and seed.

        ``greedy``: True is argmax; False samples (temperature 1 unless given); None (the default) is argmax
        unless a sampling setting (``temperature`` > 0, ``top_k``, ``top_p``, ``min_p``, ``seed``) is given.
        Settings left out are the engine's defaults, not the artifact's (``sampling_defaults`` has those:
        ``generate(ids, n, **model.sampling_defaults)`` samples as the server does for a request without them).
        ``stop_token_ids``: None stops at the model's end-of-sequence ids, a list replaces them. ``settings``: the
        other ``SamplingParams`` fields (``min_p``, penalties, ``stop``, ``ignore_eos``) and ``EngineConfig``
        settings (the server's defaults otherwise)."""
        return self.complete(
            token_ids, max_new_tokens, greedy, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
            stop_token_ids=stop_token_ids, prefill_chunk=prefill_chunk, **settings,
        ).token_ids  # fmt: skip

    def complete(
        self,
        token_ids: Sequence[int],
        max_new_tokens: int,
        greedy: bool | None = None,
        *,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        prefill_chunk: int | None = None,
        **settings: Any,
    ) -> Completion:
        """``generate``'s engine ``Completion`` (token ids, text, finish reason, usage)."""
        from ninfer.engine import Engine

        ids = self.config.token_ids(token_ids).tolist()
        if (
            isinstance(max_new_tokens, bool)
            or not isinstance(max_new_tokens, numbers.Integral)
            or max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens: must be a positive integer, got {max_new_tokens!r}")
        max_new_tokens = int(max_new_tokens)
        given = {k: settings.pop(k) for k in list(settings) if k in _SAMPLING_FIELDS}
        given.update(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        sampling = _sampling(greedy, {k: v for k, v in given.items() if v is not None})
        cfg: dict[str, Any] = {"max_concurrency": 1, "queue_depth": 0, "prefix_reuse": False}
        cfg["max_context"] = len(ids) + max_new_tokens
        if prefill_chunk is not None:
            cfg["prefill_chunk"] = prefill_chunk
        cfg.update(settings)
        page = cfg.get("page_size", 16)
        cfg.setdefault("kv_capacity", -(-cfg["max_context"] // page) * page)  # one request's whole context
        if stop_token_ids is not None:
            sampling.update(stop_token_ids=tuple(stop_token_ids), ignore_eos=True)
        with Engine.from_model(self, background=False, **cfg) as eng:
            return eng.submit(ids, max_tokens=max_new_tokens, **sampling).result()


def _sampling(greedy: bool | None, given: dict[str, Any]) -> dict[str, Any]:
    """The request's sampling fields from ``generate``'s arguments (``given``: those set)."""
    if greedy is None:
        greedy = not (given.keys() & _SAMPLED) or given.get("temperature") == 0
    if greedy:
        if given.get("temperature", 0) > 0:
            raise ValueError(
                f"greedy decoding contradicts temperature={given['temperature']}: give one of them"
            )
        return {**given, "temperature": 0.0}
    return {"temperature": 1.0, **given}


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
    backend: Literal["reference", "cuda", "null"] = "reference",
    *,
    verify: Literal["full", "manifest"] = "full",
    upstream_config: ModelConfig | None = None,
    backend_options: dict[str, Any] | None = None,
) -> Model:
    """Open, check and load an artifact on ``backend``. Upstream v1 files load too; they carry no config, so
    their identity's pinned config is used unless ``upstream_config`` gives another (small test files).
    ``backend_options`` go to the backend (CUDA: ``ninfer.cuda.model.load_cuda``'s options). The ``null``
    backend loads no weights: its runner emits text tokens at a fixed step time (``step_s``; ``busy``: spin
    holding the GIL instead of sleeping), for measuring the engine and the serving stack without a model
    (``ninfer/engine/null_runner.py``)."""
    from ninfer.artifact.upstream import UpstreamArtifact, is_upstream_v1

    art: Any = (
        UpstreamArtifact(path, upstream_config)
        if upstream_config is not None and is_upstream_v1(path)
        else open_artifact(path, verify=verify)
    )
    if backend == "reference":
        from ninfer.architectures import reference_network

        return Model(art, reference_network(art.model_config, art.weights()), backend)
    if backend == "cuda":
        return Model(art, _cuda_net(art, backend_options or {}), backend)
    if backend == "null":
        unknown = set(backend_options or {}) - {"step_s", "busy"}
        if unknown:
            raise ValueError(
                f"backend_options: the null backend takes step_s and busy, got {sorted(unknown)}"
            )
        return Model(art, dict(backend_options or {}), backend)
    raise ValueError(f"backend: unknown backend {backend!r} (reference, cuda, null)")


def open_engine(
    path: str | os.PathLike[str],
    backend: Literal["reference", "cuda", "null"] = "reference",
    *,
    config: EngineConfig | None = None,
    background: bool = True,
    backend_options: dict[str, Any] | None = None,
    **settings: Any,
) -> Engine:
    """Load the artifact at ``path`` on ``backend`` (with ``backend_options``, e.g. CUDA's ``cuda_graph``) and
    start an engine over it, with ``config`` or the ``EngineConfig`` of ``settings``."""
    from ninfer.engine import Engine

    model = load(path, backend=backend, backend_options=backend_options)
    return Engine.from_model(model, config=config, background=background, **settings)


def _cuda_net(art: Any, options: dict[str, Any]) -> Any:
    from ninfer.architectures import CUDA_ARCHITECTURES

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
