"""perf/pytest_shard.py: the shards of a selection are disjoint, cover it, and follow the mark deselection."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

_TESTS = """
import pytest

@pytest.mark.parametrize("i", range(7))
def test_gpu(i):
    pass

@pytest.mark.parametrize("i", range(5))
@pytest.mark.gpu
def test_marked(i):
    pass
"""


def _ids(pytester: pytest.Pytester, *args: str) -> list[str]:
    pytester.makeini("[pytest]\nmarkers =\n    gpu: marked\n")
    pytester.makepyfile(test_shard_sample=_TESTS)
    res = pytester.runpytest("-p", "perf.pytest_shard", "--collect-only", "-q", *args)
    return [line for line in res.outlines if "::" in line]


def test_shards_partition_the_selection(pytester: pytest.Pytester) -> None:
    everything = _ids(pytester)
    assert len(everything) == 12
    shards = [_ids(pytester, "--shard", f"{i}/3") for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(everything)
    assert [len(s) for s in shards] == [4, 4, 4]
    assert shards[1] == everything[1::3]


def test_shards_follow_the_mark_selection(pytester: pytest.Pytester) -> None:
    marked = _ids(pytester, "-m", "gpu")
    assert len(marked) == 5 and all("test_marked" in t for t in marked)
    assert _ids(pytester, "-m", "gpu", "--shard", "0/2") == marked[0::2]
    assert _ids(pytester, "-m", "gpu", "--shard", "1/2") == marked[1::2]


@pytest.mark.parametrize("spec", ["3/3", "x/2", "1", "-1/2"])
def test_bad_shard_is_a_usage_error(pytester: pytest.Pytester, spec: str) -> None:
    pytester.makepyfile(test_one="def test_a():\n    pass\n")
    res = pytester.runpytest("-p", "perf.pytest_shard", "--shard", spec)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "--shard" in "\n".join(res.errlines)
