"""The corpus runner's report: one JSON document, a Markdown rendering and two PNG charts (matplotlib, Agg).

Token counts in the tables come from the server's log where the request was joined (the stream of an Anthropic
request carries no cached count), else from the stream. ``ok`` means: every request finished without an error,
every structural check passed, and — when a request log was given — every request was found in it with token
counts equal to what the stream reported.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from .charts import token_counts

if TYPE_CHECKING:
    from .runner import Record, RunOptions

__all__ = ["Report", "build_report", "token_counts"]


def _hit(r: Record) -> float | None:
    prompt, cached, _ = token_counts(r)
    return cached / prompt if prompt and cached is not None else None


@dataclass(frozen=True, slots=True)
class Report:
    data: dict[str, Any]
    markdown: str
    records: list[Record]

    @property
    def ok(self) -> bool:
        return bool(self.data["summary"]["ok"])

    def write(self, out: str | Path) -> list[Path]:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "report.json").write_text(json.dumps(self.data, indent=1) + "\n", encoding="utf-8")
        (d / "report.md").write_text(self.markdown, encoding="utf-8")
        from .charts import plot_cache_hits, plot_fixtures

        return [d / "report.json", d / "report.md", plot_fixtures(self.records, d / "ttft_decode.png"),
                plot_cache_hits(self.records, d / "cache_hits.png")]  # fmt: skip


def _summary(records: list[Record], joined: bool) -> dict[str, Any]:
    checks = [c for r in records for c in r.checks]
    s = {
        "requests": len(records),
        "failed_requests": sum(not r.ok for r in records),
        "checks": len(checks),
        "checks_passed": sum(c.passed for c in checks),
        "logged": sum(r.log is not None for r in records) if joined else None,
        "usage_mismatches": sum(r.usage_matches_log is False for r in records) if joined else None,
    }
    s["ok"] = (
        s["failed_requests"] == 0
        and s["checks_passed"] == s["checks"]
        and (not joined or (s["logged"] == len(records) and s["usage_mismatches"] == 0))
    )
    return s


def _sessions(records: list[Record]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        prompt, cached, _ = token_counts(r)
        out.setdefault(r.session, []).append(
            {
                "turn": r.turn,
                "repeat": r.repeat,
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "hit_ratio": _hit(r),
            }  # fmt: skip
        )
    return out


def build_report(
    opts: RunOptions, records: list[Record], starts: list[dict[str, Any]], *, started_unix: float
) -> Report:
    joined = opts.request_log is not None
    instances = {r.log.server_instance_id for r in records if r.log is not None}
    server = next((s for s in reversed(starts) if s.get("server_instance_id") in instances), None)
    data = {
        "artifact_type": "ninfer_bench_corpus_report",
        "schema_version": 1,
        "url": opts.url,
        "fixtures": opts.fixtures,
        "request_log": opts.request_log,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started_unix)),
        "concurrency": opts.concurrency,
        "repeat": opts.repeat,
        "seed": opts.seed,
        "server_start": {k: server.get(k) for k in ("server_instance_id", "server", "engine", "artifact")}
        if server
        else None,
        "summary": _summary(records, joined),
        "sessions": _sessions(records),
        "records": [msgspec.to_builtins(r) | {"ok": r.ok} for r in records],
    }
    return Report(data=data, markdown=_markdown(data, records, joined), records=records)


# ---- Markdown -------------------------------------------------------------------------------------------------
def _f(v: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if v is None else f"{v * scale:.{digits}f}"


def _i(v: int | None) -> str:
    return "–" if v is None else str(v)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    right = {
        i for i, h in enumerate(head) if h.endswith(("ms", "tok/s", "tokens", "prompt", "cached", "output"))
    }
    sep = ["---:" if i in right else "---" for i in range(len(head))]
    return ["| " + " | ".join(x) + " |" for x in [head, sep, *rows]] + [""]


def _markdown(data: dict[str, Any], records: list[Record], joined: bool) -> str:
    s, srv = data["summary"], data["server_start"]
    lines = [f"# ninfer bench-corpus: `{data['fixtures']}` against {data['url']}", ""]
    if srv:
        e = srv.get("engine") or {}
        model = (srv.get("server") or {}).get("public_model_id")
        lines.append(f"Server `{srv['server_instance_id']}`: model `{model}`, backend `{e.get('device')}`, "
                     f"{e.get('max_concurrency')} lanes, max context {e.get('max_context')}, "
                     f"prefix reuse {e.get('prefix_reuse')}.")  # fmt: skip
    lines += [f"Started {data['started']}; concurrency {data['concurrency']}, repeat {data['repeat']}, "
              f"seed {data['seed']}.", ""]  # fmt: skip
    logged = (
        f"{s['logged']}/{s['requests']} found in the request log, {s['usage_mismatches']} usage mismatches"
    )
    lines += [f"**{'OK' if s['ok'] else 'FAILED'}**: {s['requests'] - s['failed_requests']}/{s['requests']} "
              f"requests completed, {s['checks_passed']}/{s['checks']} checks passed, "
              + (logged if joined else "no request log joined") + ".", "", "## Requests", ""]  # fmt: skip
    rows = []
    for r in records:
        prompt, cached, out = token_counts(r)
        checks = " ".join(f"{c.kind}:{'✓' if c.passed else '✗'}" for c in r.checks) or "–"
        log = "–" if not joined else ("✓" if r.log and r.usage_matches_log else ("≠" if r.log else "missing"))
        rows.append([r.fixture, r.protocol, str(r.repeat), _f(r.ttft_s, 1e3), _f(r.decode_tok_s), _i(prompt),
                     _i(cached), _i(out), r.outcome.error or str(r.outcome.finish_reason), log, checks])  # fmt: skip
    lines += _table(["fixture", "protocol", "rep", "TTFT ms", "decode tok/s", "prompt", "cached", "output",
                     "finish", "log", "checks"], rows)  # fmt: skip
    lines += _session_table(data["sessions"])
    if joined:
        rows = [[r.fixture, str(r.repeat), str(r.log.request_id), _f(r.log.server_ttft_s, 1e3),
                 _f(r.log.queue_s, 1e3), _f(r.log.prefill_s, 1e3), _f(r.log.engine_ttft_s, 1e3),
                 _f(r.log.decode_s, 1e3), _i(r.log.lane), str(r.log.finish_reason)]
                for r in records if r.log is not None]  # fmt: skip
        lines += ["## Server timings (request log)", "",
                  "Server TTFT runs from the HTTP handler's start (prompt rendering and grammar compilation "
                  "included); engine TTFT from the engine's submit.", ""]  # fmt: skip
        lines += _table(["fixture", "rep", "log id", "server TTFT ms", "queue ms", "prefill ms", "engine TTFT ms",
                         "decode ms", "lane", "engine finish"], rows)  # fmt: skip
    failed = [[r.fixture, str(r.repeat), c.kind, c.detail] for r in records for c in r.checks if not c.passed]
    lines += ["## Failed checks", ""] + (_table(["fixture", "rep", "check", "why"], failed) if failed else
                                         ["None.", ""])  # fmt: skip
    return "\n".join(lines)


def _session_table(sessions: dict[str, list[dict[str, Any]]]) -> list[str]:
    multi = {k: v for k, v in sessions.items() if max(t["turn"] for t in v) > 1}
    if not multi:
        return []
    n = max(t["turn"] for v in multi.values() for t in v)
    rows = []
    for name, turns in multi.items():
        for rep in sorted({t["repeat"] for t in turns}):
            by_turn = {t["turn"]: t for t in turns if t["repeat"] == rep}
            cells = []
            for k in range(1, n + 1):
                t = by_turn.get(k)
                cells.append("–" if t is None or t["hit_ratio"] is None else
                             f"{t['cached_tokens']}/{t['prompt_tokens']} ({t['hit_ratio']:.0%})")  # fmt: skip
            rows.append([name, str(rep), *cells])
    head = ["session", "rep", *[f"turn {k}" for k in range(1, n + 1)]]
    return ["## Prefix reuse per session turn (cached/prompt tokens)", "", *_table(head, rows)]
