"""``ninfer perplexity`` against transformers' loss on the same tokens (issue 21 acceptance: 1e-4 relative).

A tiny Qwen3.5 checkpoint is written by transformers' ``save_pretrained`` with a real BPE tokenizer beside it
(the demo tokenizer trained to fit the tiny vocabulary), converted by ``ninfer convert`` and scored by the CLI.
The reference is transformers' own shifted cross-entropy with the sliding-window recipe (``labels[:-trg_len] =
-100``), summed as loss × scored tokens per window. Weights are rounded to bf16 before saving so the bf16
profile stores them exactly and the comparison measures the model math alone.
"""

from __future__ import annotations

import json
import math

import pytest
from hf_tiny import make_tiny_hf

from ninfer import cli
from ninfer.convert import convert
from ninfer.evaluate.perplexity import windows
from ninfer.frontend.demo_tokenizer import load_demo_corpus, train_demo_tokenizer

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

REL = 1e-4
VOCAB = 320  # model rows; the tokenizer below has 300 learned + 9 control ids


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("ppl")
    hf_dir = d / "hf"
    model, _ = make_tiny_hf("dense", 0, vocab_size=VOCAB)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(("A_log", "dt_bias")):  # stored FP32 by every profile
                p.copy_(p.bfloat16().float())
    model.save_pretrained(str(hf_dir), safe_serialization=True)
    tok_json, tok_cfg = train_demo_tokenizer(load_demo_corpus(), vocab_size=300)
    (hf_dir / "tokenizer.json").write_text(tok_json, encoding="utf-8")
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg), encoding="utf-8")
    art = str(d / "tiny.ninfer")
    convert(str(hf_dir), art, "bf16", allow_unregistered_shape=True, progress=False)
    text = load_demo_corpus()[2000:3500]
    (d / "text.txt").write_text(text, encoding="utf-8")
    ids = tokenizers.Tokenizer.from_str(tok_json).encode(text).ids
    return {"model": model, "art": art, "text": str(d / "text.txt"), "ids": ids}


def _hf_nll(model, ids: list[int], context: int, stride: int) -> tuple[float, int]:
    """transformers' sliding-window perplexity recipe: (summed NLL, scored tokens)."""
    total, count, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + context, len(ids))
        trg_len = end - prev_end
        x = torch.tensor([ids[begin:end]])
        labels = x.clone()
        labels[:, :-trg_len] = -100
        n_valid = int((labels[:, 1:] != -100).sum())
        if n_valid:
            with torch.no_grad():
                loss = model(x, attention_mask=torch.ones_like(x), labels=labels).loss
            total += float(loss) * n_valid
            count += n_valid
        prev_end = end
        if end == len(ids):
            break
    return total, count


def _run_cli(capsys, *args: str) -> dict:
    assert cli.main(["perplexity", *args, "--compact", "-q"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("context", "stride"), [(128, 48), (96, 96), (None, None)])
def test_perplexity_matches_transformers_loss(tiny, capsys, context, stride) -> None:
    args = [tiny["art"], "--text", tiny["text"], "--prefill-chunk", "40"]
    if context is not None:
        args += ["--context", str(context), "--stride", str(stride)]
    got = _run_cli(capsys, *args)
    ids = tiny["ids"]
    assert got["tokens"] == len(ids) > 300
    ctx = context or len(ids)
    ref_sum, ref_n = _hf_nll(tiny["model"], ids, ctx, stride or ctx // 2)
    assert got["scored_tokens"] == ref_n
    ref_mean = ref_sum / ref_n
    assert abs(got["nll_mean"] - ref_mean) <= REL * abs(ref_mean), (got["nll_mean"], ref_mean)
    assert abs(got["perplexity"] - math.exp(ref_mean)) <= REL * math.exp(ref_mean)
    assert got["perplexity"] == pytest.approx(math.exp(got["nll_mean"]), rel=1e-12)


def test_windows_score_every_token_once() -> None:
    for n, ctx, stride in [(10, 4, 1), (100, 32, 7), (100, 32, 32), (33, 64, 16), (2, 2, 1)]:
        ws = windows(n, ctx, stride)
        scored = [t for w in ws for t in range(w.first_target, w.end)]
        assert len(scored) == len(set(scored))
        assert all(w.end - w.begin <= ctx and w.begin < w.first_target for w in ws)
        if stride < ctx:
            assert sorted(scored) == list(range(1, n))
        else:  # disjoint windows: the first token of each is unscored, as in transformers' shifted loss
            assert sorted(scored) == [t for t in range(1, n) if t % ctx]


@pytest.mark.parametrize(("n", "ctx", "stride", "msg"), [(1, 8, 4, "at least 2"), (10, 1, 1, "--context"),
                                                         (10, 8, 9, "--stride"), (10, 8, 0, "--stride")])  # fmt: skip
def test_windows_reject_bad_settings(n, ctx, stride, msg) -> None:
    with pytest.raises(ValueError, match=msg):
        windows(n, ctx, stride)


def test_perplexity_cli_reports_a_missing_tokenizer(tmp_path, capsys) -> None:
    from hf_tiny import save_tiny_hf

    save_tiny_hf(tmp_path / "hf", "dense", 0)
    art = str(tmp_path / "m.ninfer")
    convert(str(tmp_path / "hf"), art, "bf16", allow_unregistered_shape=True, progress=False)
    (tmp_path / "t.txt").write_text("hello world")
    assert cli.main(["perplexity", art, "--text", str(tmp_path / "t.txt"), "-q"]) == 2
    assert "no tokenizer" in capsys.readouterr().err


@pytest.mark.gpu
def test_cuda_perplexity_matches_the_reference(tmp_path) -> None:
    """The CUDA backend's rows (cupy hidden states, device lm_head) through the same windows: within the bf16-KV
    tolerance of the reference (logits differ by ~1e-2 of their max there; the mean NLL far less)."""
    import ninfer
    from ninfer.demo import build_demo
    from ninfer.evaluate.perplexity import perplexity

    art = build_demo(tmp_path / "demo.ninfer")
    ref = ninfer.load(art)
    ids = ref.tokenizer.encode(load_demo_corpus()[:6000])
    kw = dict(context=512, stride=200, prefill_chunk=128)
    want = perplexity(ref, ids, **kw)
    got = perplexity(ninfer.load(art, backend="cuda", backend_options={"progress": False}), ids, **kw)
    assert got.scored_tokens == want.scored_tokens == len(ids) - 1
    assert abs(got.nll_mean - want.nll_mean) <= 1e-2 * want.nll_mean, (got.nll_mean, want.nll_mean)
