"""Where the next turn of a chat will part from this prompt: positions that get reserved checkpoints.

Agents re-render history. In the Qwen chat format (``<|im_start|>role\\n ... <|im_end|>``) two rewrites are common:
- within one user query (tool loop), the previous assistant turn keeps its thinking but its tool call is
  re-rendered: the next prompt parts after this prompt's end (the end-of-prompt checkpoint covers it);
- after a new user message, every assistant turn since the previous user query loses its thinking: the next
  prompt parts right after the first of those turns' ``<|im_start|>assistant\\n``.
So besides the end of the prompt, a prompt gets a checkpoint at the start of the first assistant turn after the
last real user query (a ``user`` turn that is not a tool response); in the first turn after a query that is the
generation prompt. It is reserved with the sequence's latest turn, and later turns of the same tool loop keep it
reserved while they reuse it. Callers that know better pass explicit positions
(``Engine.submit(..., checkpoint_at=...)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["TurnMarker"]


class TurnMarker:
    def __init__(
        self, start: int, user: Sequence[int], assistant: Sequence[int], tool: Sequence[int]
    ) -> None:
        self.start = start  # the turn-start token id
        self.user, self.assistant, self.tool = list(user), list(assistant), list(tool)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TurnMarker | None:
        """The Qwen chat-format markers in ``tokenizer``'s ids; None when it has no ``<|im_start|>``."""
        token_to_id = getattr(tokenizer, "token_to_id", None)
        start = token_to_id("<|im_start|>") if token_to_id is not None else None
        if start is None:
            return None
        enc = tokenizer.encode
        return cls(
            start,
            enc("<|im_start|>user\n"),
            enc("<|im_start|>assistant\n"),
            enc("<|im_start|>user\n<tool_response>"),
        )

    def marks(self, prompt: Sequence[int]) -> tuple[int, ...]:
        """Positions (0 < q < len(prompt)) where the next turn's prompt parts from this one: right after the
        ``<|im_start|>assistant\n`` of the turn described in the module docstring (before any other turn start)."""
        starts = np.flatnonzero(np.asarray(prompt, dtype=np.int64) == self.start).tolist()
        if not starts:
            return ()

        def at(i: int, seq: list[int]) -> bool:
            return list(prompt[i : i + len(seq)]) == seq

        query = next((i for i in reversed(starts) if at(i, self.user) and not at(i, self.tool)), None)
        first = None
        if query is not None:
            first = next((i for i in starts if i > query and at(i, self.assistant)), None)
        q = starts[-1] if first is None else first
        if at(q, self.assistant):  # the re-render keeps "<|im_start|>assistant\n" and parts right after it
            q += len(self.assistant)
        return (q,) if 0 < q < len(prompt) else ()
