"""IrisError: the one exception the client raises for a failed call."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import grpc


class IrisError(Exception):
    """A call to the server failed.

    ``code`` is the gRPC status code (a ``grpc.StatusCode``) and ``details`` the server's
    message, which for validation errors names the offending field and the limit.
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "IrisError":
        """Converts a ``grpc.RpcError`` (sync or ``grpc.aio``) into an ``IrisError``."""
        code = grpc.StatusCode.UNKNOWN
        details = str(error)
        get_code = getattr(error, "code", None)
        if callable(get_code):
            got = get_code()
            if isinstance(got, grpc.StatusCode):
                code = got
        get_details = getattr(error, "details", None)
        if callable(get_details):
            got = get_details()
            details = got if got is not None else ""
        return cls(code, details)


@contextlib.contextmanager
def raising_iris_errors() -> Iterator[None]:
    """Re-raises a ``grpc.RpcError`` from the ``with`` block as an ``IrisError``."""
    try:
        yield
    except grpc.RpcError as error:
        raise IrisError.from_rpc_error(error) from None
