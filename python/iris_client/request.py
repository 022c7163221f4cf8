"""Builds an ``iris.v1.GenerateRequest`` from the client's keyword arguments."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

from ._proto import iris_pb2

#: An image: its encoded bytes, or the path of a file holding them.
ImageInput = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]
#: One chat message, OpenAI-like: ``{"role": "user", "content": "text" | [part, ...]}`` where a
#: part is ``{"type": "text", "text": ...}`` or ``{"type": "image", "image": bytes | path,
#: "min_pixels": n, "max_pixels": n}`` (the pixel bounds optional).
Message = Mapping[str, Any]


def read_image(image: ImageInput) -> bytes:
    """Returns the encoded bytes of ``image`` (bytes as they are, a path read from disk)."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, (str, os.PathLike)):
        with open(image, "rb") as f:
            return f.read()
    raise TypeError(f"an image must be bytes or a path, not {type(image).__name__}")


def _image_part(image: ImageInput, min_pixels: int | None, max_pixels: int | None
                ) -> iris_pb2.ContentPart:
    part = iris_pb2.ContentPart()
    part.image.data = read_image(image)
    if min_pixels is not None:
        part.image.min_pixels = min_pixels
    if max_pixels is not None:
        part.image.max_pixels = max_pixels
    return part


def _content_part(part: Any, index: str, min_pixels: int | None, max_pixels: int | None
                  ) -> iris_pb2.ContentPart:
    if isinstance(part, str):
        return iris_pb2.ContentPart(text=part)
    if not isinstance(part, Mapping):
        raise TypeError(f"{index}: a content part must be a dict or a str")
    kind = part.get("type")
    if kind == "text":
        return iris_pb2.ContentPart(text=part.get("text", ""))
    if kind == "image":
        if "image" not in part:
            raise ValueError(f"{index}: an image part needs an 'image' (bytes or path)")
        return _image_part(part["image"], part.get("min_pixels", min_pixels),
                           part.get("max_pixels", max_pixels))
    raise ValueError(f"{index}: unknown content part type {kind!r} (expected 'text' or 'image')")


def build_messages(messages: Sequence[Message], min_pixels: int | None = None,
                   max_pixels: int | None = None) -> list[iris_pb2.ChatMessage]:
    """Converts OpenAI-like message dicts to ``ChatMessage``s. Roles are sent as given (the
    server validates them); ``min_pixels``/``max_pixels`` apply to images that set none."""
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{i}] must be a dict")
        chat = iris_pb2.ChatMessage(role=message.get("role", ""))
        content = message.get("content", "")
        if isinstance(content, str):
            chat.content.append(iris_pb2.ContentPart(text=content))
        else:
            for j, part in enumerate(content):
                chat.content.append(
                    _content_part(part, f"messages[{i}].content[{j}]", min_pixels, max_pixels))
        out.append(chat)
    return out


def build_request(*, text: str | None = None, images: Iterable[ImageInput] = (),
                  messages: Sequence[Message] | None = None, max_tokens: int | None = None,
                  temperature: float | None = None, top_p: float | None = None,
                  top_k: int | None = None, seed: int | None = None,
                  repetition_penalty: float | None = None, stop: str | Sequence[str] | None = None,
                  stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
                  request_id: str | None = None, min_pixels: int | None = None,
                  max_pixels: int | None = None, skip_special_tokens: bool | None = None,
                  min_tokens: int | None = None) -> iris_pb2.GenerateRequest:
    """Builds a ``GenerateRequest``.

    Either ``text``/``images`` (one user message: the images first, then the text, as Qwen's
    chat does) or ``messages`` (see ``Message``), not both. Sampling fields are set only when
    given, so the server's defaults apply to the rest. Values are not range-checked here: the
    server does that and answers INVALID_ARGUMENT naming the field.
    """
    images = list(images)
    if messages is not None:
        if text is not None or images:
            raise ValueError("pass either text/images or messages, not both")
        chat = build_messages(messages, min_pixels, max_pixels)
    else:
        if text is None and not images:
            raise ValueError("nothing to send: pass text, images or messages")
        user = iris_pb2.ChatMessage(role="user")
        for image in images:
            user.content.append(_image_part(image, min_pixels, max_pixels))
        if text is not None:
            user.content.append(iris_pb2.ContentPart(text=text))
        chat = [user]

    request = iris_pb2.GenerateRequest(messages=chat)
    if request_id is not None:
        request.request_id = request_id
    if skip_special_tokens is not None:
        request.skip_special_tokens = skip_special_tokens
    sampling = request.sampling
    if max_tokens is not None:
        sampling.max_tokens = max_tokens
    if temperature is not None:
        sampling.temperature = temperature
    if top_p is not None:
        sampling.top_p = top_p
    if top_k is not None:
        sampling.top_k = top_k
    if seed is not None:
        sampling.seed = seed
    if repetition_penalty is not None:
        sampling.repetition_penalty = repetition_penalty
    if stop is not None:
        sampling.stop.extend([stop] if isinstance(stop, str) else list(stop))
    if stop_token_ids is not None:
        sampling.stop_token_ids.extend(stop_token_ids)
    if ignore_eos:
        sampling.ignore_eos = True
    if min_tokens is not None:
        sampling.min_tokens = min_tokens
    return request
