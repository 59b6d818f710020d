"""The top SASS lines of an Nsight Compute source page (``ncu --page source --print-source sass --csv``) by one
metric column, default the excess shared-memory wavefronts (bank conflicts): which instructions of a kernel conflict.

    python -m perf.ncu_source wsp_source.csv --top 30
    python -m perf.ncu_source wsp_source.csv --column "Warp Stall Sampling (All Samples)"

The CSV may carry the profiled program's own output before its header: the header is the first line that names
the column (a case-insensitive substring of the header's name).
"""

from __future__ import annotations

import argparse
import csv
import io
from pathlib import Path

__all__ = ["top_lines", "main"]


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def top_lines(text: str, column: str, top: int) -> list[tuple[float, str, str]]:
    """(value, address, SASS) of the ``top`` lines with the largest ``column`` in the CSV ``text``."""
    lines = text.splitlines()
    key = column.lower()
    start = next((i for i, ln in enumerate(lines) if key in ln.lower() and "," in ln), None)
    if start is None:
        raise SystemExit(f"no header with a column like {column!r}")
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    head = [h.lower() for h in rows[0]]
    col = next(i for i, h in enumerate(head) if key in h)
    src = next((i for i, h in enumerate(head) if h in ("source", "sass")), None)
    adr = next((i for i, h in enumerate(head) if h.startswith("address")), None)
    out = []
    for r in rows[1:]:
        if len(r) <= col:
            continue
        v = _number(r[col])
        if v > 0:
            out.append((v, r[adr] if adr is not None else "", r[src] if src is not None else ""))
    return sorted(out, reverse=True)[:top]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m perf.ncu_source")
    ap.add_argument("csv", type=Path)
    ap.add_argument("--column", default="L1 Wavefronts Shared Excessive")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args(argv)
    found = top_lines(a.csv.read_text(errors="replace"), a.column, a.top)
    total = sum(v for v, _, _ in found)
    print(f"top {len(found)} lines by {a.column!r} (their sum {total:,.0f})")
    for v, adr, sass in found:
        print(f"{v:14,.0f}  {adr:>8s}  {sass}")


if __name__ == "__main__":
    main()
