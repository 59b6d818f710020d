"""FlashNextConfig: the frozen description of one Qwen3.8-Flash-Next (``qwen4_exp``) text model.

Built once from an HF ``config.json`` dict (``from_hf``) or a stored copy (``from_dict``), validated in
``__post_init__`` and passed down. Field names follow HF ``Qwen4ExpTextConfig``; every value comes from the
checkpoint config, since transformers' defaults are not this model (docs/flash-next.md §1).

Layer kinds are normalised to ``"linear_attention"`` (GDN) and ``"qsa"``: the checkpoint writes
``full_attention`` and transformers ``indexed_attention`` for the same QSA layers (there is no dense path, §2).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from ninfer.config import ConfigError, HybridDims

__all__ = ["FlashNextConfig", "ConfigError", "MODEL_TYPES", "ngram_head_sizes"]

MODEL_TYPES = ("qwen4_exp", "qwen4_exp_text")


@functools.lru_cache(maxsize=16)
def ngram_head_sizes(base: int, n_heads: int, ple_rank: int) -> tuple[int, ...]:
    """Per-head n-gram vocabulary sizes of PLE layer ``ple_rank``: consecutive primes > base-1 (§7).

    Head j of rank r is the (r*n_heads + j + 1)-th prime >= base, so a second PLE layer continues the sequence.
    Pure function of its arguments (cached: ~0.1 s of trial division at base 2e7).
    """
    primes: list[int] = []
    cand = base - 1
    while len(primes) < (ple_rank + 1) * n_heads:
        cand += 1
        if _is_prime(cand):
            primes.append(cand)
    return tuple(primes[ple_rank * n_heads :])


def _is_prime(v: int) -> bool:
    if v < 2:
        return False
    if v % 2 == 0:
        return v == 2
    return all(v % d for d in range(3, math.isqrt(v) + 1, 2))


@dataclass(frozen=True, slots=True, kw_only=True)
class FlashNextConfig(HybridDims):
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]  # "linear_attention" | "qsa"
    # QSA main attention (Qwen3.5 gated attention)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    # QSA indexer
    indexer_n_heads: int
    indexer_head_dim: int
    indexer_budget: int
    indexer_compress_ratio: int
    # Gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    output_gate_type: str = "sigmoid"  # GDN output gate activation: "sigmoid" (this model) or "silu"
    # MoE (every layer)
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool = True
    # hyper-connections
    hc_count: int = 4
    hc_lowrank: int = 320
    # PLE / n-gram embedding
    ple_layer_ids: tuple[int, ...] = ()  # ONE-indexed, as in HF
    ple_embed_dim: int = 0  # 0 -> hidden_size
    ple_conv_kernel_size: int = 4
    ngram_size: int = 3
    heads_per_ngram: int = 8
    ngram_vocab_size_base: int = 20_000_000
    make_ngram_vocab_size_divisible_by: int = 128
    seed: int = 1234
    split_ngram_parts: int = 512
    # norms / rope / misc
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 262144
    mtp_num_hidden_layers: int = 0
    eos_token_ids: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        positive = (
            "indexer_n_heads indexer_head_dim indexer_budget indexer_compress_ratio num_experts num_experts_per_tok "
            "moe_intermediate_size shared_expert_intermediate_size hc_count hc_lowrank ple_conv_kernel_size "
            "ngram_size heads_per_ngram ngram_vocab_size_base make_ngram_vocab_size_divisible_by split_ngram_parts"
        ).split()
        self._check_hybrid(("linear_attention", "qsa"), positive)
        self._check_layers()
        self._check_attention()
        self._check_moe_gdn()
        self._check_ple()

    def _check_layers(self) -> None:
        if self.hc_count < 2:
            raise ConfigError(f"hc_count: must be > 1, got {self.hc_count}")
        if self.mtp_num_hidden_layers not in (0, 1):
            raise ConfigError(
                f"mtp_num_hidden_layers: only 0 or 1 is supported, got {self.mtp_num_hidden_layers}"
            )

    def _check_attention(self) -> None:
        if self.rotary_dim > self.indexer_head_dim:
            raise ConfigError(
                f"indexer_head_dim: {self.indexer_head_dim} is smaller than the rotary dims ({self.rotary_dim})"
            )
        if self.indexer_budget % self.indexer_compress_ratio:
            raise ConfigError("indexer_budget: must be a multiple of indexer_compress_ratio")

    def _check_moe_gdn(self) -> None:
        if not (0 < self.num_experts_per_tok <= self.num_experts):
            raise ConfigError("num_experts_per_tok: must be in 1..num_experts")
        if self.output_gate_type not in ("sigmoid", "silu"):
            raise ConfigError(f"output_gate_type: must be sigmoid or silu, got {self.output_gate_type!r}")

    def _check_ple(self) -> None:
        if not self.ple_layer_ids:
            return
        if self.ple_dim % self.ngram_heads:
            raise ConfigError(
                f"ple_embed_dim: {self.ple_dim} is not divisible by {self.ngram_heads} n-gram heads"
            )
        if self.ngram_size < 2:
            raise ConfigError(f"ngram_size: must be >= 2 with PLE layers, got {self.ngram_size}")
        for lid in self.ple_layer_ids:
            if not 1 <= lid <= self.num_hidden_layers:
                raise ConfigError(
                    f"ple_layer_ids: {lid} is outside 1..{self.num_hidden_layers} (one-indexed)"
                )
            if self.layer_types[lid - 1] != "linear_attention":
                raise ConfigError(f"ple_layer_ids: layer {lid} (one-indexed) is not a linear_attention layer")
        if list(self.ple_layer_ids) != sorted(set(self.ple_layer_ids)):
            raise ConfigError("ple_layer_ids: must be sorted and unique")
        if not self.eos_token_ids:
            raise ConfigError("eos_token_ids: required with PLE layers (the n-gram pad id is the first one)")
        if self.vocab_size >= 2**31:
            raise ConfigError("vocab_size: too large for the n-gram hash")

    # ---- derived values -------------------------------------------------------------------------------
    @property
    def hc_dim(self) -> int:
        """Width of the 4-stream hyper-connection state (stream-major)."""
        return self.hc_count * self.hidden_size

    @property
    def qsa_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "qsa")

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    # names the Qwen3.6 engine code sizes caches by: QSA layers hold the K/V, GDN layers the recurrent state
    @property
    def arch(self) -> str:
        return "qwen4_exp"

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return self.qsa_layers

    @property
    def is_moe(self) -> bool:
        """Every layer's MLP is a routed MoE (the CLI and engine read this name on any config)."""
        return True

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return self.gdn_layers

    @property
    def block_topk(self) -> int:
        """Blocks kept per query row (512 = 2048/4 in the real model)."""
        return self.indexer_budget // self.indexer_compress_ratio

    @property
    def dense_max_visible(self) -> int:
        """QSA is exactly dense while a query sees at most this many tokens (budget + ratio - 1)."""
        return self.indexer_budget + self.indexer_compress_ratio - 1

    @property
    def ple_layers(self) -> tuple[int, ...]:
        """0-based layer indices carrying PLE (ple_layer_ids are one-indexed)."""
        return tuple(i - 1 for i in self.ple_layer_ids)

    @property
    def ple_dim(self) -> int:
        return self.ple_embed_dim or self.hidden_size

    @property
    def ngram_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def ngram_row_dim(self) -> int:
        """Width of one n-gram table row (160 in the real model)."""
        return self.ple_dim // self.ngram_heads

    @property
    def ple_conv_state_len(self) -> int:
        """Rows of the PLE conv state: (kernel-1)·dilation with dilation = ngram_size (9 in the real model)."""
        return (self.ple_conv_kernel_size - 1) * self.ngram_size

    @property
    def pad_token_id(self) -> int:
        """The n-gram pad id: first eos id (248044 in the real model)."""
        return self.eos_token_ids[0]

    def ngram_head_sizes(self, ple_rank: int) -> tuple[int, ...]:
        return ngram_head_sizes(self.ngram_vocab_size_base, self.ngram_heads, ple_rank)

    def ngram_head_offsets(self, ple_rank: int) -> tuple[int, ...]:
        sizes = self.ngram_head_sizes(ple_rank)
        return tuple(sum(sizes[:j]) for j in range(len(sizes)))

    def ngram_table_rows(self, ple_rank: int) -> int:
        """Rows of the n-gram table of PLE layer ``ple_rank``, padded to make_ngram_vocab_size_divisible_by."""
        d = self.make_ngram_vocab_size_divisible_by
        return -(-sum(self.ngram_head_sizes(ple_rank)) // d) * d

    def is_block_boundary(self, length: int) -> bool:
        """True when a sequence of ``length`` tokens has an empty QSA open block (see docs/flash-next-state.md)."""
        return length % self.indexer_compress_ratio == 0

    # ---- (de)serialisation: to_dict / from_dict come from HybridDims ----------------------------------
    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> FlashNextConfig:
        """Read an HF ``config.json`` dict (``Qwen4ExpForCausalLM`` text config or the VLM with ``text_config``)."""
        return _from_hf(cls, hf)


# ---- HF ``config.json`` -> FlashNextConfig (docs/flash-next.md §1): field mapping and the checks HF itself makes
_QSA_NAMES = ("full_attention", "indexed_attention", "qwen_sparse_attention", "qsa")
_INDEXER = (
    "indexer_n_heads",
    "indexer_kv_heads",
    "indexer_head_dim",
    "indexer_budget",
    "indexer_compress_ratio",
)


def _layer_types(text: dict[str, Any], n_layers: int) -> tuple[str, ...]:
    raw = text.get("layer_types")
    if raw is None:
        interval = text.get("full_attention_interval", 4)
        return tuple("qsa" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers))
    out = []
    for t in raw:
        if t in _QSA_NAMES:
            out.append("qsa")
        elif t == "linear_attention":
            out.append(t)
        else:
            raise ConfigError(f"layer_types: unknown layer type {t!r}")
    return tuple(out)


