"""An in-process fake of the iris.v1.Iris service, scripted by the unit tests."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import grpc

from iris_client._proto import iris_pb2, iris_pb2_grpc


class FakeIris(iris_pb2_grpc.IrisServicer):
    """Records every request and its metadata; answers with ``pieces`` (then a final message),
    or aborts with ``error`` = (code, details), or with ``endless`` streams until cancelled
    (setting ``cancelled``), or sleeps ``delay`` seconds first."""

    def __init__(self) -> None:
        self.requests: list[iris_pb2.GenerateRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.pieces: list[str] = ["Hel", "lo", "", " world"]
        self.finish_reason = iris_pb2.FINISH_REASON_STOP
        self.error: tuple[grpc.StatusCode, str] | None = None
        self.endless = False
        self.delay = 0.0
        self.cancelled = threading.Event()
        self.lock = threading.Lock()

    def _record(self, request: Any, context: grpc.ServicerContext) -> None:
        with self.lock:
            self.requests.append(request)
            self.metadata.append({k: v for k, v in context.invocation_metadata()})

    def _completion(self) -> iris_pb2.Completion:
        return iris_pb2.Completion(
            finish_reason=self.finish_reason,
            usage=iris_pb2.Usage(prompt_tokens=12, image_tokens=4,
                                 completion_tokens=len(self.pieces)),
            timings=iris_pb2.Timings(preprocess_ms=1.5, queue_ms=0.25, encode_ms=2.0,
                                     prefill_ms=3.0, first_token_ms=4.0, total_ms=9.5))

    def _start(self, request: Any, context: grpc.ServicerContext) -> str:
        self._record(request, context)
        if self.delay:
            time.sleep(self.delay)
        if self.error is not None:
            context.abort(*self.error)
        return getattr(request, "request_id", "") or "fake-1"

    def Generate(self, request, context):
        request_id = self._start(request, context)
        if self.endless:  # until the client goes away (the callback runs when the RPC ends)
            context.add_callback(self.cancelled.set)
        for i, piece in enumerate(self.pieces):
            yield iris_pb2.GenerateResponse(request_id=request_id, text=piece, token_ids=[100 + i])
        if self.endless:
            while context.is_active():
                yield iris_pb2.GenerateResponse(request_id=request_id, text="x", token_ids=[7])
                time.sleep(0.01)
            return
        yield iris_pb2.GenerateResponse(request_id=request_id, final=self._completion())

    def GenerateUnary(self, request, context):
        request_id = self._start(request, context)
        return iris_pb2.GenerateReply(
            request_id=request_id, text="".join(self.pieces),
            token_ids=[100 + i for i in range(len(self.pieces))], completion=self._completion())

    def GetModelInfo(self, request, context):
        self._start(request, context)
        return iris_pb2.ModelInfo(model="fake", model_type="qwen2_5_vl", dtype="f32",
                                  vocab_size=1000, limits=iris_pb2.Limits(max_tokens=64))

    def GetStats(self, request, context):
        self._start(request, context)
        return iris_pb2.ServerStats(kv_blocks_total=10, kv_blocks_used=3, running=1)


class FakeServer:
    """A grpc server on 127.0.0.1 (a free port) serving a FakeIris; TLS when given PEM files."""

    def __init__(self, cert_pem: bytes | None = None, key_pem: bytes | None = None) -> None:
        self.servicer = FakeIris()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        iris_pb2_grpc.add_IrisServicer_to_server(self.servicer, self.server)
        if cert_pem is not None and key_pem is not None:
            credentials = grpc.ssl_server_credentials([(key_pem, cert_pem)])
            self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
        else:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(grace=None).wait(5)
