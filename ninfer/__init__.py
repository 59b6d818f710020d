"""ninfer: single-GPU inference for the Qwen3.6 / Qwen3.8 hybrid model family.

Public API: ``ninfer.load(path, backend=...)``, ``ninfer.open_engine(path, backend=..., **engine_settings)`` and,
once the engine is loaded, ``ninfer.Engine`` and ``ninfer.QueueFull``. Imports are lazy so that ``import ninfer`` stays cheap and free of side effects.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load", "open_engine", "Engine", "QueueFull", "__version__"]
__version__ = "0.1.0"


def load(path: Any, backend: str = "reference", **kwargs: Any) -> Any:
    """Open, check and load an artifact; see ``ninfer.model.load``."""
    from ninfer.model import load as _load

    return _load(path, backend=backend, **kwargs)  # type: ignore[arg-type]


def open_engine(path: Any, backend: str = "reference", **kwargs: Any) -> Any:
    """Load an artifact and start an engine over it; see ``ninfer.model.open_engine``."""
    from ninfer.model import open_engine as _open_engine

    return _open_engine(path, backend=backend, **kwargs)  # type: ignore[arg-type]


def __getattr__(name: str) -> Any:
    if name in ("Engine", "QueueFull"):
        import ninfer.engine as engine

        return getattr(engine, name)
    raise AttributeError(f"module 'ninfer' has no attribute {name!r}")
