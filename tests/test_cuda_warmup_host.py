"""``ninfer.cuda.warmup`` on the host (no GPU): which families go to compile subprocesses and when none do."""

from __future__ import annotations

import concurrent.futures
import functools
from typing import Any

import pytest

import ninfer.cuda as nc
from ninfer.cuda import loader


class _Pool:
    """Stands for the ProcessPoolExecutor: records the families it is asked to compile, runs nothing."""

    used: list[str] = []

    def __init__(self, workers: int, mp_context: Any = None) -> None:
        self.workers = workers

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def map(self, fn: Any, items: Any) -> list[str]:
        _Pool.used += [src for src, _ in items]
        return []


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[str, ...]]]:
    loads: list[tuple[str, tuple[str, ...]]] = []

    @functools.cache
    def load_module(source: str, instances: tuple[str, ...]) -> str:
        loads.append((source, instances))
        return source

    monkeypatch.setattr(loader, "compute_capability", lambda: "90")
    monkeypatch.setattr(loader, "load_module", load_module)
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _Pool)
    _Pool.used = []
    return loads


def test_a_cold_process_compiles_every_family_in_subprocesses_then_loads_them(fake: list) -> None:
    sources = {s: i for s, i in nc.all_sources().items() if loader.family_supported(s, "90")}
    done = nc.warmup(workers=4)
    assert sorted(_Pool.used) == sorted(sources)
    assert done == {s: len(i) for s, i in sources.items()}
    assert [s for s, _ in fake] == list(sources)  # then loaded here, once each


def test_a_warm_process_skips_the_subprocesses(fake: list) -> None:
    nc.warmup(workers=4)
    _Pool.used = []
    nc.warmup(workers=4)  # every family is loaded in this process already: nothing to compile elsewhere
    assert _Pool.used == []
    nc.warmup(workers=1)
    assert _Pool.used == []


def test_one_worker_compiles_in_process(fake: list) -> None:
    nc.warmup(workers=1)
    assert _Pool.used == [] and fake


def test_a_failing_pool_falls_back_to_compiling_in_process(
    fake: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken(_Pool):
        def __init__(self, workers: int, mp_context: Any = None) -> None:
            raise OSError("no subprocesses here")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Broken)
    sources = {s: i for s, i in nc.all_sources().items() if loader.family_supported(s, "90")}
    assert nc.warmup(workers=4) == {s: len(i) for s, i in sources.items()}
    assert [s for s, _ in fake] == list(sources)


def test_compile_workers_is_bounded() -> None:
    assert 1 <= nc.compile_workers() <= 16
