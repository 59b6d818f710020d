"""API errors and the OpenAI error body.

Every failure the API reports is an :class:`ApiError`; one exception handler turns it into
``{"error": {"message", "type", "param", "code"}}`` (docs/protocols.md §3), so no handler builds error bodies itself.
"""

from __future__ import annotations

import re

import msgspec

__all__ = ["ApiError", "ErrorBody", "ErrorDetail", "error_json", "validation_param"]


class ErrorDetail(msgspec.Struct, kw_only=True):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct, kw_only=True):
    error: ErrorDetail


class ApiError(Exception):
    """A request failure with its HTTP status, OpenAI ``code`` and the offending field (``param``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.retry_after = retry_after

    @property
    def type(self) -> str:
        return "internal_error" if self.status >= 500 else "invalid_request_error"

    def body(self) -> ErrorBody:
        return ErrorBody(
            error=ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        )

    def headers(self) -> dict[str, str]:
        out = {}
        if self.retry_after is not None:
            out["Retry-After"] = str(max(1, int(round(self.retry_after))))
        if self.status == 401:  # RFC 9110 §15.5.2: a 401 names the scheme it wants
            out["WWW-Authenticate"] = 'Bearer realm="ninfer"'
        if self.status == 408:  # the body never arrived: what is left of it is not read (RFC 9110 §15.5.9)
            out["Connection"] = "close"
        return out


def error_json(err: ApiError) -> bytes:
    return msgspec.json.encode(err.body())


def validation_param(err: msgspec.ValidationError) -> str | None:
    """The field path of a msgspec validation error as ``messages[0].role``: the ``- at `$...``` suffix, plus
    the field name of a "missing required field" message."""
    text = str(err)
    path = ""
    i = text.rfind("- at `$")
    if i >= 0:
        path = text[i + len("- at `$") :].rstrip("`").lstrip(".")
    m = re.search(r"missing required field `([^`]+)`", text)
    if m:
        path = f"{path}.{m.group(1)}" if path else m.group(1)
    return path or None
