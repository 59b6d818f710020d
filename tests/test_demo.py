"""The demo artifact: what `make serve` builds. Deterministic, registered, and runs end to end on the CPU."""

from __future__ import annotations

import json

import pytest

import ninfer
from ninfer import cli
from ninfer.artifact import open_artifact
from ninfer.demo import build_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_demo(tmp_path_factory.mktemp("demo") / "demo.ninfer")


def test_demo_is_registered_and_deterministic(demo: str, tmp_path) -> None:
    art = open_artifact(demo)
    assert art.model_id == "ninfer-demo" and art.shape_registered and art.weight_profile == "bf16"
    assert {r["role"] for r in art.manifest["resources"]} >= {
        "tokenizer",
        "chat_template",
        "generation_config",
    }
    again = open_artifact(build_demo(tmp_path / "again.ninfer"))
    assert again.digest == art.digest


def test_demo_tokenizer_template_and_generation(demo: str) -> None:
    m = ninfer.load(demo)
    tok = m.tokenizer
    assert m.eos_token_ids == (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))
    ids = m.chat_template.render_ids([{"role": "user", "content": "Hello"}], add_generation_prompt=True)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    out = m.generate(ids, 16, greedy=True)
    assert 1 <= len(out) <= 16 and all(0 <= t < tok.vocab_size for t in out)
    assert out == m.generate(ids, 16, greedy=True)  # greedy is deterministic
    assert m.generate(ids, 8, greedy=False, seed=3) == m.generate(ids, 8, greedy=False, seed=3)


def test_cli_generate_on_demo(demo: str, capsys) -> None:
    assert (
        cli.main(["generate", demo, "--prompt", "Hello, ninfer", "--max-new", "12", "--greedy", "--json"])
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["prompt_tokens"] > 5 and 1 <= len(res["token_ids"]) <= 12 and isinstance(res["text"], str)
    assert res["finish_reason"] in ("stop", "length")


def test_cuda_backend_without_gpu_is_a_clear_error(demo: str) -> None:
    from conftest import _gpu_available

    from ninfer.model import BackendError

    if _gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(BackendError, match="needs an NVIDIA GPU"):
        ninfer.load(demo, backend="cuda")
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        ninfer.load(demo, backend="tpu")
