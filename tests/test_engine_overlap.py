"""Grammar masks are computed while the model step runs; stop strings can be armed after a marker token."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ninfer.demo import build_demo
from ninfer.engine import Engine
from ninfer.engine.stop import TextStream
from ninfer.model import load


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    return load(build_demo(tmp_path_factory.mktemp("overlap") / "demo.ninfer"))


def test_mask_is_computed_during_the_model_step(model) -> None:  # noqa: ANN001
    """The mask hook and runner.execute wait for each other: they can only both finish if they overlap."""
    eng = Engine.from_model(model, max_context=256, kv_capacity=2048, background=False)
    in_step, mask_started = threading.Event(), threading.Event()
    seen: dict[str, bool] = {"execute_saw_mask": True, "mask_saw_step": True}
    execute = eng._runner.execute

    def slow_execute(batch):  # noqa: ANN001, ANN202
        in_step.set()
        if any(w.sample for w in batch.work):  # this step's own mask (one per sampled step) has started
            seen["execute_saw_mask"] &= mask_started.wait(5.0)
            mask_started.clear()  # else a later step could finish before its mask starts, which then waits alone
        out = execute(batch)
        in_step.clear()
        return out

    def mask(generated: list[int]) -> np.ndarray:
        mask_started.set()
        seen["mask_saw_step"] &= in_step.wait(5.0)
        allowed = np.zeros(model.config.vocab_size, bool)
        allowed[[5, 6, 7]] = True
        return allowed

    eng._runner.execute = slow_execute
    try:
        c = eng.submit([1, 2, 3, 4], max_tokens=4, temperature=0.0, token_mask=mask).result()
    finally:
        eng.close()
    assert seen == {"execute_saw_mask": True, "mask_saw_step": True}
    assert len(c.token_ids) == 4 and set(c.token_ids) <= {5, 6, 7}


def test_failing_mask_fails_only_its_request(model) -> None:  # noqa: ANN001
    def bad(generated: list[int]) -> None:
        raise RuntimeError("boom")

    with Engine.from_model(model, max_context=256, kv_capacity=2048, max_concurrency=2) as eng:
        h_bad = eng.submit([1, 2, 3], max_tokens=4, token_mask=bad)
        h_ok = eng.submit([1, 2, 3], max_tokens=4)
        bad_c, ok_c = h_bad.result(), h_ok.result()
    assert bad_c.finish_reason == "error" and len(ok_c.token_ids) == 4


def test_stop_strings_armed_after_a_marker_token(model) -> None:  # noqa: ANN001
    tok = model.tokenizer
    think_end = tok.token_to_id("</think>")
    ids = tok.encode("stop here") + [think_end] + tok.encode(" answer then stop here too")
    free = TextStream(tok, ["stop"])
    armed = TextStream(tok, ["stop"], after_token=think_end)
    for t in ids:
        free.push(t)
        armed.push(t)
    assert free.matched == "stop" and free.text == ""
    assert armed.matched == "stop" and armed.text.startswith("stop here</think> answer then ")
    assert "too" not in armed.text