def _eos_ids(hf: dict[str, Any], text: dict[str, Any]) -> tuple[int, ...]:
    """Text-config eos ids first (the first one is the n-gram pad id HF uses), then the outer config's others."""
    out: list[int] = []
    for src in (text, hf):
        eos = src.get("eos_token_id")
        for e in eos if isinstance(eos, list) else ([] if eos is None else [eos]):
            if int(e) not in out:
                out.append(int(e))
    return tuple(out)


def _check_supported(text: dict[str, Any], rope: dict[str, Any]) -> None:
    missing = [k for k in _INDEXER if text.get(k) is None]
    if missing:
        raise ConfigError(f"{missing[0]}: required (every non-GDN qwen4_exp layer is QSA)")
    if text["indexer_kv_heads"] != 1:
        raise ConfigError(f"indexer_kv_heads: qwen4_exp QSA requires 1, got {text['indexer_kv_heads']}")
    if text.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act: only silu is supported, got {text.get('hidden_act')!r}")
    if text.get("attention_bias", False):
        raise ConfigError("attention_bias: attention biases are not supported")
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(
            f"rope_parameters.rope_type: only 'default' is supported, got {rope.get('rope_type')!r}"
        )
    if text.get("mtp_use_dedicated_embeddings", False):
        raise ConfigError("mtp_use_dedicated_embeddings: dedicated MTP embeddings are not supported")


