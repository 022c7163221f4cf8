"""Plain dataclasses for what the server answers (Reply, Completion, Usage, Timings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._proto import iris_pb2


@dataclass(frozen=True)
class Usage:
    """Token counts of one request; ``prompt_tokens`` includes ``image_tokens``."""

    prompt_tokens: int = 0
    image_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def from_proto(cls, usage: iris_pb2.Usage) -> "Usage":
        return cls(usage.prompt_tokens, usage.image_tokens, usage.completion_tokens)


@dataclass(frozen=True)
class Timings:
    """Server-side timings in milliseconds (see ``iris.v1.Timings``)."""

    preprocess_ms: float = 0.0
    queue_ms: float = 0.0
    encode_ms: float = 0.0
    prefill_ms: float = 0.0
    first_token_ms: float = 0.0
    total_ms: float = 0.0

    @classmethod
    def from_proto(cls, timings: iris_pb2.Timings) -> "Timings":
        return cls(timings.preprocess_ms, timings.queue_ms, timings.encode_ms,
                   timings.prefill_ms, timings.first_token_ms, timings.total_ms)


def finish_reason_name(value: int) -> str:
    """``FINISH_REASON_STOP`` -> ``"stop"``, ``"length"``, ``"cancelled"``, ``"unspecified"``."""
    try:
        name = iris_pb2.FinishReason.Name(value)
    except ValueError:
        return f"unknown({value})"
    return name.removeprefix("FINISH_REASON_").lower()


@dataclass(frozen=True)
class Completion:
    """How a generation ended: finish reason (``"stop"``, ``"length"``, ``"cancelled"``),
    token usage and server timings."""

    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)

    @classmethod
    def from_proto(cls, completion: iris_pb2.Completion) -> "Completion":
        return cls(finish_reason_name(completion.finish_reason),
                   Usage.from_proto(completion.usage), Timings.from_proto(completion.timings))


@dataclass(frozen=True)
class Reply:
    """A whole generation: the text, its token ids and how it ended."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)

    @classmethod
    def from_proto(cls, reply: iris_pb2.GenerateReply) -> "Reply":
        completion = Completion.from_proto(reply.completion)
        return cls(reply.request_id, reply.text, list(reply.token_ids),
                   completion.finish_reason, completion.usage, completion.timings)

    @property
    def completion(self) -> Completion:
        """The finish reason, usage and timings as one ``Completion``."""
        return Completion(self.finish_reason, self.usage, self.timings)
