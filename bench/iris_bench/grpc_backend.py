"""The iris gRPC backend: the Iris.Generate streaming RPC over grpc.aio.

Each streamed GenerateResponse with text or token ids is one chunk; the final message's usage
gives prompt, image and completion tokens, and its timings the server-side view.
"""

from __future__ import annotations

import time
from typing import Optional

from .datasets import SampleRequest
from .metrics import RequestRecord
from .proto import load_stubs

_MAX_MESSAGE = 512 * 1024 * 1024


class GrpcBackend:
    name = "grpc"

    def __init__(self, target: str, token: Optional[str] = None, tls_ca: Optional[bytes] = None,
                 timeout_s: Optional[float] = None, image_max_pixels: int = 0,
                 image_min_pixels: int = 0, sampling: Optional[dict] = None):
        self.pb2, self.pb2_grpc = load_stubs()
        import grpc  # noqa: F401  (after the stubs: they import it too)
        self.target = target
        self.token = token
        self.tls_ca = tls_ca
        self.timeout_s = timeout_s
        self.image_max_pixels = image_max_pixels
        self.image_min_pixels = image_min_pixels
        self.sampling = dict(sampling or {"temperature": 0.0})  # SamplingParams fields
        self.channel = None
        self.stub = None

    def _first_message(self, req: SampleRequest):
        pb2 = self.pb2
        content = []
        if req.image is not None:
            content.append(pb2.ContentPart(image=pb2.Image(
                data=req.image, max_pixels=self.image_max_pixels, min_pixels=self.image_min_pixels)))
        content.append(pb2.ContentPart(text=req.prompt))
        return pb2.ChatMessage(role="user", content=content)

    def _request(self, request_id: str, messages, output_len: int):
        pb2 = self.pb2
        sampling = pb2.SamplingParams(max_tokens=output_len, ignore_eos=True, **self.sampling)
        return pb2.GenerateRequest(request_id=request_id, messages=messages, sampling=sampling)

    def prepare(self, req: SampleRequest, request_id: str):
        return self._request(request_id, [self._first_message(req)], req.output_len)

    def prepare_follow_up(self, req: SampleRequest, request_id: str, reply: str):
        """Turn 2 of a multi-turn request: turn 1's message (the same image), the assistant's
        reply, then req.follow_up."""
        pb2 = self.pb2
        messages = [self._first_message(req),
                    pb2.ChatMessage(role="assistant", content=[pb2.ContentPart(text=reply)]),
                    pb2.ChatMessage(role="user", content=[pb2.ContentPart(text=req.follow_up)])]
        return self._request(request_id, messages, req.output_len)

    async def start(self) -> None:
        import grpc
        options = [("grpc.max_send_message_length", _MAX_MESSAGE),
                   ("grpc.max_receive_message_length", _MAX_MESSAGE)]
        if self.tls_ca is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=self.tls_ca)
            self.channel = grpc.aio.secure_channel(self.target, creds, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(self.target, options=options)
        self.stub = self.pb2_grpc.IrisStub(self.channel)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None

    async def send(self, payload, record: RequestRecord, bench_start: float) -> None:
        import grpc
        pb2 = self.pb2
        metadata = (("authorization", f"Bearer {self.token}"),) if self.token else None
        record.request_id = payload.request_id
        record.expected_output_len = payload.sampling.max_tokens
        st = time.perf_counter()
        record.start_time = st - bench_start
        last = st
        final = None
        texts = []
        call = None
        try:
            call = self.stub.Generate(payload, metadata=metadata, timeout=self.timeout_s,
                                      wait_for_ready=False)
            async for resp in call:
                if resp.text or len(resp.token_ids):
                    now = time.perf_counter()
                    record.add_chunk(now, st, last)
                    last = now
                    record.counted_tokens += len(resp.token_ids)
                    texts.append(resp.text)
                if resp.HasField("final"):
                    final = resp.final
            record.generated_text = "".join(texts)
            if record.chunks == 0:
                record.error = "the stream ended without any text or tokens"
            elif final is None:
                record.error = "the stream ended without a final message"
            else:
                usage = final.usage
                record.prompt_tokens = usage.prompt_tokens
                record.image_tokens = usage.image_tokens
                record.output_tokens = usage.completion_tokens
                record.finish_reason = pb2.FinishReason.Name(final.finish_reason)
                t = final.timings
                record.server_timings = {
                    "preprocess_ms": t.preprocess_ms, "queue_ms": t.queue_ms,
                    "encode_ms": t.encode_ms, "prefill_ms": t.prefill_ms,
                    "first_token_ms": t.first_token_ms, "total_ms": t.total_ms}
                record.latency = last - st
                record.success = True
        except grpc.aio.AioRpcError as e:
            details = (e.details() or "").splitlines()
            record.error = f"{e.code().name}: {details[0] if details else ''}".rstrip(": ")
        except Exception as e:  # a client-side fault is still one failed request, not a crash
            record.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
        finally:
            if call is not None and not call.done():
                call.cancel()
        if not record.success:
            record.latency = time.perf_counter() - st
