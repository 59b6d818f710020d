"""OpenAI Responses (serving.md §6): validation, translation to the engine request, response and SSE builders.

Nothing is stored: ``store`` is accepted and ignored, ``previous_response_id`` is a 400 (send the items instead).
Streamed items and the final ``response.completed`` carry the same ids (peers.md §2.13); every event has a
``sequence_number``; there is no ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from ninfer.actors.messages import Finished, GenerateRequest, SamplingOptions

from .errors import ApiError
from .protocol import (
    Output,
    OutputParser,
    check_tool,
    new_id,
    response_grammar,
    salvage_arguments,
    tool_grammar,
)

__all__ = [
    "ResponsesRequest",
    "parse_responses_request",
    "to_generate_request",
    "response_body",
    "ResponsesStream",
]


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None


_DECODER = msgspec.json.Decoder(ResponsesRequest)


def parse_responses_request(body: bytes, model_id: str) -> ResponsesRequest:
    try:
        req = _DECODER.decode(body)
    except msgspec.ValidationError as e:
        raise _bad(f"invalid request: {e}") from None
    except msgspec.DecodeError:
        raise _bad("request body is not valid JSON") from None
    if req.model != model_id:
        raise ApiError(404, f"The model '{req.model}' does not exist", param="model", code="model_not_found")
    if req.previous_response_id is not None:
        raise _bad(
            "previous_response_id: this server stores no responses; send the items", "previous_response_id"
        )
    if req.max_output_tokens is not None and req.max_output_tokens <= 0:
        raise _bad("max_output_tokens: must be > 0", "max_output_tokens")
    if not req.input:
        raise _bad("input: must be a non-empty string or array", "input")
    return req


def _content_text(c: Any, at: str) -> str:
    if isinstance(c, str):
        return c
    if not isinstance(c, list):
        raise _bad(f"{at}: must be a string or an array of parts", at)
    parts = []
    for j, p in enumerate(c):
        t = p.get("type") if isinstance(p, dict) else None
        if t in ("input_text", "output_text", "text") and isinstance(p.get("text"), str):
            parts.append(p["text"])
        elif t in ("input_image", "input_file"):
            raise _bad(f"{at}[{j}]: image and file input are not enabled on this server", f"{at}[{j}]",
                       "vision_disabled")  # fmt: skip
        else:
            raise _bad(f"{at}[{j}].type: unsupported part {t!r}", f"{at}[{j}].type", "modality_not_supported")
    return "\n".join(parts)


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*out, {"role": "user", "content": req.input}]
    reasoning: str | None = None
    for i, item in enumerate(req.input):
        at = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _bad(f"{at}.role: unsupported role {role!r}", f"{at}.role", "unsupported_role")
            m = {"role": "system" if role == "developer" else role,
                 "content": _content_text(item.get("content"), f"{at}.content")}  # fmt: skip
            if role == "assistant" and reasoning is not None:
                m["reasoning_content"], reasoning = reasoning, None
            if m["role"] == "system" and out and out[0]["role"] == "system":
                out[0]["content"] += "\n" + m["content"]
            elif m["role"] == "system" and out:
                out.insert(0, m)
            else:
                out.append(m)
        elif kind == "function_call":
            call = {"id": str(item.get("call_id", "")), "type": "function",
                    "function": {"name": str(item.get("name", "")),
                                 "arguments": salvage_arguments(item.get("arguments"))}}  # fmt: skip
            if (
                out
                and out[-1]["role"] == "assistant"
                and (out[-1].get("tool_calls") or not out[-1]["content"])
            ):
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                m = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning is not None:
                    m["reasoning_content"], reasoning = reasoning, None
                out.append(m)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content_text(output, f"{at}.output")
            out.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text})
        elif kind == "reasoning":
            texts = [c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict)]
            texts += [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict)]
            reasoning = "\n".join(t for t in texts if t)
        else:
            raise _bad(f"{at}.type: unsupported item {kind!r}", f"{at}.type")
    return out


def _tools(req: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    if not req.tools:
        if req.tool_choice not in (None, "none", "auto"):
            raise _bad("tool_choice: requires tools", "tool_choice")
        return None, None
    tools = []
    for i, t in enumerate(req.tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            raise _bad(f"tools[{i}].type: only function tools are supported", f"tools[{i}].type",
                       "tool_type_not_supported")  # fmt: skip
        fn = check_tool(t.get("name"), t.get("parameters"), f"tools[{i}]", 64, ApiError)
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        tools.append({"type": "function", "function": fn})
    tc = req.tool_choice
    choice = tc if tc in (None, "auto", "none", "required") else None
    if isinstance(tc, dict) and tc.get("type") == "function":
        choice = tc.get("name")
        if choice not in {t["function"]["name"] for t in tools}:
            raise _bad(f"tool_choice: no tool named {choice!r} in tools", "tool_choice.name")
        tools = [t for t in tools if t["function"]["name"] == choice]
    elif choice is None and tc is not None:
        raise _bad("tool_choice: must be none, auto, required or {type: function, name}", "tool_choice")
    if choice == "none":
        return None, None
    return tools, tool_grammar(tools, choice or "auto", "tools", ApiError, req.parallel_tool_calls is True)


def _format_grammar(text: dict[str, Any] | None) -> Any:
    fmt = (text or {}).get("format")
    if fmt is None or not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return response_grammar(fmt, "text.format")
    rf = {
        "type": "json_schema",
        "json_schema": {"name": fmt.get("name", "response"), "schema": fmt.get("schema")},
    }
    return response_grammar(rf, "text.format")


def to_generate_request(
    req: ResponsesRequest, request_id: str, client: str, defaults: dict[str, Any], max_tokens: int
) -> GenerateRequest:
    kwargs = dict(defaults)
    effort = (req.reasoning or {}).get("effort")
    if effort is not None:
        kwargs["enable_thinking"] = effort != "none"
    tools, grammar = _tools(req)
    if grammar is None:
        grammar = _format_grammar(req.text)
    sampling = SamplingOptions(max_tokens=req.max_output_tokens or max_tokens, temperature=req.temperature,
                               top_p=req.top_p)  # fmt: skip
    return GenerateRequest(request_id=request_id, messages=tuple(_messages(req)), template_kwargs=kwargs,
                           sampling=sampling, client=client, tools=tuple(tools) if tools else None,
                           grammar=grammar)  # fmt: skip


def _usage(fin: Finished) -> dict[str, Any]:
    return {"input_tokens": fin.prompt_tokens, "input_tokens_details": {"cached_tokens": fin.cached_tokens},
            "output_tokens": fin.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": fin.reasoning_tokens},
            "total_tokens": fin.prompt_tokens + fin.completion_tokens}  # fmt: skip


def _status(fin: Finished | None) -> tuple[str, Any]:
    if fin is None:
        return "in_progress", None
    if fin.finish_reason in ("output_limit", "context_capacity"):
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def _reasoning_item(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": rid, "type": "reasoning", "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}  # fmt: skip


def _message_item(mid: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def _call_item(fid: str, call_id: str, name: str, args: str, status: str = "completed") -> dict[str, Any]:
    return {"id": fid, "type": "function_call", "call_id": call_id, "name": name, "arguments": args,
            "status": status}  # fmt: skip


def response_body(
    rid: str, created: int, req: ResponsesRequest, output: list[dict[str, Any]], fin: Finished | None
) -> dict[str, Any]:
    status, incomplete = _status(fin)
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": req.model,
            "output": output, "error": None, "incomplete_details": incomplete, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": req.temperature, "top_p": req.top_p, "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [], "text": req.text or {"format": {"type": "text"}},
            "reasoning": req.reasoning, "metadata": req.metadata or {},
            "usage": _usage(fin) if fin is not None else None}  # fmt: skip


def output_items(out: Output) -> list[dict[str, Any]]:
    items = [_reasoning_item(new_id("rs_"), out.reasoning)] if out.reasoning else []
    if out.content or not out.calls:
        items.append(_message_item(new_id("msg_"), out.content))
    items += [_call_item(new_id("fc_"), new_id("call_"), n, a) for n, a in out.calls]
    return items


class ResponsesStream:
    """Events: response.created, response.in_progress, then per output item output_item.added, its deltas
    (reasoning_text / content_part + output_text / function_call_arguments), their .done events and
    output_item.done, and finally response.completed (or response.incomplete) with the same item ids."""

    def __init__(self, rid: str, created: int, req: ResponsesRequest, thinking: bool, tools: list | None):
        self.rid, self.created, self.req = rid, created, req
        self._parser = OutputParser(thinking, tools)
        self._seq = 0
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._acc = ""
        self.tool_calls = 0

    def _ev(self, kind: str, data: dict[str, Any]) -> bytes:
        body = msgspec.json.encode({"type": kind, "sequence_number": self._seq, **data})
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"

    def start(self) -> bytes:
        r = response_body(self.rid, self.created, self.req, [], None)
        return self._ev("response.created", {"response": r}) + self._ev(
            "response.in_progress", {"response": r}
        )

    def _begin(self, item: dict[str, Any]) -> bytes:
        out = self._close()
        self._open, self._acc = item, ""
        idx = len(self.items)
        out += self._ev(
            "response.output_item.added", {"output_index": idx, "item": {**item, "status": "in_progress"}}
        )
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._ev("response.content_part.added", {"item_id": item["id"], "output_index": idx,
                                                            "content_index": 0, "part": part})  # fmt: skip
        return out

    def _close(self) -> bytes:
        item = self._open
        if item is None:
            return b""
        self._open, idx = None, len(self.items)
        ids = {"item_id": item["id"], "output_index": idx}
        kind, out = item["type"], b""
        if kind == "reasoning":
            item = _reasoning_item(item["id"], self._acc)
            out += self._ev("response.reasoning_text.done", {**ids, "content_index": 0, "text": self._acc})
        elif kind == "message":
            item = _message_item(item["id"], self._acc)
            out += self._ev(
                "response.output_text.done", {**ids, "content_index": 0, "text": self._acc, "logprobs": []}
            )
            out += self._ev(
                "response.content_part.done", {**ids, "content_index": 0, "part": item["content"][0]}
            )
        else:
            item = _call_item(item["id"], item["call_id"], item["name"], self._acc)
            out += self._ev("response.function_call_arguments.done", {**ids, "name": item["name"],
                                                                       "arguments": self._acc})  # fmt: skip
        self.items.append(item)
        return out + self._ev("response.output_item.done", {"output_index": idx, "item": item})

    def _delta(self, kind: str, piece: str) -> bytes:
        self._acc += piece
        ids = {"item_id": self._open["id"], "output_index": len(self.items)}  # type: ignore[index]
        if kind == "message":
            return self._ev(
                "response.output_text.delta", {**ids, "content_index": 0, "delta": piece, "logprobs": []}
            )
        if kind == "reasoning":
            return self._ev("response.reasoning_text.delta", {**ids, "content_index": 0, "delta": piece})
        return self._ev("response.function_call_arguments.delta", {**ids, "delta": piece})

    def text(self, text: str) -> bytes:
        return self._events(self._parser.push(text))

    def _events(self, events: list[tuple]) -> bytes:
        out = b""
        for ev in events:
            kind = ev[0]
            open_type = self._open["type"] if self._open else None
            if kind == "reasoning":
                if open_type != "reasoning":
                    out += self._begin(_reasoning_item(new_id("rs_"), "", "in_progress"))
                out += self._delta("reasoning", ev[1])
            elif kind == "text":
                if open_type != "message":
                    out += self._begin(_message_item(new_id("msg_"), "", "in_progress"))
                out += self._delta("message", ev[1])
            elif kind == "start":
                self.tool_calls += 1
                out += self._begin(_call_item(new_id("fc_"), new_id("call_"), ev[2], "", "in_progress"))
            elif kind == "args":
                out += self._delta("function_call", ev[2])
            elif kind == "end":
                out += self._close()
        return out

    def finish(self, fin: Finished) -> bytes:
        out = self._events(self._parser.finish()) + self._close()
        if not any(i["type"] != "reasoning" for i in self.items):
            out += self._begin(_message_item(new_id("msg_"), "", "in_progress")) + self._close()
        body = response_body(self.rid, self.created, self.req, self.items, fin)
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return out + self._ev(kind, {"response": body})

    def error(self, err: ApiError) -> bytes:
        body = response_body(self.rid, self.created, self.req, self.items, None)
        body["status"], body["error"] = "failed", {"code": err.code or "server_error", "message": err.message}
        return self._ev("response.failed", {"response": body})
