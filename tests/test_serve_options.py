"""`ninfer serve` options that decide how the server starts: the backend `auto` picks, the connection and
shutdown settings, and `--allow-unregistered-shape` reaching the actor."""

from __future__ import annotations

import pytest
from ninfer.api.cli import config_from_args
from ninfer.api.config import ServerConfig, ServerConfigError
from ninfer.api.server import actor_spec, resolve_backend

from ninfer.cli import _parser


@pytest.mark.parametrize(
    ("backend", "arch", "gpus", "want"),
    [
        ("auto", "qwen3_5", 1, "cuda"),
        ("auto", "qwen3_5_moe", 2, "cuda"),
        ("auto", "qwen3_5", 0, "reference"),
        ("auto", "qwen4_exp", 1, "reference"),  # Flash-Next: no CUDA target yet
        ("auto", None, 1, "reference"),  # an upstream v1 file: the CUDA backend does not load those
        ("reference", "qwen3_5", 1, "reference"),
        ("cuda", "qwen4_exp", 1, "cuda"),  # asked for explicitly: kept, and the load says why it cannot
    ],
)
def test_backend_choice(backend: str, arch: str | None, gpus: int, want: str) -> None:
    got, why = resolve_backend(backend, arch, gpus=gpus)
    assert got == want, why
    if backend == "auto" and gpus and want == "reference":
        assert "no target" in why and ("qwen4_exp" in why or "v1" in why)


def test_connection_and_shutdown_flags() -> None:
    a = _parser().parse_args(["serve", "a.ninfer", "--header-timeout-s", "2", "--body-timeout-s", "3",
                              "--keep-alive-timeout-s", "4", "--max-connections", "5",
                              "--shutdown-grace-s", "6", "--body-deadline-s", "7"])  # fmt: skip
    cfg = config_from_args(a)
    assert (cfg.header_timeout_s, cfg.body_timeout_s, cfg.keep_alive_timeout_s) == (2, 3, 4)
    assert cfg.body_deadline_s == 7
    assert (cfg.max_connections, cfg.shutdown_grace_s) == (5, 6)
    d = config_from_args(_parser().parse_args(["serve", "a.ninfer"]))
    assert (d.header_timeout_s, d.body_timeout_s, d.max_connections, d.shutdown_grace_s) == (10, 30, 256, 30)
    assert d.body_deadline_s == 60
    for kw, flag in (
        ({"header_timeout_s": 0}, "--header-timeout-s"),
        ({"body_timeout_s": -1}, "--body-timeout-s"),
        ({"body_deadline_s": 0}, "--body-deadline-s"),
        ({"body_deadline_s": 1e9}, "--body-deadline-s"),
        ({"keep_alive_timeout_s": 0}, "--keep-alive-timeout-s"),
        ({"max_connections": 0}, "--max-connections"),
        ({"shutdown_grace_s": -1}, "--shutdown-grace-s"),
    ):
        with pytest.raises(ServerConfigError, match=flag):
            ServerConfig(artifact="a.ninfer", **kw)  # type: ignore[arg-type]


def test_allow_unregistered_shape_reaches_the_actor() -> None:
    a = _parser().parse_args(["serve", "a.ninfer", "--allow-unregistered-shape"])
    assert actor_spec(config_from_args(a), "reference").allow_unregistered_shape is True
    b = _parser().parse_args(["serve", "a.ninfer"])
    assert actor_spec(config_from_args(b), "reference").allow_unregistered_shape is False


def test_memory_reserve_reaches_the_cuda_memory_plan() -> None:
    a = _parser().parse_args(["serve", "a.ninfer", "--memory-reserve-gib", "1.5"])
    cfg = config_from_args(a)
    assert cfg.memory_reserve_gib == 1.5
    assert actor_spec(cfg, "cuda").backend_options["memory_reserve_bytes"] == 3 << 29
    assert "memory_reserve_bytes" not in actor_spec(cfg, "reference").backend_options  # no device plan there
    none = config_from_args(_parser().parse_args(["serve", "a.ninfer"]))
    assert none.memory_reserve_gib == 0
    assert "memory_reserve_bytes" not in actor_spec(none, "cuda").backend_options  # options as before
    with pytest.raises(ServerConfigError, match="--memory-reserve-gib"):
        ServerConfig(artifact="a.ninfer", memory_reserve_gib=-1)


def test_gpu_share_reaches_the_actors_ray_options() -> None:
    from ninfer.actors.actor_start import actor_options

    cfg = config_from_args(_parser().parse_args(["serve", "a.ninfer", "--gpu-share", "0.25"]))

    def gpus(c: ServerConfig, backend: str) -> float:
        return actor_options(actor_spec(c, backend), name="x", namespace="n", detached=False)["num_gpus"]

    assert gpus(cfg, "cuda") == 0.25
    assert gpus(cfg, "reference") == 0
    assert gpus(config_from_args(_parser().parse_args(["serve", "a.ninfer"])), "cuda") == 1
    for bad in (0, -0.5, 1.5):
        with pytest.raises(ServerConfigError, match="--gpu-share"):
            ServerConfig(artifact="a.ninfer", gpu_share=bad)


def test_host_cache_gib_reaches_the_engine_config() -> None:
    a = _parser().parse_args(["serve", "a.ninfer", "--host-cache-gib", "12"])
    assert config_from_args(a).engine.host_cache_gib == 12
    assert config_from_args(_parser().parse_args(["serve", "a.ninfer"])).engine.host_cache_gib is None  # auto
    with pytest.raises(ServerConfigError, match="--host-cache-gib"):
        config_from_args(_parser().parse_args(["serve", "a.ninfer", "--host-cache-gib", "-1"]))


def test_null_busy_reaches_the_null_runner() -> None:
    """``--null-busy`` (benchmarks of the stack): the null backend's step spins instead of sleeping."""
    a = _parser().parse_args(["serve", "a.ninfer", "--null-step-ms", "0.5", "--null-busy"])
    assert actor_spec(config_from_args(a), "null").backend_options == {"step_s": 0.0005, "busy": True}
    b = _parser().parse_args(["serve", "a.ninfer"])
    assert actor_spec(config_from_args(b), "null").backend_options == {"step_s": 0.0015, "busy": False}


def test_prompt_tokens_details_is_off_unless_asked() -> None:
    """Chat usage reports the prefix-cache hits only with --prompt-tokens-details (docs/serving.md, Usage)."""
    assert not config_from_args(_parser().parse_args(["serve", "a.ninfer"])).prompt_tokens_details
    on = _parser().parse_args(["serve", "a.ninfer", "--prompt-tokens-details"])
    assert config_from_args(on).prompt_tokens_details
