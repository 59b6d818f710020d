"""MTP speculative decoding on synthetic real-shape artifacts (27B, 35B-A3B; random weights with an MTP head).

    python -m perf.bench_spec [--models 27b 35b] [--lanes 1 8] [--ks 1 2 3 4 5] [--spec-path snapshot|replay]
                              [--sync-calls] [--skip-rounds] [--out DIR]

Random weights give near-zero real acceptance, so this measures the machinery:

- ``rounds``: at each lane count, one decode step (the captured graph) against one speculative round at
  k = 1..5, split into drafting (k MTP steps and their samples, step by step; its first step apart), the verify
  forward (k+1 positions per lane) and its verification, and the commit of a half-accepted round (a snapshot copy,
  or the GDN replay with ``--spec-path replay``); then the same rounds drafted by ``draft_chain`` (one host
  synchronization, ``draft_chain_ms`` and ``round_chain_ms``; the first chained round untimed, its draft time
  ``draft_chain_first_ms``). Every verify and draft graph of the lane count is captured before anything is timed
  (``capture_spec_graphs``); ``per_round`` counts the verify forwards and draft steps by graph or eagerly.
- ``forced``: engine tokens/s with a draft source that replays the target's own greedy tokens (100% acceptance)
  or makes every position wrong where ``(pos*37) % 100 >= pct`` (80%, 50%), against the engine without drafts,
  and the tokens per round (after the spec graphs' capture and an untimed warm-up request on every lane;
  ``timed_captures`` counts graph captures in the timed run, 0 expected). ``tok_s`` is end to end (from the submit:
  the prompt's prefill and first token included, ``prefill_ms``), ``decode_tok_s`` from the step that gave every
  lane its first token (the rate the issue's 2x is about; ``decode_speedup``). Each decode step's or round's wall
  time is split into the runner's calls (``calls_ms``, ``calls_per_step``) and the rest (``other_ms``: the engine's
  own host work); the prefill phase's calls apart (``prefill_calls_ms``). ``--sync-calls`` runs them again with
  the device synchronized before (``presync``) and after each call, so each call's time is its own work: without
  it a call's time is what the engine waits for in it (a verify-only ``execute`` only launches; its forward is
  waited for in ``verify``).

Prints the tables and writes ``bench_spec.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

MODELS = {"27b": "qwen3.6-27b", "35b": "qwen3.6-35b-a3b"}


def _sync() -> None:
    import cupy

    cupy.cuda.Device().synchronize()


def build(key: str, profile: str, activations: str) -> tuple[Any, Any]:
    from ninfer.artifact.registry import MODELS as REG
    from ninfer.cuda.model import CudaQwen36

    from .synthetic import synthetic_tensors

    mc = REG[MODELS[key]].config
    net = CudaQwen36(mc, synthetic_tensors(mc, profile, mtp=True), act_dtype=activations)
    net.warmup()
    return mc, net


SNAPSHOTS = {
    "snapshot": True,
    "replay": False,
}  # --spec-path: the CUDA runner's GDN rollback (docs/speculative.md)
_PATH = {"snapshots": True}


def _runner(net: Any, mc: Any, lanes: int, k: int, context: int) -> tuple[Any, Any]:
    from ninfer.cuda.runner import CudaModelRunner
    from ninfer.engine import EngineConfig

    spec = dict(spec="mtp", draft_tokens=k) if k else {}
    cfg = EngineConfig(max_concurrency=lanes, max_context=context + 256, kv_capacity=lanes * (context + 288),
                       prefix_reuse=False, prefill_chunk=1024, **spec)  # fmt: skip
    return CudaModelRunner(net, mc, cfg, spec_snapshots=_PATH["snapshots"]), cfg


def bench_rounds(
    net: Any, mc: Any, lanes: int, ks: list[int], context: int, reps: int
) -> list[dict[str, Any]]:
    """Decode step vs speculative round costs at ``lanes`` lanes sitting at ``context``."""
    from ninfer.engine.core import Batch, DraftLane, LaneSetup, LaneWork, SampleRequest, SamplingParams

    greedy = SamplingParams(max_tokens=1 << 20, temperature=0.0)
    out = []
    runner, cfg = _runner(net, mc, lanes, max(ks), context)
    per = cfg.pages_for(context + 256)
    rng = np.random.default_rng(0)
    toks = [list(rng.integers(0, mc.vocab_size, context + 1)) for _ in range(lanes)]
    setups = [
        LaneSetup(lane, list(range(lane * per, (lane + 1) * per)), None, 0, None) for lane in range(lanes)
    ]
    runner.execute(Batch(setups=setups, work=[LaneWork(lane, 0, toks[lane][:context], True, True, None)
                                              for lane in range(lanes)]))  # fmt: skip
    pos = context
    seq = [t[:context] for t in toks]  # the computed tokens of each lane; t[-1] is fed next, every time
    nxt = [t[-1] for t in toks]

    def reqs(n: int) -> list[SampleRequest]:
        return [SampleRequest(greedy, 0, pos + i, {}, None) for i in range(n)]

    def decode_step() -> None:
        nonlocal pos
        runner.execute(
            Batch(work=[LaneWork(lane, pos, [nxt[lane]], False, True, None) for lane in range(lanes)])
        )
        runner.sample(range(lanes), reqs(1) * lanes, None)
        for lane in range(lanes):
            seq[lane].append(nxt[lane])
        pos += 1

    decode_step()  # graph capture
    # every verify and draft-step graph of this lane count now: a round's first draft step covers the rows kept
    # by the previous round, a shape the untimed round below does not reach (it follows the decode steps); a
    # capture in the timed rounds (~1 per 10 rounds before) is a one-time cost, not a round's
    runner.capture_spec_graphs(lanes)
    _sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        decode_step()
    _sync()
    step_ms = (time.perf_counter() - t0) / reps * 1e3
    out.append(
        {"lanes": lanes, "k": 0, "round_ms": step_ms, "draft_ms": 0.0, "verify_ms": step_ms, "commit_ms": 0.0}
    )

    def spec_round(k: int, chain: bool = False) -> dict[str, float]:
        """One round; ``chain``: drafted by ``draft_chain`` (one synchronization) instead of the step loop."""
        nonlocal pos
        seqs = [seq[lane] + [nxt[lane]] for lane in range(lanes)]
        drafts: list[list[int]] = [[] for _ in range(lanes)]
        _sync()
        t = [time.perf_counter()]
        if chain:
            got = runner.draft_chain(
                [DraftLane(lane, seqs[lane]) for lane in range(lanes)], [reqs(k)] * lanes, None
            )
            drafts = [[max(d, 0) for d in g] for g in got]
            t.append(t[0])
        for _ in range(0 if chain else k):
            runner.draft([DraftLane(lane, seqs[lane] + drafts[lane]) for lane in range(lanes)])
            for lane, d in enumerate(runner.sample(range(lanes), reqs(1) * lanes, None)):
                drafts[lane].append(max(d, 0))
            t.append(time.perf_counter())  # each step ends synchronized (its sample)
        _sync()
        t1 = time.perf_counter()
        work = [LaneWork(lane, pos, [seqs[lane][-1], *drafts[lane]], False, False, None, verify=True)
                for lane in range(lanes)]  # fmt: skip
        runner.execute(Batch(work=work))  # a verify-only step is left running: synchronized here
        _sync()
        t1f = time.perf_counter()
        runner.verify(list(range(lanes)), drafts, [reqs(k + 1)] * lanes, None)
        _sync()
        t2 = time.perf_counter()
        keep = 1 + k // 2  # a half-accepted round: the GDN replay runs
        for lane in range(lanes):
            runner.commit(lane, pos + keep)
            seq[lane] += ([nxt[lane]] + drafts[lane])[:keep]
        _sync()
        t3 = time.perf_counter()
        pos += keep
        return {"draft": t1 - t[0], "verify": t2 - t1, "commit": t3 - t2, "draft_first": t[1] - t[0],
                "verify_forward": t1f - t1, "verify_sample": t2 - t1f}  # fmt: skip

    for k in ks:
        tot: dict[str, float] = {}
        spec_round(k)  # untimed, like the decode step's (the graphs are captured above)
        counts0 = dict(runner.spec_counts)
        for _ in range(reps):
            for name, dt in spec_round(k).items():
                tot[name] = tot.get(name, 0.0) + dt
        # untimed too: the first chained round of k >= 2 is the first to feed a sampled id on the device (its own
        # CuPy kernels, built by capture_spec_graphs now; before, their compile fell in the timed rounds: cedd073's
        # 12.3 ms draft_chain_ms at k = 3); its time is reported apart
        first_chain = spec_round(k, chain=True)["draft"]
        chained = 0.0
        for _ in range(reps):  # the same rounds drafted by draft_chain
            r = spec_round(k, chain=True)
            chained += r["draft"] + r["verify"] + r["commit"]
            tot["draft_chain"] = tot.get("draft_chain", 0.0) + r["draft"]
        row = {f"{n}_ms": v / reps * 1e3 for n, v in tot.items()}
        row.update(lanes=lanes, k=k, round_ms=row["draft_ms"] + row["verify_ms"] + row["commit_ms"])
        row["round_vs_step"] = row["round_ms"] / step_ms
        row["round_chain_ms"] = chained / reps * 1e3
        row["round_chain_vs_step"] = row["round_chain_ms"] / step_ms
        row["draft_chain_first_ms"] = first_chain * 1e3
        # per timed round (step-by-step and chained): verify forwards and draft steps by graph replay or eagerly
        row["per_round"] = {
            n: (v - counts0.get(n, 0)) / (2 * reps + 1) for n, v in runner.spec_counts.items()
        }
        out.append(row)
    return out


class _Timed:
    """A pass-through runner adding up the wall time and the number of its calls while ``on``, by phase: ``prefill``
    until every lane has its first token (the prompt's forward, bucketed as the call ``prefill``, and the first
    sample), then ``decode`` (the rounds). ``sync``: the device is synchronized before each call (that wait, the
    work launched earlier, goes to ``presync``, outside every call) and after it (inside it), so each call's time is
    its own launches and device work; otherwise (the default) a call's time is what the engine waits for in it."""

    CALLS = ("execute", "draft", "draft_chain", "sample", "verify", "commit")

    def __init__(self, inner: Any, sync: bool = False) -> None:
        self.inner, self.on, self.sync, self.phase = inner, False, sync, "prefill"
        self.ms: dict[str, dict[str, float]] = {"prefill": {}, "decode": {}}
        self.n: dict[str, dict[str, int]] = {"prefill": {}, "decode": {}}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self.CALLS:
            return attr

        def timed(*a: Any, **kw: Any) -> Any:
            key = name
            if name == "execute" and any(w.prefill for w in a[0].work):
                key = "prefill"
            if self.on and self.sync:
                t = time.perf_counter()
                _sync()
                self._add("presync", time.perf_counter() - t, 0)
            t0 = time.perf_counter()
            try:
                out = attr(*a, **kw)
                if self.on and self.sync:
                    _sync()
                return out
            finally:
                if self.on:
                    self._add(key, time.perf_counter() - t0, 1)

        return timed

    def _add(self, key: str, dt: float, n: int) -> None:
        ms, cnt = self.ms[self.phase], self.n[self.phase]
        ms[key] = ms.get(key, 0.0) + dt * 1e3
        cnt[key] = cnt.get(key, 0) + n


