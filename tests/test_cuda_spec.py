"""MTP speculative decoding on the CUDA runner (docs/speculative.md): greedy output with drafts is the CUDA
runner's output without them, at 1 and 8 lanes, k = 1..5, with the real MTP head and with scripted drafts that
force 100/80/50% acceptance (every rollback length); seeded sampled requests repeat; the MTP head's draft logits
match the reference's.

    python -m pytest -m gpu tests/test_cuda_spec.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

gpu = pytest.mark.gpu
PROMPTS = [[5, 9, 33, 100, 7, 12], [1, 2, 3], list(range(40, 75)), [200, 17], [8] * 20, [3, 1, 4, 1, 5, 9, 2, 6],
           list(range(100, 130)), [77]]  # fmt: skip


@pytest.fixture(scope="module", params=["demo", "tiny-moe"])
def cuda_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A Model on the CUDA backend whose artifact carries an MTP head (the demo model; a tiny converted MoE)."""
    pytest.importorskip("cupy")
    from ninfer.cuda.model import load_cuda
    from ninfer.model import load

    d = tmp_path_factory.mktemp(f"cuda-spec-{request.param}")
    if request.param == "demo":
        from ninfer.demo import build_demo

        path = build_demo(d / "demo.ninfer")
    else:
        from hf_tiny import save_tiny_hf

        from ninfer.convert.hf import convert

        save_tiny_hf(d / "hf", "moe", 5, mtp=True)
        path = str(d / "m.ninfer")
        convert(str(d / "hf"), path, "bf16", allow_unregistered_shape=True, progress=False)
    model = load(path)
    model.net = load_cuda(path, progress=False)
    model.backend = "cuda"
    return model, path


def _run(model: Any, lanes: int, wrap: Any = None, **kw: Any) -> list[Any]:
    from engines import engine_over

    from ninfer.engine import EngineConfig

    sampling = kw.pop("sampling", {})
    cfg = EngineConfig(max_context=256, kv_capacity=8192, max_concurrency=lanes, queue_depth=16, **kw)
    with engine_over(model, cfg, wrap) as eng:
        hs = [eng.submit(p, max_tokens=24, ignore_eos=True, **sampling) for p in PROMPTS]
        return [h.result(timeout=600) for h in hs]


@gpu
@pytest.mark.parametrize("lanes", [1, 8])
def test_cuda_spec_greedy_equals_no_spec(cuda_model: Any, lanes: int) -> None:
    cuda_model = cuda_model[0]
    plain = _run(cuda_model, lanes)
    for k in (1, 2, 3, 4, 5):
        spec = _run(cuda_model, lanes, spec="mtp", draft_tokens=k)
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain], f"k={k}"
        assert all(c.usage.speculative.rounds > 0 for c in spec)


@gpu
@pytest.mark.parametrize("pct", [100, 80, 50])
def test_cuda_forced_acceptance_equals_no_spec(cuda_model: Any, pct: int) -> None:
    cuda_model = cuda_model[0]
    from ninfer.engine.scripted_draft import ScriptedDrafts, replay_script

    plain = _run(cuda_model, 8)
    refs = {tuple(p): p + c.token_ids for p, c in zip(PROMPTS, plain, strict=True)}
    wrap = lambda r: ScriptedDrafts(r, replay_script(refs, pct, cuda_model.config.vocab_size))  # noqa: E731
    for k in (1, 3, 5):
        spec = _run(cuda_model, 8, wrap, spec="mtp", draft_tokens=k)
        assert [c.token_ids for c in spec] == [c.token_ids for c in plain], f"k={k} pct={pct}"
        acc = sum(c.usage.speculative.accepted for c in spec) / sum(c.usage.speculative.drafted for c in spec)
        assert acc == 1.0 if pct == 100 else 0.0 < acc < 1.0


@gpu
def test_cuda_spec_sampled_is_reproducible(cuda_model: Any) -> None:
    cuda_model = cuda_model[0]
    s = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 42}
    a = _run(cuda_model, 8, spec="mtp", draft_tokens=3, sampling=s)
    b = _run(cuda_model, 4, spec="mtp", draft_tokens=3, sampling=s)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


@gpu
def test_cuda_mtp_head_matches_reference(cuda_model: Any) -> None:
    """The device MTP head's draft logits against the reference network's, on the same prompt."""
    from ninfer.cuda.model import load_cuda
    from ninfer.cuda.spec import mtp_hidden
    from ninfer.model import load

    ref = load(cuda_model[1])
    prompt = PROMPTS[2]
    net = load_cuda(cuda_model[1], progress=False, prefill_gemm=False)  # its own pools
    net.allocate(num_slots=2, num_pages=64, page_size=16, max_context=512, extra_kv=1)
    h = net.run([(0, 0, len(prompt), list(range(32)))], np.asarray(prompt, np.int32))
    d = mtp_hidden(net, h[:-1], np.asarray(prompt[1:], np.int32), [(0, 0, len(prompt) - 1, list(range(32)))])
    got = net.lm_head(d[-1:])[0]
    rn = ref.net
    hr = rn.forward(prompt, rn.new_state())
    want = rn.mtp_forward(hr[:-1], prompt[1:], None, rn.new_mtp_state())[-1]
    assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 5e-2
