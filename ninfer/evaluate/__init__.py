"""Evaluation tooling: perplexity over a text (``ninfer perplexity``) and the corpus runner that replays request
fixtures against a live server and joins them with its request log (``ninfer bench-corpus``).

Everything here uses public entry points only: ``ninfer.load`` / ``Model.net`` for perplexity, HTTP and the
request-log JSONL for the corpus runner. Modules are imported lazily by the CLI.
"""

__all__: list[str] = []
