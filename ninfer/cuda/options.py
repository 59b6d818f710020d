"""The CUDA backend's precision and memory options, in one table for every place that takes them: ``ninfer serve``
(api/cli.py's flags, api/config.py's ServerConfig fields and checks, api/server.py's backend options) and
``ninfer-perf`` (perf/cli.py), so that a default, a choice or a help text is written once.

Each option is a ServerConfig field and an ``argparse`` destination of the same name, and a keyword of
``CudaQwen36`` (``backend``: the name there). docs/cuda.md gives each choice's measured cost. Pure Python: importing
this module touches no GPU (the choices are checked against the kernel families' own tables in
tests/test_api_units.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CudaOption", "CUDA_OPTIONS", "DEFAULTS", "add_arguments", "check", "backend_options"]


@dataclass(frozen=True)
class CudaOption:
    name: str  # ServerConfig field and argparse destination
    default: str
    choices: tuple[str, ...]
    help: str
    backend: str = ""  # CudaQwen36's keyword, where it is not ``name``

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def keyword(self) -> str:
        return self.backend or self.name


CUDA_OPTIONS: tuple[CudaOption, ...] = (
    CudaOption(
        "activations",
        "fp32",
        ("fp32", "bf16"),
        "CUDA activation dtype; bf16 prefills faster but rounds what the model computes",
        backend="act_dtype",
    ),
    CudaOption(
        "prefill_inputs",
        "fp16",
        ("exact", "fp16"),
        "CUDA prefill GEMM inputs (fp32 activations): exact (two MMAs) or fp16 (rounded per row, one MMA)",
    ),
    CudaOption(
        "prefill_attention",
        "bf16",
        ("exact", "p-bf16", "bf16"),
        "CUDA prefill attention operands: exact (float q and probabilities as bf16 pairs), p-bf16 (probabilities "
        "rounded to bf16) or bf16 (q too); docs/cuda.md gives the measured cost",
    ),
    CudaOption(
        "prefill_gdn",
        "exact",
        ("exact", "bf16"),
        "CUDA chunked GDN prefill: exact (a float scratch) or bf16 (the normed q, k and the chunk products W, A "
        "stored as bf16 for the state pass: half its reads); docs/cuda.md gives the measured cost",
    ),
    CudaOption(
        "prefill_weights",
        "auto",
        ("auto", "resident", "scratch"),
        "CUDA fp16-mode prefill: keep each weight's fp16 operand on the device instead of converting it per chunk: "
        "auto (in the memory the plan leaves spare), resident (all, or refuse to start), scratch (none)",
    ),
)

DEFAULTS: Mapping[str, str] = {o.name: o.default for o in CUDA_OPTIONS}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per option (``--prefill-gdn``, ...), its default and choices as served."""
    for o in CUDA_OPTIONS:
        parser.add_argument(o.flag, default=o.default, choices=o.choices, help=o.help)


def _listed(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1]


def check(values: Any, error: type[Exception]) -> None:
    """Raise ``error`` naming the flag when an option of ``values`` (attributes of the options' names) is not one of
    its choices."""
    for o in CUDA_OPTIONS:
        v = getattr(values, o.name)
        if v not in o.choices:
            raise error(f"{o.flag}: {_listed(o.choices)}, got {v!r}")


def backend_options(values: Any) -> dict[str, str]:
    """The options of ``values`` as CudaQwen36's keyword arguments."""
    return {o.keyword: getattr(values, o.name) for o in CUDA_OPTIONS}
