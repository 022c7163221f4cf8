"""AsyncClient: the asyncio (grpc.aio) twin of Client, with AsyncStream.

Every method is a coroutine, ``generate`` included::

    async with AsyncClient("127.0.0.1:50051") as client:
        reply = await client.generate(text="Hi", max_tokens=8)
        stream = await client.generate(text="Hi", stream=True)
        async for piece in stream:
            print(piece, end="")
        print(stream.completion.finish_reason)

Create the client inside a running event loop (grpc.aio binds the channel to it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Literal, overload

import grpc
import grpc.aio

from ._proto import iris_pb2
from .channel import Certificates, ChannelOptions, open_channel
from .client import _ClientBase
from .errors import IrisError, raising_iris_errors
from .request import ImageInput, Message, build_request
from .results import Reply
from .stream import _StreamBase


class AsyncStream(_StreamBase, AsyncIterator[str]):
    """Async-iterates over the text pieces of a streamed generation (empty pieces skipped).

    The same surface as ``Stream``: ``completion``, ``request_id``, ``text``, ``token_ids``,
    ``cancelled``, ``done``, ``cancel()``, ``await reply()``; ``async with`` cancels on exit,
    and so does leaving an ``async for`` loop early (once the loop's iterator is collected).
    A failed call raises ``IrisError``.
    """

    async def __anext__(self) -> str:
        while not self._done:
            try:
                response = await self._call.read()
            except grpc.RpcError as error:
                self._done = True
                if self._cancelled and error.code() == grpc.StatusCode.CANCELLED:
                    break
                raise IrisError.from_rpc_error(error) from None
            except asyncio.CancelledError:
                if self._cancelled:  # our own cancel() surfaced through read()
                    break
                self.cancel()  # the awaiting task was cancelled: so is the call
                raise
            if response is grpc.aio.EOF:
                self._done = True
                break
            text = self._state.absorb(response)
            if text:
                return text
        raise StopAsyncIteration

    def __aiter__(self) -> AsyncIterator[str]:
        return self._pieces()

    async def _pieces(self) -> AsyncIterator[str]:
        try:
            while True:
                try:
                    piece = await self.__anext__()
                except StopAsyncIteration:
                    return
                yield piece
        finally:
            if not self._done:
                self.cancel()

    async def aclose(self) -> None:
        """Cancels the call if it is still running."""
        self.cancel()

    async def reply(self) -> Reply:
        """Reads the rest of the stream and returns the whole generation as a ``Reply``.
        Raises ``IrisError`` if the call fails, RuntimeError if it was cancelled."""
        async for _ in self:
            pass
        return self._state.reply()

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class AsyncClient(_ClientBase):
    """A ``grpc.aio`` connection to an iris server; arguments as for ``Client``."""

    def __init__(self, target: str, *, token: str | None = None,
                 root_certificates: Certificates | None = None, timeout: float | None = None,
                 options: ChannelOptions | None = None) -> None:
        super().__init__(open_channel(grpc.aio, target, root_certificates, options), token,
                         timeout)

    @property
    def channel(self) -> grpc.aio.Channel:
        """The underlying ``grpc.aio`` channel."""
        return self._channel

    @overload
    async def generate(self, *, stream: Literal[False] = ..., **kwargs: object) -> Reply: ...
    @overload
    async def generate(self, *, stream: Literal[True], **kwargs: object) -> AsyncStream: ...

    async def generate(self, *, text: str | None = None, images: Iterable[ImageInput] = (),
                       messages: Sequence[Message] | None = None, stream: bool = False,
                       max_tokens: int | None = None, temperature: float | None = None,
                       top_p: float | None = None, top_k: int | None = None,
                       seed: int | None = None, repetition_penalty: float | None = None,
                       stop: str | Sequence[str] | None = None,
                       stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
                       request_id: str | None = None, min_pixels: int | None = None,
                       max_pixels: int | None = None, skip_special_tokens: bool | None = None,
                       min_tokens: int | None = None, timeout: float | None = None) -> Reply | AsyncStream:
        """As ``Client.generate``; ``stream=True`` gives an ``AsyncStream`` to ``async for``."""
        request = build_request(
            text=text, images=images, messages=messages, max_tokens=max_tokens,
            temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
            repetition_penalty=repetition_penalty, stop=stop, stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos, request_id=request_id, min_pixels=min_pixels,
            max_pixels=max_pixels, skip_special_tokens=skip_special_tokens,
            min_tokens=min_tokens)
        if stream:
            return self.generate_stream_request(request, timeout=timeout)
        return await self.generate_request(request, timeout=timeout)

    async def generate_request(self, request: iris_pb2.GenerateRequest, *,
                               timeout: float | None = None) -> Reply:
        """Sends a ready-made ``GenerateRequest`` with GenerateUnary."""
        with raising_iris_errors():
            reply = await self._stub.GenerateUnary(request, **self._call_options(timeout))
        return Reply.from_proto(reply)

    def generate_stream_request(self, request: iris_pb2.GenerateRequest, *,
                                timeout: float | None = None) -> AsyncStream:
        """Sends a ready-made ``GenerateRequest`` with Generate (streaming)."""
        return AsyncStream(self._stub.Generate(request, **self._call_options(timeout)))

    async def model_info(self, *, timeout: float | None = None) -> iris_pb2.ModelInfo:
        """The served model, its dtype, the server's limits and encoder techniques."""
        with raising_iris_errors():
            return await self._stub.GetModelInfo(iris_pb2.GetModelInfoRequest(),
                                                 **self._call_options(timeout))

    async def stats(self, *, timeout: float | None = None) -> iris_pb2.ServerStats:
        """The engine's counters right now."""
        with raising_iris_errors():
            return await self._stub.GetStats(iris_pb2.GetStatsRequest(),
                                             **self._call_options(timeout))

    async def close(self) -> None:
        """Closes the channel; calls still running are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
