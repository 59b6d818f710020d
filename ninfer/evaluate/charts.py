"""PNG charts of a corpus run: TTFT and decode tok/s per fixture, prefix-cache hit ratio per session turn.

matplotlib is imported here only (Agg backend, no display), so the server and the CLI's other commands never load it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runner import Record

__all__ = ["plot_fixtures", "plot_cache_hits"]


def token_counts(r: Record) -> tuple[int | None, int | None, int | None]:
    """(prompt, cached, completion): the log's where joined, else the stream's."""
    o, j = r.outcome, r.log
    if j is not None and j.prompt_tokens is not None:
        return j.prompt_tokens, j.cached_tokens, j.completion_tokens
    return o.prompt_tokens, o.cached_tokens, o.completion_tokens


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _by_fixture(records: list[Record], value) -> tuple[list[str], list[float], list[float], list[float]]:  # type: ignore[no-untyped-def]
    """Fixture names in first-seen order with the mean, min and max of ``value`` over repetitions (0: none)."""
    names: list[str] = []
    seen: dict[str, list[float]] = {}
    for r in records:
        if r.fixture not in seen:
            names.append(r.fixture)
            seen[r.fixture] = []
        v = value(r)
        if v is not None:
            seen[r.fixture].append(v)
    mean = [sum(v) / len(v) if v else 0.0 for v in seen.values()]
    lo = [m - min(v) if v else 0.0 for m, v in zip(mean, seen.values(), strict=True)]
    hi = [max(v) - m if v else 0.0 for m, v in zip(mean, seen.values(), strict=True)]
    return names, mean, lo, hi


def plot_fixtures(records: list[Record], path: Path) -> Path:
    """Two horizontal bar charts, one bar per fixture (mean over repetitions, whiskers min..max)."""
    plt = _pyplot()
    names, ttft, tlo, thi = _by_fixture(records, lambda r: r.ttft_s * 1e3 if r.ttft_s is not None else None)
    _, rate, rlo, rhi = _by_fixture(records, lambda r: r.decode_tok_s)
    y = list(range(len(names)))
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.9 + 0.32 * len(names)), sharey=True)
    axes[0].barh(y, ttft, xerr=[tlo, thi], color="#4c72b0")
    axes[0].set(xlabel="TTFT (ms, client)", title="time to first output")
    axes[1].barh(y, rate, xerr=[rlo, rhi], color="#55a868")
    axes[1].set(xlabel="decode tok/s (client)", title="decode rate")
    axes[0].set_yticks(y, names, fontsize=8)
    axes[0].invert_yaxis()
    for ax in axes:
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_cache_hits(records: list[Record], path: Path) -> Path:
    """Cached/prompt tokens per turn, one line per multi-turn (session, repetition); single requests have no
    earlier turn to reuse and are left out."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    series: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for r in records:
        prompt, cached, _ = token_counts(r)
        if prompt and cached is not None:
            series.setdefault((r.session, r.repeat), []).append((r.turn, cached / prompt))
    series = {k: sorted(v) for k, v in series.items() if len(v) > 1}
    for (session, rep), pts in series.items():
        label = session if rep == 0 else f"{session} (rep {rep})"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    ax.set(xlabel="session turn", ylabel="cached / prompt tokens", ylim=(-0.02, 1.02), title="prefix reuse")
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no multi-turn session", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
