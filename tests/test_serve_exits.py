"""How `ninfer serve` ends when it cannot or should not go on: a CUDA backend with no GPU (refused before Ray
starts, status 2) and Ctrl-C (status 130, no traceback) — before the model is up and while serving."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
from ninfer.api import server
from ninfer.api.config import ServerConfig

from ninfer import cli


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> str:
    from ninfer.demo import build_demo

    return build_demo(tmp_path_factory.mktemp("serve_exits") / "demo.ninfer")


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray is neither started nor shut down (a test that reaches ``_start_ray`` unexpectedly fails)."""

    def start(cfg: ServerConfig) -> None:
        raise AssertionError("Ray started")

    monkeypatch.setattr(server, "_start_ray", start)
    monkeypatch.setattr(server.ray, "shutdown", lambda: None)


@pytest.mark.parametrize(
    ("backend", "arch", "gpus", "address", "refused"),
    [
        ("cuda", "qwen3_5", 0, None, "no GPU is visible"),
        ("cuda", "qwen3_5", 0, "ray://head:10001", None),  # the cluster may have a GPU elsewhere
        ("cuda", "qwen3_5", 1, None, None),
        ("cuda", "qwen4_exp", 1, None, "no kernels for architecture 'qwen4_exp'"),
        ("cuda", None, 1, None, "no kernels for upstream v1 artifacts"),
        ("reference", "qwen3_5", 0, None, None),
    ],
)
def test_cuda_refusal(
    backend: str, arch: str | None, gpus: int, address: str | None, refused: str | None
) -> None:
    got = server.cuda_refusal(
        ServerConfig(artifact="a.ninfer", ray_address=address), backend, arch, gpus=gpus
    )
    assert got is None if refused is None else refused in got


def test_cuda_without_a_gpu_is_one_line_and_status_2(
    demo: str, no_ray: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before Ray starts: the actor would otherwise wait forever for a GPU Ray cannot place it on."""
    monkeypatch.setattr(server, "visible_gpus", lambda: 0)
    assert cli.main(["serve", demo, "--backend", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--backend cuda: no GPU is visible" in err[0], err
    assert err[0].startswith("ninfer serve: error:")


def test_ctrl_c_while_the_model_loads_is_status_130(
    demo: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(server, "_start_ray", lambda cfg: None)
    monkeypatch.setattr(server.ray, "shutdown", lambda: None)

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(server, "_start_engines", interrupted)
    assert cli.main(["serve", demo, "--backend", "reference"]) == 130
    err = capsys.readouterr().err
    assert "ninfer serve: interrupted" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("signals", "raised", "status"),
    [
        ([signal.SIGINT], None, 130),  # Ctrl-C: drained, then the shell's status for SIGINT
        ([signal.SIGTERM], None, 0),  # the supervisor's graceful stop
        ([signal.SIGINT, signal.SIGINT], KeyboardInterrupt, 130),  # a second Ctrl-C: uvicorn re-raises it
        ([signal.SIGTERM, signal.SIGTERM], SystemExit, 0),  # Ray's driver SIGTERM handler
    ],
)
def test_a_signal_while_serving_ends_the_server_with_its_status(
    demo: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    signals: list[int],
    raised: type | None,
    status: int,
) -> None:
    """The first SIGINT or SIGTERM drains (DrainingServer records it) and uvicorn returns; a second one is
    uvicorn's own exit, re-raised once it has shut down. Ctrl-C is 130 either way, SIGTERM 0; no traceback."""

    class Stopped:
        started = True

        def __init__(self) -> None:
            self.signals: list[int] = []

        def run(self) -> None:
            self.signals.extend(signals)
            if raised is not None:
                raise raised

    info = SimpleNamespace(model_id="ninfer-demo", max_context=64)
    monkeypatch.setattr(server, "_start_ray", lambda cfg: None)
    monkeypatch.setattr(server.ray, "shutdown", lambda: None)
    monkeypatch.setattr(server, "_start_engines", lambda cfg, spec, cls: (object(), None, [], info))
    monkeypatch.setattr(server, "build_app", lambda svc, keyring: None)
    monkeypatch.setattr(server, "_http_server", lambda cfg, app, drain: Stopped())
    assert cli.main(["serve", demo, "--backend", "reference"]) == status
    err = capsys.readouterr().err
    assert "shutting down" in err and "Traceback" not in err


def test_the_draining_server_records_the_stop_signal() -> None:
    import uvicorn
    from ninfer.api.gate import Drain, DrainingServer

    srv = DrainingServer(uvicorn.Config(app=None), Drain(1.0))
    srv.handle_exit(signal.SIGINT, None)
    assert srv.signals == [signal.SIGINT] and srv.drain.requested and not srv.should_exit
