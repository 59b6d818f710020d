"""A pytest plugin that runs one shard of the collected tests, so that the GPU suite splits into device calls of
about equal length (each call is limited to 10 minutes; ``perf/device_run.sh shard``).

    python -m pytest -m gpu tests/test_cuda_*.py -p perf.pytest_shard --shard 1/3

keeps the tests at positions 1, 4, 7, ... of the selected ones (0-based, after the ``-m`` / ``-k`` deselection):
round robin over the collection order spreads every file's tests over all shards, so no shard holds one slow file.
"""

from __future__ import annotations

import pytest


def parse_shard(spec: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N``; anything else is a usage error."""
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard: expected I/N (e.g. 0/3), got {spec!r}") from None
    if not 0 <= i < n:
        raise pytest.UsageError(f"--shard: I must be in [0, N), got {spec!r}")
    return i, n


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", default=None, help="I/N: run every N-th selected test, starting at the I-th")


@pytest.hookimpl(trylast=True)  # after the mark and keyword deselection: shards of the tests that would run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.getoption("--shard")
    if not spec:
        return
    i, n = parse_shard(spec)
    dropped = [it for k, it in enumerate(items) if k % n != i]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = items[i::n]
