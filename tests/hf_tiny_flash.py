"""Tiny random transformers ``Qwen4ExpForCausalLM`` checkpoints for Flash-Next parity tests (fp32, CPU).

Every norm weight is perturbed (HF initialises the (1+w) norms to 0, the GDN norm to 1 and the PLE conv to 0,
which would hide a missing offset or a dead branch), ``dt_bias`` too, and every float tensor is rounded to a
bf16-representable value so that a ``bf16`` artifact of the checkpoint is lossless and parity stays at fp32
noise. The QSA budget is tiny (``budget/ratio`` blocks), so contexts of a few dozen tokens exercise block
selection; 8 indexer heads (the real model has 4) make exact zero-score top-k ties (a block scores 0 when all
heads' dots are <= 0) rare enough that the tests can demand none. transformers has no MTP head: random ``mtp.*`` tensors (bf16-exact too) are added to the canonical
weights for the MTP tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EOS = 2  # n-gram pad id of the tiny models
# the parity tests' tiny models (seed: the index; test_flash_next_parity, test_flash_next_convert): expert counts
# 8/4/16, QSA budgets 8/6, ratios 4/2
CASES = {
    "e8k2-budget8": dict(num_experts=8, top_k=2, budget=8, ratio=4),
    "e4k4-budget6-ratio2": dict(num_experts=4, top_k=4, budget=6, ratio=2),
    "e16k3-8layers": dict(num_experts=16, top_k=3, budget=8, ratio=4, num_layers=8),
}
TOL = 1e-4  # the parity tolerance: max-abs error / max-abs logit (rel_max)


def tiny_hf_config(
    *,
    num_experts: int = 8,
    top_k: int = 2,
    budget: int = 8,
    ratio: int = 4,
    ple: bool = True,
    num_layers: int = 4,
    indexer_heads: int = 8,
) -> dict[str, Any]:
    """HF config dict (as in config.json) of a tiny qwen4_exp text model: layers lin,lin,lin,QSA(,...)."""
    return dict(
        model_type="qwen4_exp_text",
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=6,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        hc_count=4,
        hc_lowrank=16,
        ple_layer_ids=[2] if ple else None,
        ple_embed_dim=64,
        ngram_vocab_size_base=1000,
        split_ngram_parts=4,
        indexer_n_heads=indexer_heads,
        indexer_kv_heads=1,
        indexer_head_dim=16,
        indexer_budget=budget,
        indexer_compress_ratio=ratio,
        output_gate_type="sigmoid",
        eos_token_id=EOS,
        initializer_range=0.2,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters=dict(
            rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
            mrope_interleaved=True,
        ),
    )  # fmt: skip


def bf16_exact(a: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bf16 (RNE), kept as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def build_tiny(seed: int = 0, **cfg_kw: Any) -> tuple[Any, dict[str, Any]]:
    """(transformers model in eval mode, HF config dict). Weights perturbed and bf16-exact (module doc)."""
    import torch
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    hf = tiny_hf_config(**cfg_kw)
    cfg = Qwen4ExpTextConfig(**{k: v for k, v in hf.items() if k != "model_type"})
    torch.manual_seed(seed)
    model = Qwen4ExpForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if (
                name.endswith("norm.weight")
                or "layernorm" in name
                or name.endswith(("norm_key.weight", "norm_query.weight", "norm_conv.weight"))
            ):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith(("dt_bias", "ple.conv1d.weight")):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
            p.copy_(torch.from_numpy(bf16_exact(p.detach().numpy())))
    return model, hf


def hf_state(model: Any) -> dict[str, np.ndarray]:
    """The model's state dict as NumPy arrays under HF names."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def random_weights(cfg: Any, seed: int = 0, *, mtp: bool = True, scale: float = 0.2) -> dict[str, np.ndarray]:
    """bf16-exact random canonical weights for a FlashNextConfig without transformers (fast): every tensor of
    ``expected_shapes`` (MTP included when ``mtp``); 1-D norm weights N(0, 0.3), ``A_log``/``dt_bias`` |N|,
    matrices N(0, scale)."""
    from ninfer.flash_next.names import expected_shapes

    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_shapes(cfg, mtp=mtp).items():
        a = rng.normal(0.0, 0.3 if len(shape) == 1 else scale, shape)
        if name.endswith(("A_log", "dt_bias")):
            a = np.abs(a) + 0.5
        out[name] = bf16_exact(a.astype(np.float32))
    return out


def hf_logits(model: Any, ids: np.ndarray) -> np.ndarray:
    """Full-sequence fp32 logits ``[T, V]`` of the transformers model (single forward, no cache)."""
    import torch

    with torch.no_grad():
        out = model(torch.as_tensor(np.asarray(ids, np.int64))[None], use_cache=False)
    return out.logits[0].numpy()


def hf_greedy(model: Any, ids: np.ndarray, n: int) -> list[int]:
    """n greedy tokens from transformers with its cache: one prefill, then one-token decode steps.

    (``generate`` is avoided: it infers an attention mask from the pad id, which changes the n-gram ids.)
    """
    import torch
    from transformers import DynamicCache

    out: list[int] = []
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        x = torch.as_tensor(np.asarray(ids, np.int64))[None]
        for _ in range(n):
            res = model(x, cache=cache, use_cache=True)
            cache = res.cache
            tok = int(res.logits[0, -1].argmax())
            out.append(tok)
            x = torch.tensor([[tok]])
    return out


def real_hf_config() -> dict[str, Any]:
    """The text config of Qwen/Qwen3.8-Flash-Next as docs/flash-next.md §1 gives it (VLM wrapper, 'full_attention')."""
    text = dict(
        model_type="qwen4_exp_text", vocab_size=248320, hidden_size=2560, num_hidden_layers=48,
        full_attention_interval=4, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
        intermediate_size=12288, num_attention_heads=24, num_key_value_heads=2, head_dim=256, attention_bias=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                             mrope_section=[11, 11, 10], mrope_interleaved=True),
        max_position_embeddings=262144, linear_num_key_heads=16, linear_num_value_heads=48,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, output_gate_type="sigmoid",
        mamba_ssm_dtype="float32", num_experts=512, num_experts_per_tok=10, moe_intermediate_size=640,
        shared_expert_intermediate_size=640, norm_topk_prob=True, router_aux_loss_coef=0.001, hc_count=4,
        hc_lowrank=320, ple_layer_ids=[2], ple_embed_dim=2560, ple_conv_kernel_size=4, ngram_size=3,
        heads_per_ngram=8, ngram_vocab_size_base=20_000_000, make_ngram_vocab_size_divisible_by=128,
        split_ngram_parts=128, indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=128, indexer_budget=2048,
        indexer_compress_ratio=4, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(48)],
        eos_token_id=248044, bos_token_id=248044,
    )  # fmt: skip
    return dict(model_type="qwen4_exp", architectures=["Qwen4ExpForConditionalGeneration"], text_config=text,
                eos_token_id=[248046, 248044], tie_word_embeddings=False)  # fmt: skip


def rel_max(ours: np.ndarray, ref: np.ndarray) -> float:
    """max |ours - ref| / max |ref|."""
    return float(np.abs(ours - ref).max() / np.abs(ref).max())
