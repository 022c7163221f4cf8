"""Stream: the pieces of a streamed generation, then its completion."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from ._proto import iris_pb2
from .errors import IrisError
from .results import Completion, Reply


class StreamState:
    """What a stream has received so far (shared by Stream and AsyncStream)."""

    def __init__(self) -> None:
        self.request_id: str = ""
        self.token_ids: list[int] = []
        self.pieces: list[str] = []
        self.completion: Completion | None = None

    def absorb(self, response: iris_pb2.GenerateResponse) -> str:
        """Records one response message and returns its text."""
        if response.request_id:
            self.request_id = response.request_id
        self.token_ids.extend(response.token_ids)
        if response.text:
            self.pieces.append(response.text)
        if response.HasField("final"):
            self.completion = Completion.from_proto(response.final)
        return response.text

    def reply(self) -> Reply:
        if self.completion is None:
            raise RuntimeError("the stream has not completed")
        return Reply(self.request_id, "".join(self.pieces), list(self.token_ids),
                     self.completion.finish_reason, self.completion.usage,
                     self.completion.timings)


class _StreamBase:
    """What Stream and AsyncStream share: the call, what it has received, and cancel()."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._state = StreamState()
        self._done = False
        self._cancelled = False

    @property
    def request_id(self) -> str:
        """The request's id as the server echoes it ("" before the first message)."""
        return self._state.request_id

    @property
    def text(self) -> str:
        """The text received so far."""
        return "".join(self._state.pieces)

    @property
    def token_ids(self) -> list[int]:
        """The token ids received so far."""
        return self._state.token_ids

    @property
    def completion(self) -> Completion | None:
        """How the generation ended; None until the final message has arrived."""
        return self._state.completion

    @property
    def cancelled(self) -> bool:
        """True when this client cancelled the call before it completed."""
        return self._cancelled

    @property
    def done(self) -> bool:
        """True once the call has ended (completed, failed or cancelled)."""
        return self._done

    def cancel(self) -> None:
        """Cancels the call if it is still running (the server frees its resources at once)."""
        if not self._done:
            self._cancelled = True
            self._done = True
            self._call.cancel()


class Stream(_StreamBase, Iterator[str]):
    """Iterates over the text pieces of a streamed generation (empty pieces are skipped).

    After the iteration ends, ``completion`` holds the finish reason, usage and timings, and
    ``request_id``, ``text`` and ``token_ids`` the whole reply. ``cancel()`` (or ``close()``,
    leaving a ``with`` block, or breaking out of a ``for`` loop over the stream) cancels the
    call; the iteration then simply ends and ``cancelled`` is True. A failed call raises
    ``IrisError``.
    """

    def __next__(self) -> str:
        while not self._done:
            try:
                response = next(self._call)
            except StopIteration:
                self._done = True
                break
            except grpc.RpcError as error:
                self._done = True
                if self._cancelled and error.code() == grpc.StatusCode.CANCELLED:
                    break
                raise IrisError.from_rpc_error(error) from None
            text = self._state.absorb(response)
            if text:
                return text
        raise StopIteration

    def __iter__(self) -> Iterator[str]:
        # A generator, so that leaving a for loop early (break, exception) cancels the call
        # as soon as the loop drops it.
        try:
            while True:
                try:
                    piece = next(self)
                except StopIteration:
                    return
                yield piece
        finally:
            if not self._done:
                self.cancel()

    close = _StreamBase.cancel

    def reply(self) -> Reply:
        """Reads the rest of the stream and returns the whole generation as a ``Reply``.
        Raises ``IrisError`` if the call fails, RuntimeError if it was cancelled."""
        for _ in self:
            pass
        return self._state.reply()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def __del__(self) -> None:
        try:
            self.cancel()
        except Exception:  # noqa: BLE001 - nothing useful to do at garbage collection
            pass