def bench_forced(
    net: Any, mc: Any, lanes: int, k: int, pcts: list[int], tokens: int, sync_calls: bool = False
) -> list[dict[str, Any]]:
    """Engine tokens/s without drafts and with replayed drafts at each acceptance percentage: end to end (from the
    submit, the prompt's prefill included) and in decode (from the step that gave every lane its first token)."""
    from ninfer.engine import Engine
    from ninfer.engine.core import TokenDelta
    from ninfer.engine.scripted_draft import ScriptedDrafts, replay_script

    rng = np.random.default_rng(1)
    prompts = [list(map(int, rng.integers(0, mc.vocab_size, 64))) for _ in range(lanes)]

    def run(kk: int, wrap: Any = None) -> tuple[list[Any], dict[str, Any]]:
        inner, cfg = _runner(net, mc, lanes, kk, 64 + tokens)
        # every verify (k+1 down to 2 positions) and draft-step graph of this lane count, before the timed run: a
        # round that keeps fewer tokens, or is cut short at the budget, replays a shape the warm-up request may
        # not reach, and its capture (an eager forward and the capture, tens of ms on the 27B) is a one-time cost
        inner.capture_spec_graphs(lanes)
        timed = _Timed(inner, sync_calls)
        runner = wrap(timed) if wrap is not None else timed
        first: set[int] = set()
        t_first = [0.0]

        def on_event(ev: Any) -> None:  # the engine thread, inside the step that emits it
            if timed.on and isinstance(ev, TokenDelta) and ev.token_ids and ev.request_id not in first:
                first.add(ev.request_id)
                if len(first) == lanes:  # every lane decodes from the next step on
                    timed.phase, t_first[0] = "decode", time.perf_counter()

        with Engine(runner, mc, None, cfg, token_limit=mc.vocab_size) as eng:
            for h in [eng.submit(p, max_tokens=8, ignore_eos=True) for p in prompts]:  # warm-up at every lane
                h.result()
            captured, counts = inner.spec_graph_captures, inner.spec_counts
            timed.on = True
            t0 = time.perf_counter()
            hs = [eng.submit(p, max_tokens=tokens, ignore_eos=True, on_event=on_event) for p in prompts]
            res = [h.result() for h in hs]
            t1 = time.perf_counter()
            timed.on = False
        spec = {n: v - counts.get(n, 0) for n, v in inner.spec_counts.items()}
        # 0 expected: nothing captured while timed
        meta = {"dt": t1 - t0, "prefill_s": t_first[0] - t0, "decode_s": t1 - t_first[0], "timed": timed,
                "timed_captures": inner.spec_graph_captures - captured, "spec": spec}  # fmt: skip
        return res, meta

    def split(steps: int, meta: dict[str, Any]) -> dict[str, Any]:
        """Per decode step (round): wall ms, ms and calls of each runner call, the rest (the engine's own work);
        and the prefill phase's wall ms and calls (the prompt's forward, the first token's sample) apart."""
        t = meta["timed"]
        ms, n = t.ms["decode"], t.n["decode"]
        per = {c: v / steps for c, v in ms.items() if v}
        step_ms = meta["decode_s"] * 1e3 / steps
        return {
            "step_ms": step_ms,
            "calls_ms": per,
            "calls_per_step": {c: v / steps for c, v in n.items() if v},
            "other_ms": step_ms - sum(per.values()),
            "prefill_ms": meta["prefill_s"] * 1e3,
            "prefill_calls_ms": dict(t.ms["prefill"]),
            "spec_per_round": {c: v / steps for c, v in meta["spec"].items()},
        }

    base, meta = run(0)
    e2e, dec = lanes * tokens / meta["dt"], lanes * (tokens - 1) / meta["decode_s"]
    rows = [{"lanes": lanes, "k": 0, "accept_pct": None, "tok_s": e2e, "decode_tok_s": dec, "tokens_per_round": 1.0,
             "sync_calls": sync_calls, **split(tokens - 1, meta)}]  # fmt: skip
    refs = {tuple(p): p + c.token_ids for p, c in zip(prompts, base, strict=True)}
    for pct in pcts:
        res, meta = run(k, lambda r, pct=pct: ScriptedDrafts(r, replay_script(refs, pct, mc.vocab_size)))
        same = all(a.token_ids == b.token_ids for a, b in zip(base, res, strict=True))
        sp = [c.usage.speculative for c in res]
        rounds, acc, drafted = (sum(getattr(s, f) for s in sp) for f in ("rounds", "accepted", "drafted"))
        tok_s, dec_s = lanes * tokens / meta["dt"], lanes * (tokens - 1) / meta["decode_s"]
        rows.append({"lanes": lanes, "k": k, "accept_pct": pct, "tok_s": tok_s, "decode_tok_s": dec_s,
                     "speedup": tok_s / e2e, "decode_speedup": dec_s / dec,
                     "acceptance": acc / max(drafted, 1), "tokens_per_round": 1 + acc / max(rounds, 1),
                     "same_tokens": same, "timed_captures": meta["timed_captures"], "sync_calls": sync_calls,
                     **split(max(rounds // lanes, 1), meta)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["27b", "35b"], choices=list(MODELS))
    ap.add_argument("--profile", default="nvfp4")
    ap.add_argument("--activations", default="bf16", choices=("fp32", "bf16"))
    ap.add_argument("--lanes", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--forced-k", type=int, default=3)
    ap.add_argument("--forced-tokens", type=int, default=128)
    ap.add_argument("--pcts", nargs="+", type=int, default=[100, 80, 50])
    ap.add_argument("--spec-path", default="snapshot", choices=list(SNAPSHOTS),
                    help="GDN rollback: snapshots + graphed drafts (default) or the earlier replay path")  # fmt: skip
    ap.add_argument("--sync-calls", action="store_true",
                    help="the forced runs again with the device synchronized before and after each timed runner "
                    "call, so each call's time is its own launches and device work (their wall time includes the "
                    "extra synchronizations)")  # fmt: skip
    ap.add_argument("--skip-rounds", action="store_true", help="the forced runs only")
    ap.add_argument("--out", default="perf/results/bench_spec")
    a = ap.parse_args(argv)
    _PATH["snapshots"] = SNAPSHOTS[a.spec_path]
    os.makedirs(a.out, exist_ok=True)
    result: dict[str, Any] = {"args": vars(a), "models": {}}
    for key in a.models:
        mc, net = build(key, a.profile, a.activations)
        res: dict[str, Any] = {"rounds": [], "forced": []}
        for lanes in a.lanes:
            if not a.skip_rounds:
                res["rounds"] += bench_rounds(net, mc, lanes, a.ks, a.context, a.reps)
            for sync in (False, True) if a.sync_calls else (False,):
                res["forced"] += bench_forced(net, mc, lanes, a.forced_k, a.pcts, a.forced_tokens, sync)
        result["models"][key] = res
        print(
            f"\n{key} ({a.profile}, {a.activations} activations, {a.spec_path}): round cost vs one decode step"
        )
        print(f"{'lanes':>5} {'k':>2} {'draft ms':>9} {'1st step':>9} {'chained':>8} {'verify ms':>10} {'forward':>8} "
              f"{'sample':>7} {'commit ms':>10} {'round ms':>9} {'x step':>7} {'chained':>8} {'1st chain':>10}")  # fmt: skip
        for r in res["rounds"]:
            print(f"{r['lanes']:>5} {r['k']:>2} {r['draft_ms']:>9.2f} {r.get('draft_first_ms', 0.0):>9.2f} "
                  f"{r.get('draft_chain_ms', 0.0):>8.2f} {r['verify_ms']:>10.2f} "
                  f"{r.get('verify_forward_ms', r['verify_ms']):>8.2f} {r.get('verify_sample_ms', 0.0):>7.2f} "
                  f"{r['commit_ms']:>10.2f} {r['round_ms']:>9.2f} {r.get('round_vs_step', 1.0):>7.2f} "
                  f"{r.get('round_chain_vs_step', 1.0):>8.2f} {r.get('draft_chain_first_ms', 0.0):>10.2f}  "
                  f"{' '.join(f'{n} {v:.2f}' for n, v in r.get('per_round', {}).items() if v)}")  # fmt: skip
        print(
            f"\n{key}: tokens/s at forced acceptance (k={a.forced_k}): end to end (prefill included) and in decode"
        )
        print(f"{'lanes':>5} {'accept%':>8} {'tok/s':>9} {'speedup':>8} {'dec tok/s':>10} {'dec x':>6} "
              f"{'tok/round':>10} {'same':>5} {'captures':>9} {'prefill ms':>11}")  # fmt: skip
        for r in res["forced"]:
            print(f"{'s' if r['sync_calls'] else ''}{r['lanes']:>5} {str(r['accept_pct'] or '-'):>8} {r['tok_s']:>9.1f} {r.get('speedup', 1.0):>8.2f} "
                  f"{r['decode_tok_s']:>10.1f} {r.get('decode_speedup', 1.0):>6.2f} {r['tokens_per_round']:>10.2f} "
                  f"{str(r.get('same_tokens', '-')):>5} {str(r.get('timed_captures', '-')):>9} "
                  f"{r['prefill_ms']:>11.1f}")  # fmt: skip
        print(
            f"\n{key}: decode wall ms per step (k=0) or round: the runner's calls and the rest (s: synchronized "
            "before and after each call, presync: the wait before a call for work launched earlier)"
        )
        for r in res["forced"]:
            c = " ".join(f"{n} {v:.2f}" for n, v in r["calls_ms"].items())
            n = " ".join(f"{n} {v:.2f}" for n, v in r["calls_per_step"].items())
            g = " ".join(f"{n} {v:.2f}" for n, v in r["spec_per_round"].items() if v)
            print(f"{'s' if r['sync_calls'] else ''}{r['lanes']:>5} {str(r['accept_pct'] or '-'):>8} {r['step_ms']:>7.2f} = {c} + other "
                  f"{r['other_ms']:.2f}  [calls: {n}] [{g or 'no spec'}]")  # fmt: skip
        del net
    path = os.path.join(a.out, "bench_spec.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
