"""Client: a blocking client of the iris.v1.Iris service."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal, overload

import grpc

from ._proto import iris_pb2, iris_pb2_grpc
from .channel import Certificates, ChannelOptions, auth_metadata, open_channel
from .errors import raising_iris_errors
from .request import ImageInput, Message, build_request
from .results import Reply
from .stream import Stream


class _ClientBase:
    """What Client and AsyncClient share: the channel, its stub, the auth metadata and the
    default deadline."""

    def __init__(self, channel: Any, token: str | None, timeout: float | None) -> None:
        self._channel = channel
        self._stub = iris_pb2_grpc.IrisStub(channel)
        self._metadata = auth_metadata(token)
        self._timeout = timeout

    def _deadline(self, timeout: float | None) -> float | None:
        return self._timeout if timeout is None else timeout

    def _call_options(self, timeout: float | None) -> dict[str, Any]:
        """The keyword arguments of every stub call: the deadline and the auth metadata."""
        return {"timeout": self._deadline(timeout), "metadata": self._metadata}


class Client(_ClientBase):
    """A connection to an iris server.

    ``target`` is ``"host:port"``. ``token`` is sent as ``authorization: Bearer <token>`` on
    every call. ``root_certificates`` (PEM bytes or a file path) makes the channel TLS;
    ``timeout`` (seconds) is the default deadline of every call; ``options`` are gRPC channel
    options. Every failed call raises ``IrisError``. Use as a context manager, or call
    ``close()``.
    """

    def __init__(self, target: str, *, token: str | None = None,
                 root_certificates: Certificates | None = None, timeout: float | None = None,
                 options: ChannelOptions | None = None) -> None:
        super().__init__(open_channel(grpc, target, root_certificates, options), token, timeout)

    @property
    def channel(self) -> grpc.Channel:
        """The underlying gRPC channel (for health checks, reflection and the like)."""
        return self._channel

    @overload
    def generate(self, *, stream: Literal[False] = ..., **kwargs: object) -> Reply: ...
    @overload
    def generate(self, *, stream: Literal[True], **kwargs: object) -> Stream: ...

    def generate(self, *, text: str | None = None, images: Iterable[ImageInput] = (),
                 messages: Sequence[Message] | None = None, stream: bool = False,
                 max_tokens: int | None = None, temperature: float | None = None,
                 top_p: float | None = None, top_k: int | None = None,
                 seed: int | None = None, repetition_penalty: float | None = None,
                 stop: str | Sequence[str] | None = None,
                 stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
                 request_id: str | None = None, min_pixels: int | None = None,
                 max_pixels: int | None = None, skip_special_tokens: bool | None = None,
                 min_tokens: int | None = None, timeout: float | None = None) -> Reply | Stream:
        """Generates a reply.

        Give ``text`` and/or ``images`` (bytes or paths; sent as one user message, the images
        first) or ``messages`` (OpenAI-like dicts, see ``iris_client.request.Message``).
        Sampling arguments left as None take the server's defaults: 16 tokens, and for
        temperature, top_p, top_k and repetition_penalty the model's generation_config.json
        (``model_info().sampling_defaults``; greedy where the server runs with
        ``--generation-config none``).
        ``min_pixels``/``max_pixels`` bound the resize of images that set no bounds of their
        own. ``timeout`` (seconds) overrides the client's default deadline.

        With ``stream=False`` returns a ``Reply`` (one GenerateUnary call). With
        ``stream=True`` returns a ``Stream``: iterate it for the text pieces as they are
        generated, then read ``stream.completion``.
        """
        request = build_request(
            text=text, images=images, messages=messages, max_tokens=max_tokens,
            temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
            repetition_penalty=repetition_penalty, stop=stop, stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos, request_id=request_id, min_pixels=min_pixels,
            max_pixels=max_pixels, skip_special_tokens=skip_special_tokens,
            min_tokens=min_tokens)
        if stream:
            return self.generate_stream_request(request, timeout=timeout)
        return self.generate_request(request, timeout=timeout)

    def generate_request(self, request: iris_pb2.GenerateRequest, *,
                         timeout: float | None = None) -> Reply:
        """Sends a ready-made ``GenerateRequest`` with GenerateUnary."""
        with raising_iris_errors():
            reply = self._stub.GenerateUnary(request, **self._call_options(timeout))
        return Reply.from_proto(reply)

    def generate_stream_request(self, request: iris_pb2.GenerateRequest, *,
                                timeout: float | None = None) -> Stream:
        """Sends a ready-made ``GenerateRequest`` with Generate (streaming)."""
        return Stream(self._stub.Generate(request, **self._call_options(timeout)))

    def model_info(self, *, timeout: float | None = None) -> iris_pb2.ModelInfo:
        """The served model, its dtype, the server's limits and encoder techniques."""
        with raising_iris_errors():
            return self._stub.GetModelInfo(iris_pb2.GetModelInfoRequest(),
                                           **self._call_options(timeout))

    def stats(self, *, timeout: float | None = None) -> iris_pb2.ServerStats:
        """The engine's counters right now (queue, running, KV blocks, encoder cache, ...)."""
        with raising_iris_errors():
            return self._stub.GetStats(iris_pb2.GetStatsRequest(), **self._call_options(timeout))

    def close(self) -> None:
        """Closes the channel; calls still running are cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
