"""The engine: lanes, bounded FIFO admission, chunked prefill, paged KV, prefix reuse with GDN checkpoints.

```python
eng = ninfer.open_engine(path, backend="reference", max_concurrency=4, queue_depth=8, prefix_reuse=True)
# or Engine.from_model(ninfer.load(path), max_concurrency=4, ...)
h = eng.submit(prompt_ids, max_tokens=16, temperature=0.0, seed=None, stop=None)   # raises QueueFull
c = h.result()          # c.token_ids, c.text, c.finish_reason, c.usage.{prompt,cached,completion}_tokens
for ev in h.stream(): ...   # TokenDelta ... then Finish
```
"""

from .config import EngineConfig, EngineConfigError
from .core import (
    Completion,
    EngineClosed,
    EngineError,
    EngineStats,
    Event,
    Finish,
    FinishReason,
    QueueFull,
    RequestError,
    RequestMetrics,
    SamplingParams,
    TokenDelta,
    TokenMask,
    Usage,
)
from .engine import Engine
from .handle import Handle, coalesce

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineConfigError",
    "Handle",
    "coalesce",
    "Completion",
    "EngineClosed",
    "EngineError",
    "EngineStats",
    "Event",
    "Finish",
    "FinishReason",
    "QueueFull",
    "RequestError",
    "RequestMetrics",
    "SamplingParams",
    "TokenDelta",
    "TokenMask",
    "Usage",
]
