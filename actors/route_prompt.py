"""The block hashes of a request's rendered prompt, computed where the router runs (docs/replicas.md).

The router renders a chat request with the artifact's own chat template and tokenizer, exactly as a replica will
(``template.render_ids`` with the request's tools and template variables, generation prompt on), and hashes the
ids as replicas hash their retained prefixes (ninfer/engine/prefix_digest.py). Anything that fails here (a
template error, a prompt the replica will refuse) routes without a key: the replica gives the real error.
"""

from __future__ import annotations

from typing import Any

from ninfer.engine.prefix_digest import chain_hashes

from .messages import GenerateRequest

__all__ = ["PromptBlocks"]


class PromptBlocks:
    """``blocks(req)``: the chained block hashes of ``req``'s rendered prompt. Slow for a long prompt (it
    tokenizes): call it off the event loop. ``max_chars`` skips rendering a prompt no replica would take."""

    def __init__(self, template: Any | None, block_tokens: int, max_chars: int = 1 << 26) -> None:
        self.template, self.block, self.max_chars = template, block_tokens, max_chars

    @classmethod
    def from_artifact(cls, path: str, block_tokens: int, max_context: int) -> PromptBlocks:
        """The artifact's chat template over its tokenizer (resources only: no weights are read)."""
        from ninfer.artifact import open_artifact  # noqa: PLC0415 - only the router needs the artifact
        from ninfer.frontend import ChatTemplate, Tokenizer  # noqa: PLC0415

        art = open_artifact(path, verify="manifest")
        raw, cfg, src = (
            art.resource("tokenizer"),
            art.resource("tokenizer_config"),
            art.resource("chat_template"),
        )
        template = None
        if raw is not None and src is not None:
            import json  # noqa: PLC0415

            tok = Tokenizer.from_json_bytes(raw, json.loads(cfg) if cfg else None)
            template = ChatTemplate(src.decode("utf-8"), tok)
        return cls(template, block_tokens, max_chars=16 * max_context)

    def size(self, req: GenerateRequest) -> int:
        """The prompt's size in tokens or message characters: what rendering and hashing it costs."""
        if req.prompt_ids is not None:
            return len(req.prompt_ids)
        return sum(len(str(m.get("content", ""))) for m in req.messages or ()) + len(str(req.tools or ""))

    def __call__(self, req: GenerateRequest) -> list[int]:
        if req.prompt_ids is not None:
            return chain_hashes(req.prompt_ids, self.block)
        if self.template is None or self.size(req) > self.max_chars:
            return []
        try:
            ids = self.template.render_ids(
                list(req.messages or ()),
                tools=list(req.tools) if req.tools else None,
                add_generation_prompt=True,
                **req.template_kwargs,
            )
        except Exception:  # the replica renders it again and answers with the real error
            return []
        return chain_hashes(ids, self.block)
