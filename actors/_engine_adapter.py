"""Every name the actor uses from the engine and the frontend, in one place.

The actor's requests (actors/messages.py) become engine requests here, and chat messages are rendered with the
artifact's template; the engine's events go back to the caller as they are. Request fields left unset take the
artifact's generation defaults (its ``generation_config`` resource), then the engine's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ninfer import model as models
from ninfer.artifact import open_artifact
from ninfer.engine.core import QueueFull, RequestError, SamplingParams
from ninfer.engine.handle import Handle
from ninfer.engine.prefix_digest import chain_hashes
from ninfer.frontend import ChatTemplate, TemplateError
from ninfer.frontend.chat_template import RESERVED_VARIABLES
from ninfer.frontend.grammar import GrammarCompiler, RequestGrammar, SchemaError
from ninfer.frontend.prompt import NORMALIZATION_SLACK, chars_over

from .messages import ActorInfo, ActorSpec, GenerateRequest, renders_quickly
from .routing import RouteState

__all__ = [
    "Loaded",
    "PromptError",
    "QueueFull",
    "RequestRejected",
    "open_engine",
    "prompt_ids",
    "renders_quickly",
    "count_prompt",
    "token_mask",
    "submit",
    "engine_stats",
    "engine_alive",
    "engine_info",
    "close",
    "chain_hashes",
    "count_prompt_ids",
    "route_state",
]

_DEFAULT_KEYS = models.SAMPLING_DEFAULT_KEYS  # the generation_config keys that are sampling defaults


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
    # the ids that end a generation: the tokenizer's and the model's end of sequence
    stop_ids: tuple[int, ...] = ()
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
    engine = models.open_engine(
        spec.artifact, spec.backend, config=spec.engine, backend_options=spec.backend_options
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
        stop_ids=tuple(sorted(set(tok.eos_token_ids) | set(engine.model_config.eos_token_ids))),
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


def count_prompt_ids(ld: Loaded, req: GenerateRequest) -> list[int]:
    """The prompt ``count_prompt`` counts (no context check beyond the size in characters)."""
    return _render_ids(ld, req)


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
    # the fewest characters that make max_context tokens (prompt.min_tokens); counting stops there, so refusing a
    # million messages costs what refusing one just past the bound does (counting them all took 2.2 s of Python)
    bound = ld.max_context * ld.tokenizer.max_token_chars * NORMALIZATION_SLACK
    if chars_over(bound - 1, req.messages, req.tools, req.template_kwargs):
        raise PromptError(
            f"the prompt has at least {bound} characters, at least {ld.max_context} tokens; this server's "
            f"context is {ld.max_context} tokens",
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
            raise PromptError(_client_text(str(e)), code=code, param="schema") from None
        except (ValueError, RuntimeError) as e:  # XGrammar's own refusals (e.g. an unsatisfiable schema)
            raise PromptError(_client_text(f"schema: {e}"), code="invalid_schema", param="schema") from None
    return RequestGrammar(
        compiled,
        vocab_size=ld.vocab_size,
        thinking=thinking,
        think_end_id=ld.think_end_id,
        after_think_ids=ld.after_think_ids,
        budget=budget,
        stop_ids=ld.stop_ids,
    )


# XGrammar's C++ log prefix, "[22:22:19] /project/cpp/json_schema_converter.cc:3562: ": a time and a build path
_XGR_PREFIX = re.compile(r"\[\d{1,2}:\d{2}:\d{2}\] \S+?:\d+: ")


def _client_text(message: str) -> str:
    """A refusal's message as the client sees it: XGrammar's log prefix (the time, a source path of its build)
    removed, first line only."""
    lines = _XGR_PREFIX.sub("", message).strip().splitlines()
    return lines[0] if lines else message


def _params(ld: Loaded, s: Any, stop_after: int | None = None) -> SamplingParams:
    """The engine's parameters: the request's set fields over the artifact's generation defaults (over the
    engine's own defaults)."""
    kw: dict[str, Any] = dict(ld.defaults)
    kw.update({k: v for k, v in msgspec.structs.asdict(s).items() if v is not None})
    for k in ("stop", "stop_token_ids"):
        if k in kw:
            kw[k] = tuple(kw[k])
    return SamplingParams(stop_after_token_id=stop_after, **kw)


def submit(
    ld: Loaded,
    ids: list[int],
    s: Any,
    on_event: Callable[[Any], None],
    mask: RequestGrammar | None = None,
    thinking: bool = False,
) -> Handle:
    """The engine's handle; ``handle.accepted`` carries the budget the engine clamped. ``on_event`` gets every
    engine event, on the engine's thread. With ``thinking`` the generation starts in the reasoning channel: stop
    strings apply after ``</think>`` and the reasoning tokens are counted up to it. Raises QueueFull, or
    RequestRejected for a request the engine can never run."""
    params = _params(ld, s, ld.think_end_id if thinking else None)
    try:
        return ld.engine.submit_params(ids, params, token_mask=mask, on_event=on_event)
    except RequestError as e:
        raise RequestRejected(str(e), param=str(e).split(":", 1)[0] or None) from None


def admitting(ld: Loaded) -> AbstractContextManager[Any]:
    """Held around several ``submit`` calls: the engine's next step admits them all (none starts alone)."""
    return ld.engine.admitting()


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
        engine_config=dataclasses.asdict(cfg),
        memory_plan=ld.engine.memory_plan(),
    )


def route_state(ld: Loaded, epoch: str, block_tokens: int, since: int) -> RouteState:
    """The engine's load and retained-prefix block hashes (None when still those of version ``since``)."""
    version, hashes = ld.engine.retained_blocks(block_tokens)
    st = ld.engine.stats()
    return RouteState(
        epoch=epoch,
        version=version,
        hashes=None if version == since else hashes,
        lanes_total=st.lanes_total,
        lanes_busy=st.lanes_busy,
        queue_len=st.queue_length,
        queue_depth=st.queue_depth,
    )


def close(ld: Loaded) -> None:
    ld.engine.close()
