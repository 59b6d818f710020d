"""NumPy fp32 reference backend of the Qwen3.6 family: ``ops`` (one function per kernel) and ``Qwen36``."""

from ninfer.reference.kv import ContiguousKV, GdnSnapshot, KVCache, SequenceState
from ninfer.reference.qwen36 import Qwen36, text_positions
from ninfer.reference.weights import CachedWeights, DictWeights, WeightError, WeightSource, expected_shapes

__all__ = [
    "Qwen36",
    "SequenceState",
    "GdnSnapshot",
    "KVCache",
    "ContiguousKV",
    "WeightSource",
    "DictWeights",
    "CachedWeights",
    "WeightError",
    "expected_shapes",
    "text_positions",
]
