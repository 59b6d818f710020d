"""Every name the actor uses from the engine and the frontend, in one place.

The actor speaks its own messages (actors/messages.py); this module translates them to and from the engine's
(ninfer.engine) and renders chat messages with the artifact's template. Request fields left unset take the
artifact's generation defaults (its ``generation_config`` resource), then the engine's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ninfer.artifact import open_artifact
from ninfer.engine import Engine, Finish, QueueFull, RequestError, SamplingParams, TokenDelta
from ninfer.frontend import ChatTemplate, TemplateError, Tokenizer

from .messages import ActorInfo, ActorSpec, Delta, Failed, Finished, GenerateRequest, SamplingOptions, Timings

__all__ = [
    "Loaded",
    "PromptError",
    "QueueFull",
    "RequestRejected",
    "open_engine",
    "prompt_ids",
    "submit",
    "events",
    "cancel",
    "engine_stats",
    "engine_alive",
    "engine_info",
    "close",
    "max_tokens_of",
]

_DEFAULT_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


class PromptError(ValueError):
    def __init__(self, message: str, *, code: str | None = None, param: str | None = "messages") -> None:
        super().__init__(message)
        self.code, self.param = code, param


class RequestRejected(ValueError):
    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param = code, param


@dataclass(slots=True)
class Loaded:
    engine: Any
    tokenizer: Tokenizer
    template: ChatTemplate | None
    model_id: str
    max_context: int
    defaults: dict[str, Any]
    spec: ActorSpec


def open_engine(spec: ActorSpec) -> Loaded:
    art = open_artifact(spec.artifact, verify="manifest")
    raw_cfg = art.resource("tokenizer_config")
    tok = Tokenizer.from_json_bytes(art.resource("tokenizer"), json.loads(raw_cfg) if raw_cfg else None)
    src = art.resource("chat_template")
    template = ChatTemplate(src.decode("utf-8"), tok) if src else None
    gen_raw = art.resource("generation_config")
    gen = json.loads(gen_raw) if gen_raw else {}
    defaults = {k: gen[k] for k in _DEFAULT_KEYS if k in gen}
    engine = Engine.open(spec.artifact, backend=spec.backend, **spec.engine)
    return Loaded(
        engine=engine,
        tokenizer=tok,
        template=template,
        model_id=spec.model_id or art.model_id,
        max_context=engine.config.max_context,
        defaults=defaults,
        spec=spec,
    )


def prompt_ids(ld: Loaded, req: GenerateRequest) -> list[int]:
    if req.prompt_ids is not None:
        ids = list(req.prompt_ids)
        if not ids:
            raise PromptError("prompt_ids: must be non-empty", param="prompt_ids")
    else:
        if ld.template is None:
            raise PromptError("this artifact has no chat template; send prompt_ids", code="no_chat_template")
        try:
            text = ld.template.render(
                list(req.messages or ()), add_generation_prompt=True, **req.template_kwargs
            )
        except TemplateError as e:
            raise PromptError(f"messages: {e}", code="invalid_messages") from None
        ids = ld.tokenizer.encode(text, add_special_tokens=False)
    if len(ids) >= ld.max_context:
        raise PromptError(
            f"the prompt has {len(ids)} tokens; this server's context is {ld.max_context} tokens",
            code="context_length_exceeded",
        )
    return ids


def _params(ld: Loaded, s: SamplingOptions) -> SamplingParams:
    kw: dict[str, Any] = dict(ld.defaults)
    for k in _DEFAULT_KEYS:
        v = getattr(s, k)
        if v is not None:
            kw[k] = v
    if s.max_tokens is not None:
        kw["max_tokens"] = s.max_tokens
    return SamplingParams(seed=s.seed, stop=tuple(s.stop), ignore_eos=s.ignore_eos, **kw)


def submit(ld: Loaded, ids: list[int], s: SamplingOptions) -> tuple[Any, bool]:
    """Returns (handle, queued). Raises QueueFull, or RequestRejected for a request the engine can never run."""
    st = ld.engine.stats()
    queued = st.lanes_busy >= st.lanes_total or st.queue_length > 0
    try:
        return ld.engine.submit(ids, params=_params(ld, s)), queued
    except QueueFull:
        raise
    except RequestError as e:
        raise RequestRejected(str(e), param=str(e).split(":", 1)[0] or None) from None


def max_tokens_of(handle: Any) -> int:
    return int(getattr(handle, "budget", 0) or 0)


def events(handle: Any) -> Any:
    """The engine's events as actor messages (blocking; runs on a pump thread)."""
    for ev in handle.stream():
        if isinstance(ev, TokenDelta):
            yield Delta(list(ev.token_ids), ev.text)
        elif isinstance(ev, Finish):
            if ev.text:
                yield Delta([], ev.text)
            if ev.reason == "error":
                yield Failed(
                    code="engine_error", message=ev.error or "the engine failed this request", status=500
                )
                return
            m = ev.metrics
            yield Finished(
                finish_reason=str(ev.reason),
                prompt_tokens=ev.usage.prompt_tokens,
                cached_tokens=ev.usage.cached_tokens,
                completion_tokens=ev.usage.completion_tokens,
                timings=Timings(
                    queue_s=m.queue_wait_s,
                    prefill_s=m.prefill_s,
                    decode_s=m.decode_s,
                    ttft_s=m.ttft_s,
                    total_s=m.queue_wait_s + m.prefill_s + m.decode_s,
                ),
            )
            return


def cancel(handle: Any) -> None:
    handle.cancel()


def engine_stats(ld: Loaded) -> dict[str, float]:
    import msgspec

    st = ld.engine.stats()
    out = {k: float(v) for k, v in msgspec.structs.asdict(st).items() if isinstance(v, int | float)}
    out["queue_len"] = out.get("queue_length", 0.0)
    return out


def engine_alive(ld: Loaded) -> tuple[bool, str]:
    try:
        ld.engine.stats()
    except Exception as e:
        return False, f"engine: {type(e).__name__}: {e}"
    return True, ""


def engine_info(ld: Loaded) -> ActorInfo:
    cfg = ld.engine.config
    return ActorInfo(
        model_id=ld.model_id,
        artifact=ld.spec.artifact,
        backend=ld.spec.backend,
        max_context=cfg.max_context,
        max_concurrency=cfg.max_concurrency,
        queue_depth=cfg.queue_depth,
        prefix_reuse=cfg.prefix_reuse,
        engine_config={k: v for k, v in ld.spec.engine.items()},
    )


def close(ld: Loaded) -> None:
    ld.engine.close()
