"""Load-time compilation of the ``cuda_src/*.cu`` kernel families through CuPy (NVRTC).

One ``cupy.RawModule`` per (source file, template instances), cached by ``functools.cache``; the architecture
comes from the current device (``-arch=sm_90`` on the H200), except for families in :data:`ARCH_SPECIFIC`, which
use the architecture-specific target (``sm_90a``: wgmma, setmaxnreg) on the devices it names. Local ``#include "x.cuh"`` lines are inlined before
compiling so that CuPy's on-disk cache, keyed on the source text, sees edits to the shared headers. Every family
module lists all of its instances (``SOURCES``), and :func:`warmup` compiles them all up front so that nothing
compiles in the middle of a request.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

__all__ = [
    "ARCH_SPECIFIC",
    "CUDA_SRC",
    "SOURCE_PACKAGE",
    "KernelError",
    "source_text",
    "load_module",
    "kernel",
    "intercept",
    "looked_up",
    "compute_capability",
    "family_supported",
    "target_arch",
]

# The sources are the package data of ``ninfer.cuda_src`` (pyproject maps it to the repository's cuda_src/), found
# through importlib.resources so that editable installs and wheels read the same files. A checkout used without
# installing (the repository root on PYTHONPATH, as on the GPU test machine) has no such package: there the
# sources are the repository's cuda_src/ beside ninfer/.
SOURCE_PACKAGE = "ninfer.cuda_src"


def _sources_root() -> Traversable:
    try:
        return resources.files(SOURCE_PACKAGE)
    except ModuleNotFoundError:
        return resources.files("ninfer").joinpath("..", "cuda_src")


# A real directory for every install that is not zipped (nvcc -I in the host tests).
CUDA_SRC = Path(str(_sources_root())).resolve()
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)
OPTIONS = ("-std=c++17",)
# family -> {compute capability: architecture-specific target}. CuPy appends its own ``-arch=sm_<cc>`` after these
# options; NVRTC given ``-arch=sm_90a -arch=sm_90`` compiles for sm_90a (checked with NVRTC 13.0: the cubin's SASS
# is "code for sm_90a" and wgmma assembles, while ``-arch=sm_90`` alone rejects it).
ARCH_SPECIFIC: dict[str, dict[str, str]] = {
    "gemm_sm90.cu": {"90": "90a"},
    "gemm_sm90_ws.cu": {"90": "90a"},
    "attention_wg.cu": {"90": "90a"},
    "attention_ws.cu": {"90": "90a"},
    "gdn_chunk.cu": {"90": "90a"},  # setmaxnreg in the warp-specialized state pass (gdn_state_wsp.cuh)
}


class KernelError(ValueError):
    """A kernel wrapper was called with arrays of the wrong shape, dtype or layout."""


def source_text(name: str) -> str:
    """The source of ``cuda_src/<name>`` with its local includes inlined (each header once)."""
    seen: set[str] = set()
    root = _sources_root()

    def expand(fname: str) -> str:
        path = root.joinpath(fname)
        if not path.is_file():
            raise FileNotFoundError(f"CUDA source {fname} is not in the {SOURCE_PACKAGE} package ({root})")

        def sub(m: re.Match[str]) -> str:
            inc = m.group(1)
            if inc in seen:
                return ""
            seen.add(inc)
            return f"// ---- {inc} ----\n{expand(inc)}\n// ---- end {inc} ----"

        return _INCLUDE.sub(sub, path.read_text(encoding="utf-8")).replace("#pragma once", "")

    return expand(name)


def compute_capability() -> str:
    """Compute capability of the current CuPy device as digits, e.g. ``"90"``."""
    import cupy

    return str(cupy.cuda.Device().compute_capability)


def family_supported(source: str, cc: str) -> bool:
    """Whether family ``source`` compiles for compute capability ``cc`` (architecture-specific families only for
    the capabilities :data:`ARCH_SPECIFIC` names)."""
    return source not in ARCH_SPECIFIC or cc in ARCH_SPECIFIC[source]


def target_arch(source: str, cc: str) -> str:
    """The ``-arch=sm_<...>`` digits for family ``source`` on a device of compute capability ``cc``."""
    return ARCH_SPECIFIC.get(source, {}).get(cc, cc)


@functools.cache
def load_module(source: str, name_expressions: tuple[str, ...]) -> Any:
    """Compile ``cuda_src/<source>`` for the current device with the given template instances (cached)."""
    import cupy

    code = source_text(source)
    mod = cupy.RawModule(
        code=code,
        options=(*OPTIONS, f"-arch=sm_{target_arch(source, compute_capability())}"),
        name_expressions=list(name_expressions),
    )
    mod.compile()
    return mod


# (source, name) -> (the instances tuple it was looked up with, its function): RawModule.get_function costs ~3 us a
# call, and an eager 27B prefill chunk looks up ~1,150 kernels (perf/profile_host.py). Keyed without the instances:
# a family's instance tuple (gemm_sm90.cu's has ~80 names) hashes on every lookup, twice (load_module's cache and
# this one), while the callers pass the same tuple object every time, so a hit compares it by identity (another
# tuple, even an equal one, takes the full path). Valid while load_module's modules are: its cache_clear (as
# perf/gemv_variants.py does to swap sources) drops these too.
_FUNCTIONS: dict[tuple[str, str], tuple[tuple[str, ...], Any]] = {}


# While :func:`intercept` runs: what :func:`kernel` hands out passes through this (perf/launch_spans.py times every
# launch so); None otherwise (one global test per lookup). The caches above never hold what it returns.
_HOOK: Callable[[str, str, Any], Any] | None = None


def kernel(source: str, instances: tuple[str, ...], name: str) -> Any:
    """The compiled kernel ``name`` (one of ``instances``) of family ``source``, for the launch at hand: callers look
    it up again for each launch (a hit is one dict lookup) and keep no reference beyond it, so that
    :func:`intercept` sees every launch of every family."""
    hit = _FUNCTIONS.get((source, name))
    if hit is not None and hit[0] is instances:
        return hit[1] if _HOOK is None else _HOOK(source, name, hit[1])
    mod = load_module(source, instances)
    if name not in instances:
        raise KernelError(f"{source}: no kernel instance {name!r} (known: {', '.join(instances)})")
    fn = mod.get_function(name)
    _FUNCTIONS[source, name] = (instances, fn)
    return fn if _HOOK is None else _HOOK(source, name, fn)


@contextlib.contextmanager
def intercept(wrap: Callable[[str, str, Any], Any]) -> Iterator[None]:
    """While active, :func:`kernel` returns ``wrap(source, name, function)`` in place of the function; its caches
    keep the function itself, and :func:`kernel` hands out plain functions again once it ends. One at a time."""
    global _HOOK
    if _HOOK is not None:
        raise RuntimeError("loader.intercept: already intercepting")
    _HOOK = wrap
    try:
        yield
    finally:
        _HOOK = None


def looked_up() -> dict[tuple[str, str], Any]:
    """(source, name) -> function of every kernel :func:`kernel` has looked up since the caches were last cleared."""
    return {key: fn for key, (_, fn) in _FUNCTIONS.items()}


_clear_modules = load_module.cache_clear


def _clear_all() -> None:
    """``load_module.cache_clear``: the compiled modules and the functions :func:`kernel` looked up in them."""
    _clear_modules()
    _FUNCTIONS.clear()


load_module.cache_clear = _clear_all  # type: ignore[method-assign]
