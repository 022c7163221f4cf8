"""The OpenAI-compatible chat backend: POST /v1/chat/completions with SSE streaming.

Each SSE event whose first choice carries content is one chunk; the usage event
(`stream_options.include_usage`) gives prompt and completion tokens. Images travel as base64
data URLs in `image_url` parts. The server does not report image tokens: where the usage has
no `prompt_tokens_details.image_tokens`, they are estimated with Qwen2.5-VL's resize rule
(recorded as image_tokens_source "estimated"), which only matters for
--text-only-input-tokens.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import ssl as ssl_module
import time
from typing import Optional, Tuple

from .datasets import SampleRequest
from .http_client import HttpClient, SseParser
from .metrics import RequestRecord


def qwen2_5_vl_image_tokens(width: int, height: int, min_pixels: int = 3136,
                            max_pixels: int = 12845056, factor: int = 28) -> int:
    """Image placeholder tokens Qwen2.5-VL uses for a width x height image (smart_resize to
    multiples of 28 within [min_pixels, max_pixels], one token per 28x28)."""
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return (h // factor) * (w // factor)


def split_target(target: str) -> Tuple[str, int]:
    """"host:port" or "[v6]:port" -> (host, port)."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--target must be HOST:PORT, got {target!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class OpenAIChatBackend:
    name = "openai-chat"

    def __init__(self, target: str, endpoint: str = "/v1/chat/completions",
                 model: Optional[str] = None, token: Optional[str] = None,
                 tls_ca: Optional[str] = None, timeout_s: Optional[float] = None,
                 sampling: Optional[dict] = None):
        self.host, self.port = split_target(target)
        self.endpoint = endpoint if endpoint.startswith("/") else "/" + endpoint
        self.model = model
        self.token = token
        self.timeout_s = timeout_s
        self.sampling = dict(sampling or {"temperature": 0.0})  # body fields (top_k: vLLM's extension)
        self.ssl = None
        if tls_ca:
            self.ssl = ssl_module.create_default_context(cafile=tls_ca)
        self.client: Optional[HttpClient] = None

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    async def start(self) -> None:
        self.client = HttpClient(self.host, self.port, self.ssl)
        if not self.model:
            self.model = await self._first_model()

    async def _first_model(self) -> str:
        resp, _ = await self.client.request("GET", "/v1/models", headers=self._headers())
        body = await resp.read_body(1 << 20)
        await self.client.release(resp)
        if resp.status != 200:
            raise RuntimeError(f"GET /v1/models answered HTTP {resp.status} {resp.reason}; pass --model")
        try:
            return json.loads(body)["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise RuntimeError("GET /v1/models listed no model; pass --model") from None

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None

    @staticmethod
    def _first_message(req: SampleRequest) -> dict:
        content = []
        if req.image is not None:
            b64 = base64.b64encode(req.image).decode("ascii")
            content.append({"type": "image_url",
                            "image_url": {"url": f"data:{req.image_mime or 'image/jpeg'};base64,{b64}"}})
        content.append({"type": "text", "text": req.prompt})
        return {"role": "user", "content": content}

    def prepare(self, req: SampleRequest, request_id: str):
        """The request body, encoded once before the run (base64 included)."""
        return self._payload(req, request_id, [self._first_message(req)])

    def prepare_follow_up(self, req: SampleRequest, request_id: str, reply: str):
        """Turn 2 of a multi-turn request: turn 1's message (the same image), the assistant's
        reply, then req.follow_up."""
        messages = [self._first_message(req), {"role": "assistant", "content": reply},
                    {"role": "user", "content": [{"type": "text", "text": req.follow_up}]}]
        return self._payload(req, request_id, messages)

    def _payload(self, req: SampleRequest, request_id: str, messages: list) -> dict:
        body = {
            "model": None,  # filled in at send time (the model may come from /v1/models)
            "messages": messages,
            "max_tokens": req.output_len,
            "max_completion_tokens": req.output_len,
            **self.sampling,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        # Everything but the model is serialized now; the model is spliced in at send time.
        encoded = json.dumps(body, separators=(",", ":"))
        assert encoded.startswith('{"model":null,')
        return {"request_id": request_id, "tail": encoded[len('{"model":null,'):].encode("utf-8"),
                "output_len": req.output_len, "image_size": req.image_size}

    async def send(self, payload, record: RequestRecord, bench_start: float) -> None:
        record.request_id = payload["request_id"]
        record.expected_output_len = payload["output_len"]
        body = b'{"model":' + json.dumps(self.model).encode("utf-8") + b"," + payload["tail"]
        headers = self._headers()
        headers["X-Request-Id"] = payload["request_id"]
        st = time.perf_counter()
        record.start_time = st - bench_start
        try:
            if self.timeout_s:
                await asyncio.wait_for(self._stream(body, headers, record, st), self.timeout_s)
            else:
                await self._stream(body, headers, record, st)
        except asyncio.TimeoutError:
            record.success = False
            record.error = f"timeout: no complete reply within {self.timeout_s:g} s"
        except Exception as e:
            record.success = False
            msg = str(e).splitlines()[0] if str(e) else ""
            record.error = f"{type(e).__name__}: {msg}".rstrip(": ")
        if record.success and record.image_tokens is None and payload["image_size"]:
            w, h = payload["image_size"]
            record.image_tokens = qwen2_5_vl_image_tokens(w, h)
            record.image_tokens_source = "estimated"
        if not record.success:
            record.latency = time.perf_counter() - st

    async def _stream(self, body: bytes, headers: dict, record: RequestRecord, st: float) -> None:
        resp, _ = await self.client.request("POST", self.endpoint, body, headers)
        try:
            if resp.status != 200:
                text = (await resp.read_body()).decode("utf-8", errors="replace")
                message = text.strip()
                try:
                    err = json.loads(text)
                    if isinstance(err, dict):
                        e = err.get("error", err)
                        message = e.get("message", message) if isinstance(e, dict) else str(e)
                except ValueError:
                    pass
                message = " ".join(message.split())[:200]
                record.error = f"HTTP {resp.status} {resp.reason}: {message}".rstrip(": ")
                return
            parser = SseParser()
            last = st
            texts = []
            done = False
            usage = None
            stream_error = None

            def handle(events, now):
                nonlocal last, done, usage, stream_error
                for data in events:
                    if data.strip() == "[DONE]":
                        done = True
                        continue
                    obj = json.loads(data)
                    if not isinstance(obj, dict):
                        continue
                    if obj.get("error"):
                        e = obj["error"]
                        stream_error = e.get("message", str(e)) if isinstance(e, dict) else str(e)
                    choices = obj.get("choices") or []
                    if choices:
                        delta = choices[0].get("delta") or {}
                        content = delta.get("content") or delta.get("reasoning_content") or ""
                        if content:
                            record.add_chunk(now, st, last)
                            last = now
                            texts.append(content)
                        if choices[0].get("finish_reason"):
                            record.finish_reason = str(choices[0]["finish_reason"])
                    if obj.get("usage"):
                        usage = obj["usage"]

            async for piece in resp.iter_body():
                handle(parser.feed(piece), time.perf_counter())
            handle(parser.finish(), time.perf_counter())
            record.generated_text = "".join(texts)
            record.counted_tokens = record.chunks
            if usage:
                if usage.get("completion_tokens") is not None:
                    record.output_tokens = int(usage["completion_tokens"])
                if usage.get("prompt_tokens") is not None:
                    record.prompt_tokens = int(usage["prompt_tokens"])
                details = usage.get("prompt_tokens_details") or {}
                if isinstance(details, dict) and details.get("image_tokens") is not None:
                    record.image_tokens = int(details["image_tokens"])
            if stream_error is not None:
                record.error = f"stream error: {' '.join(str(stream_error).split())[:200]}"
            elif record.chunks == 0:
                record.error = "no chunk with content was received"
            else:
                record.latency = last - st
                record.success = True
                if not done:
                    record.finish_reason = record.finish_reason or "no [DONE]"
        finally:
            await self.client.release(resp)
