"""Engine replicas with synthetic weights: a registered model's shape, random weights built on the GPU
(perf/synthetic.py), the given artifact's tokenizer, chat template and generation defaults (the demo artifact's).

``python -m perf.bench_replicas serve-synthetic MODEL PROFILE SERVE_ARGS...`` runs ``ninfer serve SERVE_ARGS``
with its engine actors of this class: the same server, router and engine, only the weights differ.
"""

from __future__ import annotations

import sys
from typing import Any

from ninfer.actors.engine_actor import EngineActor

__all__ = ["SyntheticReplica", "serve_synthetic"]


class _Resources:
    """The artifact's resources under the synthetic model's identity and config."""

    def __init__(self, art: Any, model_config: Any, model_id: str) -> None:
        self.model_config, self.model_id, self._art = model_config, model_id, art

    def resource(self, name: str) -> bytes | None:
        return self._art.resource(name)


class SyntheticReplica(EngineActor):
    """An engine actor whose model is ``model`` (a registered identity) at ``profile``, with synthetic weights."""

    model = "qwen3.6-27b"
    profile = "nvfp4"

    def _open_engine(self, spec: Any) -> Any:  # overrides EngineActor's loader (a staticmethod there)
        from ninfer.actors import _engine_adapter as adapter

        from ninfer import model as models
        from ninfer.artifact import open_artifact
        from ninfer.artifact.registry import MODELS
        from ninfer.cuda.model import CudaQwen36
        from perf.synthetic import synthetic_tensors

        mc = MODELS[self.model].config

        def load(path: Any, backend: str = "cuda", **kw: Any) -> Any:
            art = open_artifact(path, verify="manifest")
            net = CudaQwen36(mc, synthetic_tensors(mc, self.profile), **(kw.get("backend_options") or {}))
            return models.Model(_Resources(art, mc, self.model), net, "cuda")

        real, models.load = models.load, load  # this actor process only: models.open_engine loads through it
        try:
            return adapter.open_engine(spec)
        finally:
            models.load = real


def serve_synthetic(model: str, profile: str, serve_args: list[str]) -> int:
    """``ninfer serve SERVE_ARGS`` whose engine actors are ``SyntheticReplica`` of ``model`` at ``profile``."""
    import argparse

    from ninfer.api.cli import check_artifact, config_from_args, register
    from ninfer.api.server import serve

    p = argparse.ArgumentParser(prog="serve-synthetic")
    register(p.add_subparsers(dest="cmd"))
    args = p.parse_args(["serve", *serve_args])
    cfg = config_from_args(args)
    check_artifact(cfg)
    cls = type("SyntheticReplica", (SyntheticReplica,), {"model": model, "profile": profile})
    return serve(cfg, argv=list(sys.argv), actor_cls=cls)
