"""CUDA backend: CuPy (NVRTC) loaders and checked wrappers for the kernel families in ``cuda_src/``.

Each family module declares ``SOURCES`` (source file -> every template instance it launches); :func:`warmup`
compiles them all up front (actor warm-up), so no kernel compiles in the middle of a request. Importing this
package does not touch the GPU.
"""

from __future__ import annotations

import importlib

__all__ = ["FAMILY_MODULES", "all_sources", "warmup"]

FAMILY_MODULES = (
    "ninfer.cuda.embedding",
    "ninfer.cuda.norm",
    "ninfer.cuda.activation",
    "ninfer.cuda.linear",
    "ninfer.cuda.gdn",
    "ninfer.cuda.attention",
    "ninfer.cuda.attention_prefill",
    "ninfer.cuda.router",
    "ninfer.cuda.sampling",
)


def all_sources() -> dict[str, tuple[str, ...]]:
    """Every cuda_src file with the template instances the wrappers use."""
    out: dict[str, tuple[str, ...]] = {}
    for name in FAMILY_MODULES:
        for src, inst in importlib.import_module(name).SOURCES.items():
            if src in out:
                raise RuntimeError(f"{src} is claimed by two family modules")
            out[src] = inst
    return out


def warmup() -> dict[str, int]:
    """Compile every family for the current device (architecture-specific families only where they apply);
    returns instances per source."""
    from ninfer.cuda.loader import compute_capability, family_supported, load_module

    done = {}
    cc = compute_capability()
    for src, inst in all_sources().items():
        if not family_supported(src, cc):
            continue
        load_module(src, inst)
        done[src] = len(inst)
    return done
