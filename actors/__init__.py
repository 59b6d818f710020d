"""The Ray engine actor and its clients (see docs/serving.md)."""

from .client import DEFAULT_ACTOR_NAME, AsyncEngineClient, EngineClient, GenerationError, Result, connect
from .messages import (
    Accepted,
    ActorInfo,
    ActorSpec,
    ActorStats,
    Failed,
    Finish,
    GenerateRequest,
    Health,
    SamplingOptions,
    StreamEvent,
    TokenDelta,
)
from .replicas import RoutedEngineClient, connect_replicas

__all__ = [
    "DEFAULT_ACTOR_NAME",
    "Accepted",
    "ActorInfo",
    "ActorSpec",
    "ActorStats",
    "AsyncEngineClient",
    "EngineClient",
    "Failed",
    "Finish",
    "GenerateRequest",
    "GenerationError",
    "Health",
    "Result",
    "SamplingOptions",
    "StreamEvent",
    "TokenDelta",
    "connect",
    "connect_replicas",
    "RoutedEngineClient",
]
