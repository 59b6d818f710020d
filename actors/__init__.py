"""The Ray engine actor and its clients (see docs/serving.md)."""

from .client import DEFAULT_ACTOR_NAME, AsyncEngineClient, EngineClient, GenerationError, Result, connect
from .messages import (
    Accepted,
    ActorInfo,
    ActorSpec,
    ActorStats,
    Delta,
    Failed,
    Finished,
    GenerateRequest,
    Health,
    SamplingOptions,
    StreamEvent,
    Timings,
)

__all__ = [
    "DEFAULT_ACTOR_NAME",
    "Accepted",
    "ActorInfo",
    "ActorSpec",
    "ActorStats",
    "AsyncEngineClient",
    "Delta",
    "EngineClient",
    "Failed",
    "Finished",
    "GenerateRequest",
    "GenerationError",
    "Health",
    "Result",
    "SamplingOptions",
    "StreamEvent",
    "Timings",
    "connect",
]
