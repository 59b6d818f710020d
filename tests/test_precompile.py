"""``ninfer.cuda.precompile``'s job (CPU): a variant's text is the family's with the prefix before it, the text a
caller that patches ``loader.source_text`` the same way (tests/test_cuda_gemv_xlane.py's ``xlane`` fixture) loads,
so that the caller's load is a hit in CuPy's disk cache. The compile itself needs a GPU (its tests are the GPU
ones that call it)."""

from __future__ import annotations

from typing import Any

import pytest

import ninfer.cuda as nc
from ninfer.cuda import loader


def test_variant_job_compiles_the_prefixed_text(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, tuple[str, ...]]] = []

    def fake_load(source: str, names: tuple[str, ...]) -> Any:
        seen.append((loader.source_text(source), names))
        return None

    original = loader.source_text
    monkeypatch.setattr(loader, "load_module", fake_load)
    monkeypatch.setattr(loader, "source_text", original)  # restored after the job replaces it
    names = ("gemv_mma<FragQG64<4>, float, 1>",)
    assert nc._compile_variant(("#define GV_GROUP_DEFER 1\n", "gemv.cu", names)) == "gemv.cu"
    monkeypatch.setattr(loader, "source_text", original)
    assert nc._compile_variant(("", "gemv.cu", names)) == "gemv.cu"
    want = "#define GV_GROUP_DEFER 1\n" + original("gemv.cu")
    assert seen == [(want, names), (original("gemv.cu"), names)]


def test_precompile_without_jobs_or_gpu_returns() -> None:
    nc.precompile([], 4)  # nothing to do
    # no GPU here: the subprocess's compile fails, which precompile leaves to the caller's own load
    nc.precompile([("", "no_such_family.cu", ("k",))], 1)
