"""The supervisor's HTTP server: the dashboard at ``/`` (assets shipped in this package) and the JSON API under
``/api`` that it uses (docs/supervisor.md lists the routes).

With an admin key file every ``/api`` route needs ``Authorization: Bearer KEY`` or ``X-Admin-Key: KEY``
(compared in constant time); the dashboard's own page and assets hold no data and stay open. Errors are
``{"error": {"message", "code"}}``. Nothing here shows the engine's API keys: the configuration names the key
file, never its contents.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import time
from importlib import resources
from typing import Any

import msgspec
from litestar import Litestar, MediaType, Request, Response, get, post, put
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException
from litestar.handlers import BaseRouteHandler

from .activity import RequestLog, Sampler
from .catalog import PresetRefused
from .config import ConfigError
from .lifecycle import Supervisor

__all__ = ["build_app", "ApiError"]

_ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css", "index.html": "text/html"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra


def _json(obj: Any, status: int = 200) -> Response[bytes]:
    return Response(msgspec.json.encode(obj), status_code=status, media_type=MediaType.JSON)


def _state(request: Request[Any, Any, Any]) -> Any:
    return request.app.state


def _query_num(request: Request[Any, Any, Any], name: str, default: float) -> float:
    raw = request.query_params.get(name)
    try:
        return default if raw is None else float(raw)
    except ValueError:
        raise ApiError(400, f"query parameter {name!r} must be a number", "invalid_request") from None


def _admin_guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    digest: bytes | None = connection.app.state.admin_digest
    if digest is None:
        return
    auth = connection.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    key = value.strip() if scheme.lower() == "bearer" else connection.headers.get("x-admin-key", "").strip()
    if not key or not hmac.compare_digest(hashlib.sha256(key.encode()).digest(), digest):
        raise ApiError(401, "this route needs the admin key (Authorization: Bearer KEY)", "invalid_admin_key")


def _asset(name: str) -> Response[bytes]:
    if name not in _ASSETS:
        raise ApiError(404, f"no asset {name!r}", "not_found")
    data = resources.files("ninfer.supervisor").joinpath("assets", name).read_bytes()
    return Response(data, media_type=_ASSETS[name], headers={"Cache-Control": "no-cache"})


@get("/", include_in_schema=False)
async def index() -> Response[bytes]:
    return _asset("index.html")


@get("/assets/{name:str}", include_in_schema=False)
async def asset(request: Request[Any, Any, Any]) -> Response[bytes]:
    return _asset(request.path_params["name"])


@get("/api/status", guards=[_admin_guard])
async def status(request: Request[Any, Any, Any]) -> Response[bytes]:
    st = _state(request)
    sup: Supervisor = st.supervisor
    sampler: Sampler = st.sampler
    log: RequestLog = st.reqlog
    cfg = sup.cfg
    gpu = sampler.gpu_status
    reserve = int(cfg.engine.memory_reserve_gib * (1 << 30))
    plan = (log.server_start or {}).get("memory_plan") if sup.status()["pid"] else None
    return _json({
        "supervisor": {"pid": os.getpid(), "uptime_s": time.time() - sup.started_at, "config": sup.config_path,
                       "state_dir": str(sup.state_dir), "admin_key": st.admin_digest is not None},
        "engine": sup.status(),
        "gpu": msgspec.to_builtins(gpu),
        "memory": {"reserve_bytes": reserve, "reserve_gib": cfg.engine.memory_reserve_gib, "plan": plan,
                   "reserve_kept": (gpu.free_bytes >= reserve) if gpu.available else None},
        "presets": [{"name": p.name, "description": p.description, "artifact": p.artifact, "args": list(p.args)}
                    for p in cfg.presets],
        "active": cfg.active,
    })  # fmt: skip


@post("/api/engine/{op:str}", guards=[_admin_guard], status_code=202)
async def engine_op(request: Request[Any, Any, Any]) -> Response[bytes]:
    op = request.path_params["op"]
    if op not in ("start", "stop", "restart"):
        raise ApiError(404, f"no engine operation {op!r} (start, stop, restart)", "not_found")
    _state(request).supervisor.submit(op)
    return _json({"accepted": op}, 202)


async def _body(request: Request[Any, Any, Any]) -> Any:
    try:
        return msgspec.json.decode(await request.body())
    except msgspec.DecodeError as e:
        raise ApiError(400, f"the body is not JSON: {e}", "invalid_request") from None


@post("/api/switch", guards=[_admin_guard], status_code=202)
async def switch(request: Request[Any, Any, Any]) -> Response[bytes]:
    data = await _body(request)
    return await asyncio.to_thread(_switch, request, data)  # the preflight reads (and hashes) the artifact


def _switch(request: Request[Any, Any, Any], data: Any) -> Response[bytes]:
    name = data.get("preset") if isinstance(data, dict) else None
    if not isinstance(name, str):
        raise ApiError(400, 'body must be {"preset": NAME}', "invalid_request")
    sup: Supervisor = _state(request).supervisor
    try:
        check = sup.switch(name)
    except KeyError:
        raise ApiError(404, f"no preset named {name!r}", "preset_not_found") from None
    except PresetRefused as e:
        raise ApiError(409, str(e), "preset_refused") from None
    return _json({"accepted": "switch", "preflight": msgspec.to_builtins(check)}, 202)


@get("/api/config", guards=[_admin_guard])
async def get_config(request: Request[Any, Any, Any]) -> Response[bytes]:
    return _json(_state(request).supervisor.cfg.to_dict())


@put("/api/config", guards=[_admin_guard])
async def put_config(request: Request[Any, Any, Any]) -> Response[bytes]:
    data = await _body(request)
    return await asyncio.to_thread(_put_config, request, data)  # validation opens the artifacts


def _put_config(request: Request[Any, Any, Any], data: Any) -> Response[bytes]:
    sup: Supervisor = _state(request).supervisor
    try:
        cfg, backup = sup.put_config(data)
    except ConfigError as e:
        raise ApiError(400, str(e), "invalid_config", field=e.field) from None
    return _json({"saved": True, "backup": backup, "config": cfg.to_dict(),
                  "note": "applied at the next engine start: restart the engine to apply it"})  # fmt: skip


@get("/api/requests", guards=[_admin_guard])
async def requests_(request: Request[Any, Any, Any]) -> Response[bytes]:
    limit = _query_num(request, "limit", 100)
    return _json(_state(request).reqlog.snapshot(int(max(1, min(limit, 500)))))


@get("/api/metrics", guards=[_admin_guard])
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    return _json({"samples": _state(request).sampler.series(_query_num(request, "since", 0.0))})


@get("/api/engine/log", guards=[_admin_guard], sync_to_thread=True)
def engine_log(request: Request[Any, Any, Any]) -> Response[bytes]:
    from .process import tail_lines

    sup: Supervisor = _state(request).supervisor
    lines = int(max(1, min(_query_num(request, "lines", 50), 500)))
    return _json({"lines": tail_lines(sup.engine_log, lines)})


def _api_error(_: Request[Any, Any, Any], exc: ApiError) -> Response[bytes]:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    body = {"error": {"message": exc.message, "code": exc.code, **exc.extra}}
    return Response(
        msgspec.json.encode(body), status_code=exc.status, media_type=MediaType.JSON, headers=headers
    )


def _http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    body = {"error": {"message": str(exc.detail), "code": {404: "not_found", 405: "method_not_allowed"}.get(
        exc.status_code, "invalid_request")}}  # fmt: skip
    return Response(msgspec.json.encode(body), status_code=exc.status_code, media_type=MediaType.JSON)


def build_app(sup: Supervisor, sampler: Sampler, reqlog: RequestLog, admin_key: str | None) -> Litestar:
    app = Litestar(
        route_handlers=[index, asset, status, engine_op, switch, get_config, put_config, requests_, metrics,
                        engine_log],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error},
        openapi_config=None,
        debug=False,
    )  # fmt: skip
    app.state.supervisor, app.state.sampler, app.state.reqlog = sup, sampler, reqlog
    app.state.admin_digest = hashlib.sha256(admin_key.encode()).digest() if admin_key else None
    return app
