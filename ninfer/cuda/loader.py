"""Load-time compilation of the ``cuda_src/*.cu`` kernel families through CuPy (NVRTC).

One ``cupy.RawModule`` per (source file, template instances), cached by ``functools.cache``; the architecture
comes from the current device (``-arch=sm_90`` on the H200). Local ``#include "x.cuh"`` lines are inlined before
compiling so that CuPy's on-disk cache, keyed on the source text, sees edits to the shared headers. Every family
module lists all of its instances (``SOURCES``), and :func:`warmup` compiles them all up front so that nothing
compiles in the middle of a request.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

__all__ = [
    "CUDA_SRC",
    "SOURCE_PACKAGE",
    "KernelError",
    "source_text",
    "load_module",
    "kernel",
    "compute_capability",
]

# The sources are the package data of ``ninfer.cuda_src`` (pyproject maps it to the repository's cuda_src/), found
# through importlib.resources so that editable installs, wheels and the device checkout all read the same files.
SOURCE_PACKAGE = "ninfer.cuda_src"
# A real directory for every install that is not zipped (nvcc -I in the host tests).
CUDA_SRC = Path(str(resources.files(SOURCE_PACKAGE)))
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)
OPTIONS = ("-std=c++17",)


class KernelError(ValueError):
    """A kernel wrapper was called with arrays of the wrong shape, dtype or layout."""


def source_text(name: str) -> str:
    """The source of ``cuda_src/<name>`` with its local includes inlined (each header once)."""
    seen: set[str] = set()
    root: Traversable = resources.files(SOURCE_PACKAGE)

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


@functools.cache
def load_module(source: str, name_expressions: tuple[str, ...]) -> Any:
    """Compile ``cuda_src/<source>`` for the current device with the given template instances (cached)."""
    import cupy

    code = source_text(source)
    mod = cupy.RawModule(
        code=code,
        options=(*OPTIONS, f"-arch=sm_{compute_capability()}"),
        name_expressions=list(name_expressions),
    )
    mod.compile()
    return mod


def kernel(source: str, instances: tuple[str, ...], name: str) -> Any:
    """The compiled kernel ``name`` (one of ``instances``) of family ``source``."""
    if name not in instances:
        raise KernelError(f"{source}: no kernel instance {name!r} (known: {', '.join(instances)})")
    return load_module(source, instances).get_function(name)
