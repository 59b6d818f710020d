"""CUDA backend: CuPy (NVRTC) loaders and checked wrappers for the kernel families in ``cuda_src/``.

Each family module declares ``SOURCES`` (source file -> every template instance it launches); :func:`warmup`
compiles them all up front (actor warm-up), so no kernel compiles in the middle of a request. Importing this
package does not touch the GPU.
"""

from __future__ import annotations

import importlib

__all__ = ["FAMILY_MODULES", "all_sources", "compile_workers", "precompile", "warmup"]

FAMILY_MODULES = (
    "ninfer.cuda.embedding",
    "ninfer.cuda.norm",
    "ninfer.cuda.activation",
    "ninfer.cuda.linear",
    "ninfer.cuda.gemm",
    "ninfer.cuda.gdn",
    "ninfer.cuda.attention",
    "ninfer.cuda.attention_prefill",
    "ninfer.cuda.router",
    "ninfer.cuda.moe_lanes",
    "ninfer.cuda.sampling",
    "ninfer.cuda.host_tier",
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


def _compile_one(item: tuple[str, tuple[str, ...]]) -> str:
    from ninfer.cuda.loader import load_module

    load_module(*item)
    return item[0]


def _compile_variant(job: tuple[str, str, tuple[str, ...]]) -> str:
    """One job of :func:`precompile`, in its subprocess: ``source`` with ``prefix`` before its text."""
    from ninfer.cuda import loader

    prefix, source, names = job
    if prefix:
        original = loader.source_text
        loader.source_text = lambda name: (prefix if name.endswith(".cu") else "") + original(name)  # type: ignore[assignment]
    loader.load_module(source, names)
    return source


def precompile(jobs: list[tuple[str, str, tuple[str, ...]]], workers: int) -> None:
    """Compile variants of kernel families into CuPy's on-disk cache side by side, in ``workers`` subprocesses:
    each job ``(prefix, source, instances)`` is ``source`` with the text ``prefix`` (e.g. ``#define`` lines) put
    before it, exactly as a caller that patches ``loader.source_text`` that way will load it then (tests and perf
    scripts that compare builds: NVRTC compiles one module at a time, ~10-60 s each). Best effort: a job that fails
    here is compiled, and its error raised, where it is loaded."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if not jobs:
        return
    try:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max(1, min(workers, len(jobs))), mp_context=ctx) as ex:
            list(ex.map(_compile_variant, jobs))
    except Exception:  # noqa: BLE001 - see the docstring
        pass


def compile_workers() -> int:
    """Subprocesses for a cold start's compile: one per core, at most 16 (a server compiles once per machine; the
    families then load from CuPy's on-disk cache in ~5 s)."""
    import os

    return max(1, min(16, os.cpu_count() or 1))


def warmup(workers: int = 1) -> dict[str, int]:
    """Compile every family for the current device (architecture-specific families only where they apply);
    returns instances per source.

    ``workers > 1`` first compiles the families in that many subprocesses (NVRTC is single-threaded per module;
    the results land in CuPy's on-disk kernel cache), then loads them here from the cache: a cold start in the time
    of the largest family instead of the sum of all of them (H200 host: 371 instances in 89 s with 12 workers; a
    server's first start compiled its families one by one, lazily, and was not ready after 120 s). A process that
    has loaded as many modules as there are families already skips the subprocesses (a test session warms many
    networks)."""
    from ninfer.cuda.loader import compute_capability, family_supported, load_module

    cc = compute_capability()
    sources = {src: inst for src, inst in all_sources().items() if family_supported(src, cc)}
    if workers > 1 and load_module.cache_info().currsize < len(sources):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        try:
            with ProcessPoolExecutor(
                min(workers, len(sources)), mp_context=multiprocessing.get_context("spawn")
            ) as ex:
                list(ex.map(_compile_one, sources.items()))
        except Exception:  # noqa: BLE001 - no subprocesses here (or one failed): the loop below compiles in
            pass  # this process, and a real compile error is raised there with its family named
    done = {}
    for src, inst in sources.items():
        load_module(src, inst)
        done[src] = len(inst)
    return done
