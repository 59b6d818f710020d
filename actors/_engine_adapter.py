"""Every name the actor uses from the engine and the frontend, in one place.

The actor speaks its own messages (actors/messages.py); this module translates them to and from the engine's
(ninfer.engine) and renders chat messages with the artifact's template. Request fields left unset take the
artifact's generation defaults (its ``generation_config`` resource), then the engine's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ninfer.artifact import open_artifact
from ninfer.engine.core import Finish, QueueFull, RequestError, SamplingParams, TokenDelta
from ninfer.engine.engine import Engine
from ninfer.engine.grammar import GrammarCompiler, RequestGrammar, SchemaError
from ninfer.frontend import ChatTemplate, TemplateError
from ninfer.frontend.chat_template import RESERVED_VARIABLES
from ninfer.frontend.prompt import input_chars, min_tokens

from .messages import ActorInfo, ActorSpec, Delta, Failed, Finished, GenerateRequest, SamplingOptions, Timings

__all__ = [
    "Loaded",
    "PromptError",
    "QueueFull",
    "RequestRejected",
    "open_engine",
    "prompt_ids",
    "count_prompt",
    "token_mask",
    "submit",
    "convert",
    "cancel",
    "engine_stats",
    "engine_alive",
    "engine_info",
    "close",
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
    tokenizer: Any
    template: ChatTemplate | None
    model_id: str
    max_context: int
    defaults: dict[str, Any]
    spec: ActorSpec
    think_end_id: int | None = None
    after_think_ids: tuple[int, ...] = ()
    vocab_size: int = 0
    _grammar: GrammarCompiler | None = None
    _grammar_lock: threading.Lock = field(default_factory=threading.Lock)

    def grammar(self) -> GrammarCompiler:
        """The XGrammar compiler, built on first use (importing xgrammar costs seconds)."""
        with self._grammar_lock:
            if self._grammar is None:
                tok = self.tokenizer
                self._grammar = GrammarCompiler(tok.hf, self.vocab_size, tok.eos_token_ids)
            return self._grammar


def open_engine(spec: ActorSpec) -> Loaded:
    art = open_artifact(spec.artifact, verify="manifest")  # resources only; the engine holds the weights
    if not art.shape_registered and not spec.allow_unregistered_shape:
        raise ValueError(
            f"{spec.artifact}: the artifact's shape is not a registered {art.model_id} shape; "
            "serve it with --allow-unregistered-shape (ActorSpec.allow_unregistered_shape)"
        )
    engine = Engine.open(
        spec.artifact, backend=spec.backend, backend_options=spec.backend_options, **spec.engine
    )
    tok = engine.tokenizer
    if tok is None:
        raise ValueError(f"{spec.artifact}: the artifact has no tokenizer; the server needs one")
    src = art.resource("chat_template")
    template = ChatTemplate(src.decode("utf-8"), tok) if src else None
    gen_raw = art.resource("generation_config")
    gen = json.loads(gen_raw) if gen_raw else {}
    defaults = {k: gen[k] for k in _DEFAULT_KEYS if k in gen}
    return Loaded(
        think_end_id=tok.hf.token_to_id("</think>"),
        after_think_ids=tuple(tok.encode("\n\n", add_special_tokens=False)),
        vocab_size=engine.model_config.vocab_size,
        engine=engine,
        tokenizer=tok,
        template=template,
        model_id=spec.model_id or art.model_id,
        max_context=engine.config.max_context,
        defaults=defaults,
        spec=spec,
    )


def count_prompt(ld: Loaded, req: GenerateRequest) -> int:
    """Prompt tokens of ``req`` as rendered (nothing runs on the model). No context check, except that a request
    whose text alone is far over the context is refused before it is tokenized (as in ``prompt_ids``)."""
    return len(_render_ids(ld, req))


def prompt_ids(ld: Loaded, req: GenerateRequest) -> list[int]:
    """The request's prompt: checked against the context by its size in characters first (so an oversized body
    costs no tokenizing), then by its tokens. Slow for a long prompt: call it off the event loop."""
    ids = _render_ids(ld, req)
    if len(ids) >= ld.max_context:
        raise PromptError(
            f"the prompt has {len(ids)} tokens; this server's context is {ld.max_context} tokens",
            code="context_length_exceeded",
        )
    return ids


def _render_ids(ld: Loaded, req: GenerateRequest) -> list[int]:
    if req.prompt_ids is not None:
        ids = list(req.prompt_ids)
        if not ids:
            raise PromptError("prompt_ids: must be non-empty", param="prompt_ids")
        return ids
    if ld.template is None:
        raise PromptError("this artifact has no chat template; send prompt_ids", code="no_chat_template")
    clash = sorted(RESERVED_VARIABLES.intersection(req.template_kwargs))
    if clash:
        raise PromptError(
            f"chat_template_kwargs.{clash[0]}: the server sets this template variable from the request itself",
            param=f"chat_template_kwargs.{clash[0]}",
        )
    chars = input_chars(req.messages, req.tools, req.template_kwargs)
    least = min_tokens(chars, ld.tokenizer)
    if least >= ld.max_context:
        raise PromptError(
            f"the prompt has {chars} characters, at least {least} tokens; this server's context is "
            f"{ld.max_context} tokens",
            code="context_length_exceeded",
        )
    try:
        return ld.template.render_ids(
            list(req.messages or ()),
            tools=list(req.tools) if req.tools else None,
            add_generation_prompt=True,
            **req.template_kwargs,
        )
    except TemplateError as e:
        raise PromptError(f"messages: {e}", code="invalid_messages") from None
    except RecursionError:  # the API refuses deep JSON first; a Python job's request may still be one
        raise PromptError("messages: nested too deeply to render", code="nesting_too_deep") from None


def thinking_on(ld: Loaded, req: GenerateRequest) -> bool:
    """The generation prompt opened a think block: chat requests with thinking on (the template's default)."""
    return (
        req.messages is not None
        and req.template_kwargs.get("enable_thinking", True) is not False
        and (ld.think_end_id is not None)
    )


def token_mask(ld: Loaded, req: GenerateRequest) -> RequestGrammar | None:
    """The request's grammar hook (compiling, or taking from the cache, its grammar), or None when nothing
    constrains it. Raises PromptError (400) for a schema outside the subset or one XGrammar refuses."""
    thinking = thinking_on(ld, req)
    budget = req.thinking_budget if thinking else None
    g = req.grammar
    if g is None and budget is None:
        return None
    compiled = None
    if g is not None:
        try:
            if g.kind == "json_object":
                compiled = ld.grammar().json_object()
            elif g.kind == "json_schema":
                compiled = ld.grammar().json_schema(json.loads(g.schema))
            elif g.kind == "tool_calls":
                compiled = ld.grammar().tool_calls(list(req.tools or ()), g.tool_choice, g.parallel)
            else:
                raise PromptError(
                    f"grammar: unknown kind {g.kind!r}", code="invalid_grammar", param="grammar"
                )
        except SchemaError as e:
            code = "unsupported_schema_keyword" if e.keyword else "invalid_schema"
            raise PromptError(str(e), code=code, param="schema") from None
        except (ValueError, RuntimeError) as e:  # XGrammar's own refusals (e.g. an unsatisfiable schema)
            raise PromptError(f"schema: {e}", code="invalid_schema", param="schema") from None
    return RequestGrammar(
        compiled,
        vocab_size=ld.vocab_size,
        thinking=thinking,
        think_end_id=ld.think_end_id,
        after_think_ids=ld.after_think_ids,
        budget=budget,
    )


def _params(ld: Loaded, s: SamplingOptions, stop_after: int | None = None) -> SamplingParams:
    kw: dict[str, Any] = dict(ld.defaults)
    for k in _DEFAULT_KEYS:
        v = getattr(s, k)
        if v is not None:
            kw[k] = v
    if s.max_tokens is not None:
        kw["max_tokens"] = s.max_tokens
    return SamplingParams(
        seed=s.seed, stop=tuple(s.stop), ignore_eos=s.ignore_eos, stop_after_token_id=stop_after, **kw
    )


def submit(
    ld: Loaded,
    ids: list[int],
    s: SamplingOptions,
    on_event: Callable[[Any], None],
    mask: RequestGrammar | None = None,
    thinking: bool = False,
) -> tuple[Any, int, bool]:
    """Returns (handle, output budget, queued). ``on_event`` gets every engine event, on the engine's thread.
    With ``thinking`` the generation starts in the reasoning channel: stop strings apply after ``</think>``.
    Raises QueueFull, or RequestRejected for a request the engine can never run."""
    st = ld.engine.stats()
    queued = st.lanes_busy >= st.lanes_total or st.queue_length > 0
    params = _params(ld, s, ld.think_end_id if thinking else None)
    try:
        handle = ld.engine.submit_params(ids, params, token_mask=mask, on_event=on_event)
    except RequestError as e:
        raise RequestRejected(str(e), param=str(e).split(":", 1)[0] or None) from None
    return handle, min(params.max_tokens, ld.max_context - len(ids)), queued


def convert(ev: Any) -> list[Delta | Finished | Failed]:
    """One engine event as actor messages: a TokenDelta is a Delta; a Finish is its held-back text (if any)
    followed by Finished, or by Failed when the engine failed the request."""
    if isinstance(ev, TokenDelta):
        return [Delta(list(ev.token_ids), ev.text)]
    if not isinstance(ev, Finish):
        raise TypeError(f"unexpected engine event {type(ev).__name__}")
    out: list[Delta | Finished | Failed] = [Delta([], ev.text)] if ev.text else []
    if ev.reason == "error":
        out.append(
            Failed(code="engine_error", message=ev.error or "the engine failed this request", status=500)
        )
        return out
    m = ev.metrics
    timings = Timings(
        queue_s=m.queue_wait_s,
        prefill_s=m.prefill_s,
        decode_s=m.decode_s,
        ttft_s=m.ttft_s,
        total_s=m.queue_wait_s + m.prefill_s + m.decode_s,
    )
    u = ev.usage
    out.append(
        Finished(
            finish_reason=str(ev.reason),
            prompt_tokens=u.prompt_tokens,
            cached_tokens=u.cached_tokens,
            completion_tokens=u.completion_tokens,
            timings=timings,
            stop_string=ev.stop_string,
        )
    )
    return out


def cancel(handle: Any) -> None:
    handle.cancel()


def engine_stats(ld: Loaded) -> dict[str, float]:
    """The engine's EngineStats (every field a number) as a dict."""
    return {k: float(v) for k, v in msgspec.structs.asdict(ld.engine.stats()).items()}


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
        engine_config=dict(ld.spec.engine),
        memory_plan=ld.engine.memory_plan(),
    )


def close(ld: Loaded) -> None:
    ld.engine.close()