def _from_hf(cls: type[FlashNextConfig], hf: dict[str, Any]) -> FlashNextConfig:
    text = hf.get("text_config", hf)
    model_type = text.get("model_type", hf.get("model_type"))
    if model_type not in ("qwen4_exp", "qwen4_exp_text"):
        raise ConfigError(f"model_type: {model_type!r} is not qwen4_exp (Qwen3.8-Flash-Next)")
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    _check_supported(text, rope)
    n_layers = text["num_hidden_layers"]
    hidden = text["hidden_size"]

    def g(name: str, default: Any) -> Any:
        v = text.get(name)
        return default if v is None else v

    return cls(
        vocab_size=text["vocab_size"],
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        layer_types=_layer_types(text, n_layers),
        num_attention_heads=text["num_attention_heads"],
        num_key_value_heads=text["num_key_value_heads"],
        head_dim=g("head_dim", 256),
        indexer_n_heads=text["indexer_n_heads"],
        indexer_head_dim=text["indexer_head_dim"],
        indexer_budget=text["indexer_budget"],
        indexer_compress_ratio=text["indexer_compress_ratio"],
        linear_num_key_heads=g("linear_num_key_heads", 16),
        linear_num_value_heads=g("linear_num_value_heads", 32),
        linear_key_head_dim=g("linear_key_head_dim", 128),
        linear_value_head_dim=g("linear_value_head_dim", 128),
        linear_conv_kernel_dim=g("linear_conv_kernel_dim", 4),
        output_gate_type=g("output_gate_type", g("hidden_act", "silu")),
        num_experts=g("num_experts", 512),
        num_experts_per_tok=g("num_experts_per_tok", 10),
        moe_intermediate_size=g("moe_intermediate_size", 512),
        shared_expert_intermediate_size=g("shared_expert_intermediate_size", 512),
        norm_topk_prob=bool(g("norm_topk_prob", True)),
        hc_count=g("hc_count", 4),
        hc_lowrank=g("hc_lowrank", 320),
        ple_layer_ids=tuple(sorted(set(g("ple_layer_ids", [])))),
        ple_embed_dim=g("ple_embed_dim", hidden),
        ple_conv_kernel_size=g("ple_conv_kernel_size", 4),
        ngram_size=g("ngram_size", 3),
        heads_per_ngram=g("heads_per_ngram", 8),
        ngram_vocab_size_base=g("ngram_vocab_size_base", 20_000_000),
        make_ngram_vocab_size_divisible_by=g("make_ngram_vocab_size_divisible_by", 128),
        seed=g("seed", 1234),
        split_ngram_parts=g("split_ngram_parts", 512),
        rms_norm_eps=float(g("rms_norm_eps", 1e-6)),
        # HF silently defaults a missing rope_theta to 1e4 and mrope_section to [11,11,10]
        rope_theta=float(rope.get("rope_theta", g("rope_theta", 1e4))),
        partial_rotary_factor=float(rope.get("partial_rotary_factor", g("partial_rotary_factor", 1.0))),
        mrope_section=tuple(rope.get("mrope_section", (11, 11, 10))),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        max_position_embeddings=g("max_position_embeddings", 32768),
        mtp_num_hidden_layers=g("mtp_num_hidden_layers", 0),
        eos_token_ids=_eos_ids(hf, text),
    )
