"""Shared test configuration: GPU tests (marked ``gpu``) skip cleanly where no CUDA device is usable."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "no GPU here"
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (cupy device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
