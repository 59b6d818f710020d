"""The demo artifact: what `make serve` builds. Deterministic, registered, and runs end to end on the CPU."""

from __future__ import annotations

import json
import re

import numpy as np
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


def test_generate_samples_when_given_sampling_settings(demo: str) -> None:
    """``generate(ids, n, temperature=...)`` samples (greedy is the default only when no sampling setting is
    given); the other SamplingParams fields are taken; a contradiction is refused."""
    m = ninfer.load(demo)
    ids = [1, 2, 3]
    greedy = m.generate(ids, 8)
    sampled = m.generate(ids, 8, temperature=0.9, seed=1)
    assert sampled != greedy and sampled == m.generate(ids, 8, greedy=False, temperature=0.9, seed=1)
    assert m.generate(ids, 8, temperature=0) == greedy == m.generate(np.array(ids), np.int64(8))
    assert len(m.generate(ids, 4, min_p=0.05, repetition_penalty=1.1, seed=2)) == 4
    with pytest.raises(ValueError, match="contradicts temperature=0.7"):
        m.generate(ids, 4, greedy=True, temperature=0.7)


def test_cli_generate_samples_with_the_servers_defaults(demo: str, capsys) -> None:
    """Settings left out of ``ninfer generate`` are the artifact's generation defaults, as the server's, so a
    seeded run gives the server's tokens for a request that gives only the seed."""
    m = ninfer.load(demo)
    assert m.sampling_defaults == {"temperature": 0.7, "top_p": 0.9, "top_k": 20}
    assert (
        cli.main(["generate", demo, "--prompt-ids", "1,2,3", "--max-new", "12", "--seed", "5", "--json"]) == 0
    )
    got = json.loads(capsys.readouterr().out)["token_ids"]
    assert got == m.generate([1, 2, 3], 12, seed=5, **m.sampling_defaults)
    assert got != m.generate([1, 2, 3], 12, greedy=False, temperature=1.0, seed=5)
    assert cli.main(["generate", demo, "--prompt-ids", "1,2", "--greedy", "--temperature", "0.5"]) == 2
    assert "contradicts" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--messages", "null.json"], "messages must be a list of message objects, got NoneType"),
        (["--messages", "bad.json"], "--messages .*bad.json: not a UTF-8 JSON file"),
        (["--messages", "missing.json"], "--messages .*missing.json: cannot read"),
        (["--prompt-ids", "1,x,3"], "--prompt-ids: 'x' is not an integer token id"),
    ],
)
def test_cli_generate_bad_input_is_a_clear_error(demo: str, tmp_path, capsys, args, message) -> None:
    (tmp_path / "null.json").write_text("null")
    (tmp_path / "bad.json").write_text("{not json")
    args = [str(tmp_path / a) if a.endswith(".json") else a for a in args]
    assert cli.main(["generate", demo, *args, "--max-new", "2"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err, err
