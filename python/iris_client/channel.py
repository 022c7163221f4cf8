"""Channel settings shared by Client and AsyncClient: credentials, auth metadata, options."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Union

import grpc

#: PEM root certificates: the bytes, or the path of a file holding them.
Certificates = Union[bytes, str, "os.PathLike[str]"]
#: gRPC channel options, e.g. ``[("grpc.ssl_target_name_override", "localhost")]``.
ChannelOptions = Sequence[tuple[str, Any]]


def read_certificates(root_certificates: Certificates) -> bytes:
    """Returns PEM bytes (bytes as they are, a path read from disk)."""
    if isinstance(root_certificates, (bytes, bytearray)):
        return bytes(root_certificates)
    with open(root_certificates, "rb") as f:
        return f.read()


def channel_credentials(root_certificates: Certificates | None
                        ) -> grpc.ChannelCredentials | None:
    """TLS credentials trusting ``root_certificates``; None means a plaintext channel."""
    if root_certificates is None:
        return None
    return grpc.ssl_channel_credentials(root_certificates=read_certificates(root_certificates))


def open_channel(api: Any, target: str, root_certificates: Certificates | None,
                 options: ChannelOptions | None) -> Any:
    """A channel to ``target`` made by ``api`` (the ``grpc`` or the ``grpc.aio`` module): TLS
    trusting ``root_certificates`` when they are given, else plaintext."""
    credentials = channel_credentials(root_certificates)
    opts = channel_options(options)
    if credentials is None:
        return api.insecure_channel(target, options=opts)
    return api.secure_channel(target, credentials, options=opts)


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The ``authorization: Bearer <token>`` metadata, or none without a token."""
    if token is None:
        return ()
    return (("authorization", f"Bearer {token}"),)


def channel_options(options: ChannelOptions | None) -> list[tuple[str, Any]]:
    """The caller's options; replies of any size are accepted unless the caller says otherwise
    (the request size limit is the server's to enforce)."""
    merged = dict(options or ())
    merged.setdefault("grpc.max_receive_message_length", -1)
    return list(merged.items())
