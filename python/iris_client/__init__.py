"""iris_client: a Python client of the iris inference server (iris.v1 over gRPC).

    from iris_client import Client

    with Client("127.0.0.1:50051") as client:
        reply = client.generate(images=["cat.jpg"], text="What is this?", max_tokens=32)
        print(reply.text, reply.finish_reason, reply.usage)

        stream = client.generate(text="Tell me a story.", stream=True)
        for piece in stream:
            print(piece, end="", flush=True)
        print(stream.completion)

``AsyncClient`` (grpc.aio) has the same surface with coroutines; ``python3 -m iris_client``
is the command line. Failed calls raise ``IrisError`` (``.code``, ``.details``).
"""

from ._proto import iris_pb2
from .aio import AsyncClient, AsyncStream
from .client import Client
from .errors import IrisError
from .request import build_request
from .results import Completion, Reply, Timings, Usage
from .stream import Stream

__all__ = [
    "AsyncClient", "AsyncStream", "Client", "Completion", "IrisError", "Reply", "Stream",
    "Timings", "Usage", "build_request", "iris_pb2",
]
