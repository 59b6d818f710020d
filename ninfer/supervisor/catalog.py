"""The model catalog: a preset's ``ninfer serve`` command line, and the checks a preset passes before it may
replace the running engine (preflight).

Preflight, in order: the preset's options parse as serve options and make a valid engine configuration; the
artifact opens and verifies (every blob hashed with ``preflight_verify = "full"``) and has a registered shape
unless the preset allows otherwise; and — when the engine would run on the GPU — the estimated device-memory
plan fits in the free GPU memory plus what the resident engine would give back, less the reserve. A preset that fails is refused with the reason; the
running engine is not touched.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from .config import EngineSettings, Preset, check_preset_args
from .gpu import GpuStatus
from .serve_args import parse_serve_args

__all__ = ["PresetRefused", "Preflight", "check_preset_args", "serve_argv", "preflight", "estimate_plan"]

GIB = float(1 << 30)


class PresetRefused(ValueError):
    """A preset that must not replace the running engine; the message says why."""


@dataclass(frozen=True, slots=True)
class Preflight:
    preset: str
    model_id: str
    verified: str  # "full" | "manifest" | "upstream-v1"
    backend: str  # what the engine would run on
    estimate_bytes: (
        int | None
    )  # the device-memory plan's total (None: no GPU plan, e.g. the reference backend)
    available_bytes: int | None  # free GPU memory + what the resident engine holds - the reserve
    memory: str  # one line for a person


def serve_argv(preset: Preset, engine: EngineSettings, request_log: str) -> list[str]:
    """The engine's command line: this Python's ``ninfer serve`` with the common and the preset's options, then
    the options the supervisor owns."""
    argv = [sys.executable, "-m", "ninfer.cli", "serve", preset.artifact, *engine.args, *preset.args]
    argv += ["--host", engine.host, "--port", str(engine.port), "--request-log-jsonl", request_log]
    argv += ["--shutdown-grace-s", str(engine.shutdown_grace_s)]
    argv += ["--memory-reserve-gib", str(engine.memory_reserve_gib)]
    if engine.api_key_file:
        argv += ["--api-key-file", engine.api_key_file]
    return argv


def engine_config(server_cfg: Any) -> Any:
    """The EngineConfig the engine would run with (EngineConfigError, a ValueError, if it cannot work)."""
    from ninfer.api.server import actor_spec  # the one mapping of serve options to engine settings

    return actor_spec(server_cfg, "cuda").engine


def estimate_plan(art: Any, server_cfg: Any) -> Any:
    """The CUDA runner's device-memory plan (a ``MemoryPlan``) for this artifact and serve configuration,
    computed the way the runner computes it at start-up, with the manifest's tensor bytes as the weights (every
    tensor of the file: never less than what is uploaded)."""
    from ninfer.cuda.memory_plan import has_group_weights, plan_memory, snapshot_bytes

    mc = art.model_config
    ec = engine_config(server_cfg).for_model(mc)
    snap = snapshot_bytes(mc, ec.gdn_state_dtype)
    n_ckpt = (ec.checkpoint_budget(snap) // snap + ec.max_concurrency) if ec.prefix_reuse else 0
    k = (
        ec.num_draft
    )  # speculation: a spare GDN slot per lane, the MTP KV plane, verify graphs (as the runner)
    n_ckpt += ec.max_concurrency if k else 0
    weights = sum(int(art.tensor_info(n)["nbytes"]) for n in art.tensor_names())
    plan = plan_memory(
        mc, weights=weights, free=0, lanes=ec.max_concurrency, checkpoints=n_ckpt, num_pages=ec.num_pages,
        page_size=ec.page_size, max_context=ec.max_context, prefill_chunk=ec.prefill_chunk, attn_chunk=256,
        kv_dtype=ec.kv_dtype, state_dtype=ec.gdn_state_dtype, act_bytes=2 if server_cfg.activations == "bf16" else 4,
        graphs=server_cfg.cuda_graph, extra_kv_planes=int(k > 0), verify_rows=k + 1 if k else 0,
        host_tier=ec.prefix_reuse and ec.host_cache_gib != 0,
        group_weights=has_group_weights(art.tensor_info(n)["format"] for n in art.tensor_names()),
    )  # fmt: skip
    return plan


def _open(preset: Preset, server_cfg: Any, verify: str) -> tuple[Any, str]:
    from ninfer.api.cli import check_artifact
    from ninfer.artifact import open_artifact
    from ninfer.artifact.upstream import is_upstream_v1

    if is_upstream_v1(preset.artifact):  # served as it is (bound by upstream's names)
        return open_artifact(preset.artifact, verify=verify), "upstream-v1"  # type: ignore[arg-type]
    check_artifact(server_cfg)  # registered shape (or --allow-unregistered-shape)
    return open_artifact(preset.artifact, verify=verify), verify  # type: ignore[arg-type]


def preflight(
    preset: Preset, engine: EngineSettings, gpu: GpuStatus, resident_bytes: int, verify: str = "full"
) -> Preflight:
    """Check ``preset`` before it replaces the resident engine (which holds ``resident_bytes`` of GPU memory
    that a switch gives back). Raises PresetRefused with the reason."""
    from ninfer.api.cli import config_from_args

    try:
        server_cfg = config_from_args(parse_serve_args((*engine.args, *preset.args), preset.artifact))
        engine_config(server_cfg)
    except ValueError as e:
        raise PresetRefused(f"preset {preset.name!r}: invalid serve options: {e}") from None
    try:
        art, verified = _open(preset, server_cfg, verify)
    except (ValueError, OSError) as e:  # ArtifactError is a ValueError
        raise PresetRefused(f"preset {preset.name!r}: artifact check failed: {e}") from None
    model_id = server_cfg.model_id or art.model_id
    arch = getattr(getattr(art, "model_config", None), "arch", None) if verified != "upstream-v1" else None
    backend = _backend(server_cfg.backend, arch, gpu)
    if backend != "cuda" or verified == "upstream-v1":
        return Preflight(
            preset.name, model_id, verified, backend, None, None, f"no GPU memory plan ({backend})"
        )
    reserve = int(engine.memory_reserve_gib * GIB)
    need = estimate_plan(art, server_cfg).total
    avail = gpu.free_bytes + resident_bytes - reserve
    line = (f"estimate {need / GIB:.2f} GiB of {avail / GIB:.2f} GiB available ({gpu.free_bytes / GIB:.2f} free + "
            f"{resident_bytes / GIB:.2f} held by the resident engine - {reserve / GIB:.2f} reserve)")  # fmt: skip
    if need > avail:
        raise PresetRefused(f"preset {preset.name!r}: does not fit in GPU memory: {line}")
    return Preflight(preset.name, model_id, verified, backend, need, avail, line)


def _backend(backend: str, arch: str | None, gpu: GpuStatus) -> str:
    if backend != "auto":
        return backend
    from ninfer.architectures import CUDA_ARCHITECTURES

    return "cuda" if gpu.available and arch in CUDA_ARCHITECTURES else "reference"
