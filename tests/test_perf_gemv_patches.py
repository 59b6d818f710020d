"""The decode GEMV experiments patch gemv.cu's text (perf/gemv_variants.py's source variants, perf/gemv_trace.py's
timer stamps): each patch must still find what it replaces, or the experiment measures the unpatched kernel (or
stops) on the GPU. CPU only: the patched texts are built, not compiled."""

from __future__ import annotations

from ninfer.cuda.loader import source_text

# the variants that change the kernel's source (the others change the launch plan)
SOURCE_VARIANTS = (
    "chunk4", "chunk4n", "static", "nomul", "olddq", "mulhi", "nodq", "fence", "nored", "nocl", "nowait", "pfend",
    "pf8", "occ5", "stages3", "actl1", "bulk", "bulkef",
    "defer",
)  # fmt: skip


def test_every_source_variant_changes_the_kernel() -> None:
    from perf.gemv_variants import _source

    base = source_text("gemv.cu")
    for v in SOURCE_VARIANTS:
        assert _source(source_text, v)("gemv.cu") != base, f"variant {v} patches nothing"
    assert _source(source_text, "base")("gemv.cu") == base


def test_the_trace_stamps_every_point_once() -> None:
    from perf.gemv_trace import _TRACE, _traced

    s = _traced(source_text)("gemv.cu")  # stops (SystemExit) if a pattern is not in the source exactly once
    assert len(_TRACE) == 8
    for i in range(6):
        assert s.count(f"const unsigned long long tr{i} = gv_now();") == 1
    assert (
        s.count("trbar += gv_now() - trb;") == 1 and s.count("gv_trbar[(") == 2
    )  # the barrier time, kept, read
    assert _traced(source_text)("norm.cu") == source_text("norm.cu")
