"""Frontend: tokenizer, chat template and incremental detokenizer (HF tokenizers + jinja2, no torch)."""

from .chat_template import ChatTemplate, TemplateError, parse_tool_call_arguments
from .tokenizer import IncrementalDetokenizer, Tokenizer, TokenizerError

__all__ = [
    "ChatTemplate",
    "IncrementalDetokenizer",
    "TemplateError",
    "Tokenizer",
    "TokenizerError",
    "parse_tool_call_arguments",
]
