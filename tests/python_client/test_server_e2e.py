"""iris_client against a real iris-server on the tiny synthetic model: replies equal
iris-generate's, health and reflection, every validation rule (status code + field named),
cancellation/deadlines/disconnects free the KV cache, auth, TLS, SIGTERM draining, and
GetModelInfo.

Needs IRIS_SERVER_BIN (skipped without it), IRIS_TEST_MODELS (the model_tiny fixture),
IRIS_TEST_DATA, and for some checks IRIS_GENERATE_BIN and IRIS_GRPC_DESCRIPTORS.
Run one group: ``test_server_e2e.py -v GenerateTest``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from iris_test_util import (ServerProcess, data_path, env_path, make_self_signed_cert,  # noqa: E402
                            std_services, tiny_model)

from iris_client import AsyncClient, Client, IrisError  # noqa: E402

SERVER_BIN = env_path("IRIS_SERVER_BIN")
GENERATE_BIN = env_path("IRIS_GENERATE_BIN")
IMAGE = data_path("images", "rgb_300x200.png")        # 77 image tokens on the tiny model
SMALL_IMAGE = data_path("images", "gray_56x56.png")   # 4 image tokens
PROMPT = "Describe this image."
LONG = dict(max_tokens=2000, ignore_eos=True)          # a generation that takes seconds
TINY_VOCAB = 151936


def require_server() -> str:
    if SERVER_BIN is None:
        raise unittest.SkipTest("IRIS_SERVER_BIN is not set: iris-server is not part of this "
                                "build, so the end-to-end tests are skipped")
    if not os.access(SERVER_BIN, os.X_OK):
        raise RuntimeError(f"{SERVER_BIN} is not built: cmake --build build --target iris-server")
    return SERVER_BIN


def start_server(*args: str) -> ServerProcess:
    return ServerProcess(require_server(),
                         ["--model", tiny_model(), "--port", "0", "--dtype", "f32", *args])


def run_iris_generate(*args: str) -> tuple[str, str]:
    """iris-generate's reply text (its stdout without the final newline) and its stderr."""
    if GENERATE_BIN is None:
        raise unittest.SkipTest("IRIS_GENERATE_BIN is not set")
    run = subprocess.run([GENERATE_BIN, "--model", tiny_model(), "--greedy", "--dtype", "f32",
                          *args], capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        raise AssertionError(f"iris-generate failed ({run.returncode}): {run.stderr}")
    assert run.stdout.endswith("\n"), repr(run.stdout)
    return run.stdout[:-1], run.stderr


class ServerTestCase(unittest.TestCase):
    """One server per test class, started with ``server_args``; ``client`` talks to it."""

    server_args: tuple[str, ...] = ()
    server: ServerProcess
    client: Client

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = start_server(*cls.server_args)
        cls.client = Client(cls.server.target, timeout=60)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.client.close()
        # A clean SIGTERM exit is part of what is tested: a sanitizer report (leak, bad access)
        # at shutdown makes the exit code non-zero, and the class fails with the report.
        code = cls.server.stop(timeout=60)
        if code != 0:
            raise AssertionError(f"iris-server exit code {code} after SIGTERM; its stderr:\n"
                                 f"{cls.server.stderr()[-8000:]}")

    def assertIdle(self, client: Client | None = None, timeout: float = 10.0) -> None:
        """Waits until no sequence runs or waits and no KV block is in use."""
        client = client or self.client
        deadline = time.monotonic() + timeout
        while True:
            stats = client.stats()
            if stats.kv_blocks_used == 0 and stats.running == 0 and stats.waiting == 0:
                return
            if time.monotonic() > deadline:
                self.fail(f"the server did not become idle in {timeout} s: {stats}")
            time.sleep(0.05)

    def assertRpcError(self, code: grpc.StatusCode, *substrings: str, call=None, **kwargs):
        """``call(**kwargs)`` (default: a unary generate) fails with ``code``, and the details
        contain every substring; returns the details."""
        call = call or self.client.generate
        what = repr(kwargs)[:300]
        with self.assertRaises(IrisError, msg=what) as caught:
            result = call(**kwargs)
            if kwargs.get("stream"):
                list(result)
        error = caught.exception
        self.assertEqual(error.code, code, f"{what}: {error.details}")
        for s in substrings:
            self.assertIn(s, error.details, what)
        return error.details


class GenerateTest(ServerTestCase):
    """Replies, equality with iris-generate, health, reflection, defaults in GetModelInfo."""

    _expected: dict = {}

    def expected(self, *args: str) -> tuple[str, str]:
        if args not in self._expected:
            self._expected[args] = run_iris_generate(*args)
        return self._expected[args]

    def request_log_lines(self, id_start: str, timeout: float = 5.0) -> list[str]:
        """The server's request log lines whose id starts with ``id_start`` (waits until at
        least one is there)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [line for line in self.server.stderr().splitlines()
                     if line.startswith(f"iris-server: request id={id_start}")]
            if lines or time.monotonic() > deadline:
                return lines
            time.sleep(0.05)

    def test_one_log_line_per_request(self):
        reply = self.client.generate(text="Hi", max_tokens=3, ignore_eos=True, request_id="log-ok-1")
        lines = self.request_log_lines("log-ok-1 ")
        self.assertEqual(len(lines), 1, lines)
        self.assertRegex(lines[0], r"^iris-server: request id=log-ok-1 status=OK finish=length "
                                   rf"prompt_tokens={reply.usage.prompt_tokens} image_tokens=0 "
                                   r"completion_tokens=3 preprocess_ms=[0-9.]+ queue_ms=[0-9.]+ "
                                   r"encode_ms=[0-9.]+ prefill_ms=[0-9.]+ ttft_ms=[0-9.]+ "
                                   r"total_ms=[0-9.]+$")
        with self.assertRaises(IrisError):
            self.client.generate(text="Hi", max_tokens=0, request_id="log-bad-1")
        lines = self.request_log_lines("log-bad-1 ")
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("status=INVALID_ARGUMENT finish=- ", lines[0])
        self.assertIn('message="sampling.max_tokens: ', lines[0])
        # A client's id cannot break the one-line format: escaped and cut at 128 characters.
        with self.assertRaises(IrisError):
            self.client.generate(text="Hi", request_id="a\nb" + "x" * 200)
        lines = self.request_log_lines("a\\nb")
        self.assertEqual(len(lines), 1, lines)
        # The first 128 characters of the id (a, newline, b and 125 x), escaped, then "...".
        self.assertTrue(lines[0].startswith("iris-server: request id=a\\nb" + "x" * 125 + "... "),
                        lines[0])

    def test_streamed_greedy_reply_equals_iris_generate(self):
        text, log = self.expected("--image", IMAGE, "--prompt", PROMPT, "--max-tokens", "20")
        stream = self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=20, stream=True)
        pieces = list(stream)
        self.assertGreater(len(pieces), 1)
        self.assertEqual("".join(pieces), text)
        # iris-generate: "iris-generate: 20 tokens, finish length; prompt 102 tokens (77 image)"
        m = re.search(r"(\d+) tokens, finish (\w+); prompt (\d+) tokens \((\d+) image\)", log)
        self.assertIsNotNone(m, log)
        completion = stream.completion
        self.assertEqual(completion.finish_reason, m.group(2))
        self.assertEqual(completion.usage.completion_tokens, int(m.group(1)))
        self.assertEqual(completion.usage.prompt_tokens, int(m.group(3)))
        self.assertEqual(completion.usage.image_tokens, int(m.group(4)))
        self.assertEqual(len(stream.token_ids), int(m.group(1)))
        t = completion.timings
        self.assertGreater(t.total_ms, 0)
        self.assertGreaterEqual(t.total_ms, t.first_token_ms)
        self.assertGreaterEqual(t.encode_ms, 0)  # 0 when the encoder cache had the image

    def test_text_only_reply_equals_iris_generate(self):
        text, _ = self.expected("--prompt", "Hello there", "--max-tokens", "12")
        reply = self.client.generate(text="Hello there", max_tokens=12, stream=True).reply()
        self.assertEqual(reply.text, text)
        self.assertEqual(reply.usage.image_tokens, 0)

    def test_unary_equals_streamed(self):
        stream = self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=20, stream=True)
        streamed = stream.reply()
        unary = self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=20)
        self.assertEqual(unary.text, streamed.text)
        self.assertEqual(unary.token_ids, streamed.token_ids)
        self.assertEqual(unary.finish_reason, streamed.finish_reason)
        self.assertEqual(unary.usage, streamed.usage)
        self.assertEqual(len(unary.token_ids), unary.usage.completion_tokens)

    def test_repeated_prompt_hits_the_prefix_cache(self):
        text = PROMPT + " Say it once more."
        before = self.client.stats()
        first = self.client.generate(images=[IMAGE], text=text, max_tokens=4, ignore_eos=True)
        second = self.client.generate(images=[IMAGE], text=text, max_tokens=4, ignore_eos=True)
        after = self.client.stats()
        self.assertEqual(first.token_ids, second.token_ids)
        prompt = first.usage.prompt_tokens
        self.assertEqual(after.prefix_cache_queries - before.prefix_cache_queries, 2 * prompt)
        # The second finds every full 16-token block before its last prompt token (the first may
        # hit what earlier tests computed).
        hits = after.prefix_cache_hits - before.prefix_cache_hits
        self.assertGreaterEqual(hits, (prompt - 1) // 16 * 16)
        self.assertLessEqual(hits, 2 * ((prompt - 1) // 16 * 16))
        self.assertAlmostEqual(after.prefix_cache_hit_rate, after.prefix_cache_hits / after.prefix_cache_queries)
        self.assertGreater(after.kv_blocks_cached, 0)

    def test_messages_form_equals_text_form(self):
        plain = self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=8)
        messages = self.client.generate(messages=[{"role": "user", "content": [
            {"type": "image", "image": IMAGE}, {"type": "text", "text": PROMPT}]}], max_tokens=8)
        self.assertEqual(messages.token_ids, plain.token_ids)
        self.assertEqual(messages.usage, plain.usage)

    def test_pixel_bounds_change_image_tokens(self):
        full = self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=1)
        small = self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=1,
                                     max_pixels=28 * 28 * 4)
        self.assertLess(small.usage.image_tokens, full.usage.image_tokens)
        self.assertLessEqual(small.usage.image_tokens, 4)

    def test_default_max_tokens_is_16(self):
        reply = self.client.generate(text="Hi", ignore_eos=True)
        self.assertEqual(reply.usage.completion_tokens, 16)
        self.assertEqual(reply.finish_reason, "length")

    def test_seeded_sampling_is_reproducible(self):
        kwargs = dict(text="Hi", max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=7)
        self.assertEqual(self.client.generate(**kwargs).token_ids,
                         self.client.generate(**kwargs).token_ids)

    def test_request_id_echoed_and_logged(self):
        stream = self.client.generate(text="Hi", max_tokens=2, request_id="e2e-log-1",
                                      stream=True)
        stream.reply()
        self.assertEqual(stream.request_id, "e2e-log-1")
        self.assertEqual(self.client.generate(text="Hi", max_tokens=2,
                                              request_id="e2e-log-2").request_id, "e2e-log-2")
        self.assertNotEqual(self.client.generate(text="Hi", max_tokens=2).request_id, "")
        deadline = time.monotonic() + 5
        while "iris-server: request id=e2e-log-2" not in self.server.stderr():
            self.assertLess(time.monotonic(), deadline, self.server.stderr()[-2000:])
            time.sleep(0.05)
        self.assertIn("iris-server: request id=e2e-log-1", self.server.stderr())

    def test_async_client(self):
        async def main():
            async with AsyncClient(self.server.target, timeout=60) as client:
                stream = await client.generate(images=[IMAGE], text=PROMPT, max_tokens=20,
                                               stream=True)
                pieces = [piece async for piece in stream]
                unary = await client.generate(images=[IMAGE], text=PROMPT, max_tokens=20)
                return "".join(pieces), stream, unary

        text, stream, unary = asyncio.run(main())
        self.assertEqual(text, unary.text)
        self.assertEqual(stream.token_ids, unary.token_ids)

    def test_command_line(self):
        text, _ = self.expected("--image", IMAGE, "--prompt", PROMPT, "--max-tokens", "20")
        run = subprocess.run([sys.executable, "-m", "iris_client", "--target",
                              self.server.target, "--image", IMAGE, "--max-tokens", "20", PROMPT],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout, text + "\n")
        run = subprocess.run([sys.executable, "-m", "iris_client", "--target",
                              self.server.target, "--max-tokens", "0", "Hi"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 1)
        self.assertTrue(run.stderr.startswith("error: INVALID_ARGUMENT: "), run.stderr)
        self.assertIn("sampling.max_tokens", run.stderr)
        run = subprocess.run([sys.executable, "-m", "iris_client", "--target",
                              self.server.target, "--info"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn('model: "tiny"', run.stdout)
        self.assertIn('dtype: "f32"', run.stdout)

    def test_health(self):
        services = std_services()
        if services is None:
            self.skipTest("IRIS_GRPC_DESCRIPTORS is not available")
        for name in ("", "iris.v1.Iris"):
            self.assertEqual(services.health_check(self.client.channel, name), "SERVING", name)

    def test_reflection(self):
        services = std_services()
        if services is None:
            self.skipTest("IRIS_GRPC_DESCRIPTORS is not available")
        names = services.list_services(self.client.channel)
        self.assertIn("iris.v1.Iris", names)
        self.assertIn("grpc.health.v1.Health", names)

    def test_model_info_defaults(self):
        info = self.client.model_info()
        self.assertEqual(info.model, "tiny")
        self.assertEqual(info.model_type, "qwen2_5_vl")
        self.assertEqual(info.architecture, "Qwen2_5_VLForConditionalGeneration")
        self.assertTrue(info.accepts_images)
        self.assertTrue(info.device.startswith("cpu: "), info.device)
        cores = int(os.environ.get("OMP_NUM_THREADS") or 0) or len(os.sched_getaffinity(0))
        if cores >= 2:  # --encoder-cpus auto: a thread and team of its own, sharing the engine's cores
            self.assertEqual(info.encoder_device, info.device)
        else:  # the encoder runs between steps on `device`
            self.assertEqual(info.encoder_device, "")
        self.assertEqual(info.dtype, "f32")
        self.assertEqual(info.vocab_size, TINY_VOCAB)
        limits = info.limits
        self.assertEqual(limits.max_message_bytes, 64 << 20)
        self.assertEqual(limits.max_images_per_request, 16)
        self.assertEqual(limits.max_prompt_tokens, 32768)
        self.assertEqual(limits.max_tokens, 4096)
        self.assertEqual(limits.max_queue, 1024)
        self.assertEqual(limits.max_model_len, 4096)  # 0 = the model's max_position_embeddings
        self.assertGreater(limits.max_image_bytes, 0)
        self.assertGreater(limits.max_image_pixels, 0)
        techniques = info.encoder_techniques
        self.assertTrue(techniques.fused_rotary and techniques.parallel_qkv_padding
                        and techniques.cached_cu_seqlens)
        self.assertEqual(info.max_num_seqs, 64)
        self.assertEqual(info.max_num_batched_tokens, 2048)
        defaults = info.sampling_defaults  # the fixture's generation_config.json: greedy
        self.assertEqual((defaults.temperature, defaults.top_k, defaults.top_p, defaults.repetition_penalty),
                         (0.0, 0, 1.0, 1.0))
        self.assertTrue(defaults.source.endswith("/generation_config.json"), defaults.source)
        self.assertEqual(defaults.max_tokens, 16)  # no max_new_tokens there: --default-max-tokens
        self.assertGreater(info.kv_cache_blocks, 0)
        self.assertGreater(info.kv_block_size, 0)
        self.assertNotEqual(info.server_version, "")

    def settled_stats(self, predicate=lambda stats: True, timeout: float = 5.0):
        """Stats once two reads 50 ms apart agree and ``predicate`` holds (counters may lag
        the reply a little: the engine updates them after the last token is sent)."""
        deadline = time.monotonic() + timeout
        previous = self.client.stats()
        while True:
            time.sleep(0.05)
            stats = self.client.stats()
            if stats == previous and predicate(stats):
                return stats
            if time.monotonic() > deadline:
                self.fail(f"stats did not settle: {stats}")
            previous = stats

    def test_stats_count_requests(self):
        before = self.settled_stats()
        self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=3, ignore_eos=True)
        after = self.settled_stats(
            lambda s: s.requests_finished == before.requests_finished + 1
            and s.tokens_generated == before.tokens_generated + 3)
        self.assertGreater(after.steps, before.steps)
        self.assertEqual(after.kv_blocks_total, self.client.model_info().kv_cache_blocks)
        self.assertFalse(after.draining)
        # The second time, the image's tokens lie inside the prefix-cache hit: its embeddings are
        # not wanted, so the encoder cache is not even asked.
        self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=1)
        again = self.settled_stats()
        self.assertEqual(again.encoder_cache_hits + again.encoder_cache_misses,
                         after.encoder_cache_hits + after.encoder_cache_misses)
        self.assertGreater(again.prefix_cache_hits, after.prefix_cache_hits)
        self.assertIdle()


class PrefixCachingOffTest(ServerTestCase):
    """--enable-prefix-caching=false: nothing is shared, a repeated image comes from the encoder
    cache."""

    server_args = ("--enable-prefix-caching=false",)

    def test_repeated_image_comes_from_the_encoder_cache(self):
        first = self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=2, ignore_eos=True)
        second = self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=2, ignore_eos=True)
        self.assertEqual(first.token_ids, second.token_ids)
        self.assertIdle()
        stats = self.client.stats()
        self.assertEqual(stats.prefix_cache_hits, 0)
        self.assertEqual(stats.kv_blocks_cached, 0)
        self.assertEqual(stats.encoder_cache_misses, 1)
        self.assertEqual(stats.encoder_cache_hits, 1)
        self.assertIn("prefix caching off)", self.server.stderr())


class CancellationTest(ServerTestCase):
    """Cancel, deadline and disconnect free the KV cache at once; request ids in flight."""

    def start_long_stream(self, client: Client | None = None, **kwargs):
        stream = (client or self.client).generate(text="Count to a thousand.", stream=True,
                                                  **LONG, **kwargs)
        for _ in range(3):
            next(stream)
        stats = self.client.stats()
        self.assertGreaterEqual(stats.running, 1, stats)
        self.assertGreater(stats.kv_blocks_used, 0, stats)
        return stream

    def test_cancel_frees_kv(self):
        stream = self.start_long_stream()
        stream.cancel()
        self.assertIdle()
        self.assertTrue(stream.cancelled)
        self.assertLess(len(stream.token_ids), 2000)

    def test_break_out_of_loop_frees_kv(self):
        for i, _ in enumerate(self.client.generate(text="Count.", stream=True, **LONG)):
            if i == 3:
                break
        self.assertIdle()

    def test_deadline_unary(self):
        self.assertRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, text="Count.", timeout=0.5,
                            **LONG)
        self.assertIdle()

    def test_deadline_stream(self):
        started = time.monotonic()
        self.assertRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, text="Count.", timeout=0.5,
                            stream=True, **LONG)
        self.assertLess(time.monotonic() - started, 5)
        self.assertIdle()

    def test_client_disconnect_frees_kv(self):
        other = Client(self.server.target, timeout=60)
        self.start_long_stream(other)
        other.close()
        self.assertIdle()

    def test_async_cancel_frees_kv(self):
        async def main():
            async with AsyncClient(self.server.target, timeout=60) as client:
                stream = await client.generate(text="Count.", stream=True, **LONG)
                pieces = []
                async for piece in stream:
                    pieces.append(piece)
                    if len(pieces) == 3:
                        stream.cancel()
                running = (await client.stats()).running
                return stream, running

        stream, _ = asyncio.run(main())
        self.assertTrue(stream.cancelled)
        self.assertIsNone(stream.completion)
        self.assertIdle()

    def test_async_deadline(self):
        async def main():
            async with AsyncClient(self.server.target) as client:
                try:
                    await client.generate(text="Count.", timeout=0.5, **LONG)
                except IrisError as error:
                    return error.code

        self.assertEqual(asyncio.run(main()), grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertIdle()

    def test_duplicate_request_id_in_flight(self):
        stream = self.start_long_stream(request_id="dup-1")
        self.assertRpcError(grpc.StatusCode.ALREADY_EXISTS, "dup-1", text="Hi", max_tokens=2,
                            request_id="dup-1")
        self.assertRpcError(grpc.StatusCode.ALREADY_EXISTS, "dup-1", text="Hi", max_tokens=2,
                            request_id="dup-1", stream=True)
        stream.cancel()
        self.assertIdle()
        # Once the first is gone, the id may be used again.
        deadline = time.monotonic() + 5
        while True:
            try:
                reply = self.client.generate(text="Hi", max_tokens=2, request_id="dup-1")
                break
            except IrisError as error:
                if error.code != grpc.StatusCode.ALREADY_EXISTS or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.assertEqual(reply.request_id, "dup-1")

    def test_other_requests_undisturbed_by_cancel(self):
        expected = self.client.generate(text="Hi", max_tokens=10)
        stream = self.start_long_stream()
        during = self.client.generate(text="Hi", max_tokens=10)
        stream.cancel()
        self.assertEqual(during.token_ids, expected.token_ids)
        self.assertIdle()


class ValidationTest(ServerTestCase):
    """Every validation rule: status code and the field named; GetModelInfo reports the flags."""

    server_args = ("--max-images-per-request", "2", "--max-prompt-tokens", "200",
                   "--max-tokens", "50", "--max-message-bytes", "600000",
                   "--max-image-bytes", "200000", "--max-image-pixels", "500000",
                   "--max-queue", "7", "--max-num-seqs", "4", "--max-num-batched-tokens", "512",
                   "--fused_rotary=false", "--nocached_cu_seqlens", "--max-model-len", "1000")

    def test_model_info_reports_the_flags(self):
        info = self.client.model_info()
        limits = info.limits
        self.assertEqual(limits.max_images_per_request, 2)
        self.assertEqual(limits.max_prompt_tokens, 200)
        self.assertEqual(limits.max_tokens, 50)
        self.assertEqual(limits.max_message_bytes, 600000)
        self.assertEqual(limits.max_image_bytes, 200000)
        self.assertEqual(limits.max_image_pixels, 500000)
        self.assertEqual(limits.max_queue, 7)
        self.assertEqual(limits.max_model_len, 1000)
        self.assertEqual(info.max_num_seqs, 4)
        self.assertEqual(info.max_num_batched_tokens, 512)
        techniques = info.encoder_techniques
        self.assertFalse(techniques.fused_rotary)
        self.assertTrue(techniques.parallel_qkv_padding)
        self.assertFalse(techniques.cached_cu_seqlens)
        self.assertEqual(info.dtype, "f32")

    def test_bad_image_bytes(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages[0].content[0].image",
                            images=[b"this is not an image"], text="Hi")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages[1].content[1].image",
                            messages=[{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": [
                                          {"type": "image", "image": SMALL_IMAGE},
                                          {"type": "image", "image": b"\x89PNG\r\n\x1a\ngarbage"},
                                          {"type": "text", "text": "Hi"}]}])
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages[0].content[0].image",
                            images=[b"this is not an image"], text="Hi", stream=True)

    def test_empty_image(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages[0].content[0].image",
                            images=[b""], text="Hi")

    def test_image_over_max_image_bytes(self):
        self.assertGreater(os.path.getsize(data_path("images", "rgb_448x448.png")), 200000)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages[0].content[0].image",
                            "200000", images=[data_path("images", "rgb_448x448.png")], text="Hi")

    def test_image_over_max_image_pixels(self):
        path = data_path("images", "jpeg420_q90_1000x667.jpg")  # 667000 pixels, 198 kB
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages[0].content[0].image",
                            "500000", images=[path], text="Hi")

    def test_too_many_images(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages", "3 images", "2",
                            images=[SMALL_IMAGE] * 3, text="Hi")
        # Counted over all messages.
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages", "2", messages=[
            {"role": "user", "content": [{"type": "image", "image": SMALL_IMAGE}]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "image", "image": SMALL_IMAGE},
                                         {"type": "image", "image": SMALL_IMAGE}]}])
        # Two are fine.
        self.assertEqual(self.client.generate(images=[SMALL_IMAGE] * 2, text="Hi",
                                              max_tokens=1).usage.image_tokens, 8)

    def test_prompt_too_long(self):
        details = self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages", "200",
                                      text="hello " * 300, max_tokens=1)
        self.assertIn("prompt", details.lower())
        # Image tokens count: 3 x 77 > 200 (with 2 images allowed, two of them are 154).
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages", "200",
                            images=[IMAGE, IMAGE], text="hello " * 40, max_tokens=1)

    def test_max_tokens(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "sampling.max_tokens",
                            text="Hi", max_tokens=0)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "sampling.max_tokens", "50",
                            text="Hi", max_tokens=51)
        self.assertEqual(self.client.generate(text="Hi", max_tokens=50, ignore_eos=True)
                         .usage.completion_tokens, 50)

    def test_temperature(self):
        for value in (-0.5, 101.0, float("nan")):
            self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "sampling.temperature", "100",
                                text="Hi", max_tokens=1, temperature=value)

    def test_top_p(self):
        for value in (0.0, -0.1, 1.5):
            self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_p",
                                text="Hi", max_tokens=1, top_p=value)

    def test_top_k(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_k",
                            text="Hi", max_tokens=1, top_k=-1)
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "sampling.top_k", str(TINY_VOCAB),
                            text="Hi", max_tokens=1, top_k=TINY_VOCAB + 1)

    def test_repetition_penalty(self):
        for value in (0.0, -1.0, 101.0):
            self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "sampling.repetition_penalty",
                                text="Hi", max_tokens=1, repetition_penalty=value)

    def test_stop_token_ids(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "sampling.stop_token_ids",
                            text="Hi", max_tokens=1, stop_token_ids=[TINY_VOCAB])

    def test_unknown_role(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages[0].role",
                            messages=[{"role": "robot", "content": "Hi"}])
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages[1].role",
                            messages=[{"role": "user", "content": "Hi"},
                                      {"role": "", "content": "Hi"}])

    def test_empty_messages(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages", messages=[])
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "messages[0].content",
                            messages=[{"role": "user", "content": []}])

    def test_bad_request_id(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "request_id",
                            text="Hi", max_tokens=1, request_id="has space")
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "request_id", "128",
                            text="Hi", max_tokens=1, request_id="x" * 129)

    def test_message_over_max_message_bytes(self):
        self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            images=[bytes(700_000)], text="Hi")

    def test_server_fine_after_bad_requests(self):
        for bad in (dict(images=[b"junk"], text="Hi"), dict(text="Hi", max_tokens=0),
                    dict(messages=[])):
            with self.assertRaises(IrisError):
                self.client.generate(**bad)
        reply = self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=4)
        self.assertEqual(len(reply.token_ids), reply.usage.completion_tokens)
        self.assertIdle()


class QueueTest(ServerTestCase):
    """--max-queue (RESOURCE_EXHAUSTED when full) and --max-model-len."""

    server_args = ("--max-num-seqs", "1", "--max-queue", "1", "--max-model-len", "64")

    def test_limits_reported(self):
        info = self.client.model_info()
        self.assertEqual(info.limits.max_queue, 1)
        self.assertEqual(info.limits.max_model_len, 64)
        self.assertEqual(info.max_num_seqs, 1)

    def test_prompt_plus_max_tokens_over_max_model_len(self):
        self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "max_model_len", "64",
                            text="Hello there", max_tokens=60)
        reply = self.client.generate(text="Hello there", max_tokens=10, ignore_eos=True)
        self.assertEqual(reply.usage.completion_tokens, 10)
        self.assertLessEqual(reply.usage.prompt_tokens + reply.usage.completion_tokens, 64)


class QueueFullTest(ServerTestCase):
    """--max-queue 1 with one sequence slot: a third request is refused while one runs and one waits.
    The running request is long (4,000 tokens, cancelled by the test) so that it cannot finish —
    and free the slot — while the test looks at the queue (a 40-token one did, under load)."""

    server_args = ("--max-num-seqs", "1", "--max-queue", "1", "--max-model-len", "4096")

    def test_queue_full(self):
        running = self.client.generate(text="one", stream=True, max_tokens=4000, ignore_eos=True)
        next(running)
        waiting = self.client.generate(text="two", stream=True, max_tokens=40, ignore_eos=True)
        deadline = time.monotonic() + 10
        while True:  # the second is being prepared or waits for the one sequence slot
            stats = self.client.stats()
            if stats.waiting + stats.preprocessing >= 1:
                break
            self.assertLess(time.monotonic(), deadline, f"nothing waits: {stats}")
            time.sleep(0.01)
        self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue",
                            text="three", max_tokens=2)
        running.cancel()
        self.assertGreater(len(waiting.reply().token_ids), 0)  # the waiting one runs next
        self.assertIdle()
        self.assertEqual(self.client.generate(text="four", max_tokens=2).usage.completion_tokens,
                         2)


class AuthTest(ServerTestCase):
    """--auth-token-file: UNAUTHENTICATED without the bearer token; health exempt."""

    TOKEN = "e2e-s3cret-token"

    @classmethod
    def setUpClass(cls) -> None:
        require_server()
        cls.tmp = tempfile.TemporaryDirectory()
        token_file = os.path.join(cls.tmp.name, "token")
        with open(token_file, "w") as f:
            f.write(cls.TOKEN)
        cls.server_args = ("--auth-token-file", token_file)
        super().setUpClass()
        cls.client.close()
        cls.client = Client(cls.server.target, token=cls.TOKEN, timeout=60)

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        cls.tmp.cleanup()

    def test_right_token(self):
        self.assertEqual(self.client.generate(text="Hi", max_tokens=2).usage.completion_tokens,
                         2)
        self.assertEqual(self.client.model_info().model, "tiny")
        self.client.stats()

    def test_missing_or_wrong_token(self):
        for token in (None, "wrong", self.TOKEN + "x"):
            with Client(self.server.target, token=token, timeout=30) as client:
                for call, kwargs in ((client.generate, dict(text="Hi", max_tokens=2)),
                                     (client.generate, dict(text="Hi", max_tokens=2,
                                                            stream=True)),
                                     (client.model_info, {}), (client.stats, {})):
                    self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, call=call, **kwargs)

    def test_health_needs_no_token(self):
        services = std_services()
        if services is None:
            self.skipTest("IRIS_GRPC_DESCRIPTORS is not available")
        with Client(self.server.target, timeout=30) as client:
            self.assertEqual(services.health_check(client.channel, ""), "SERVING")
            self.assertEqual(services.health_check(client.channel, "iris.v1.Iris"), "SERVING")


class TlsTest(ServerTestCase):
    """--tls-cert/--tls-key with a self-signed certificate."""

    @classmethod
    def setUpClass(cls) -> None:
        require_server()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.cert, key = make_self_signed_cert(cls.tmp.name)
        cls.server_args = ("--tls-cert", cls.cert, "--tls-key", key)
        cls.server = start_server(*cls.server_args)
        cls.client = Client(cls.server.target, root_certificates=cls.cert, timeout=60)

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        cls.tmp.cleanup()

    def test_generate_over_tls(self):
        stream = self.client.generate(images=[IMAGE], text=PROMPT, max_tokens=5, stream=True)
        self.assertEqual(stream.reply().usage.completion_tokens,
                         len(stream.token_ids))
        with open(self.cert, "rb") as f:
            with Client(self.server.target, root_certificates=f.read(), timeout=60) as client:
                self.assertEqual(client.model_info().model, "tiny")

    def test_health_over_tls(self):
        services = std_services()
        if services is None:
            self.skipTest("IRIS_GRPC_DESCRIPTORS is not available")
        self.assertEqual(services.health_check(self.client.channel, ""), "SERVING")

    def test_plaintext_client_fails(self):
        with Client(self.server.target, timeout=10) as client:
            self.assertRpcError(grpc.StatusCode.UNAVAILABLE, call=client.model_info)


class StartupTest(unittest.TestCase):
    """The server refuses to start, exit code 1 and one clear line, on a bad setup."""

    def run_server(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([require_server(), *args], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)

    def assertRefused(self, run: subprocess.CompletedProcess, *substrings: str) -> None:
        self.assertEqual(run.returncode, 1, run.stderr[-2000:])
        for s in substrings:
            self.assertIn(s, run.stderr)

    def test_port_in_use_is_refused_not_shared(self):
        # gRPC would set SO_REUSEPORT and let a second server share the port's traffic.
        first = start_server()
        try:
            run = self.run_server("--model", tiny_model(), "--port", str(first.port))
            self.assertRefused(run, f"cannot listen on 127.0.0.1:{first.port}")
        finally:
            self.assertEqual(first.stop(), 0)

    def test_bad_flags(self):
        model = tiny_model()
        self.assertRefused(self.run_server(), "--model is required")
        self.assertRefused(self.run_server("--model", "/nonexistent-model"), "/nonexistent-model")
        self.assertRefused(self.run_server("--model", model, "--dtype", "f16"), "--dtype")
        self.assertRefused(self.run_server("--model", model, "--port", "70000"), "--port")
        self.assertRefused(self.run_server("--model", model, "--tls-cert", "x.pem"),
                           "--tls-cert and --tls-key")
        self.assertRefused(self.run_server("--model", model, "--max-tokens", "0"), "--max-tokens")
        self.assertRefused(self.run_server("--model", model, "--auth-token-file", "/nonexistent"),
                           "--auth-token-file")
        self.assertRefused(self.run_server("--model", model, "--max-pixels", "100"),
                           "--min-pixels/--max-pixels")
        self.assertRefused(self.run_server("--model", model, "extra"), "unexpected argument")
        self.assertRefused(self.run_server("--model", model, "--generation-config", "vllm"),
                           "--generation-config must be auto or none")


class GenerationConfigDefaultsTest(unittest.TestCase):
    """A checkpoint whose generation_config.json samples with top_k 1 and a strong repetition
    penalty: a request that sets nothing gets what transformers' generate() would (greedy with
    the penalty) and, as vLLM reads the file, max_new_tokens tokens; --generation-config none
    gives iris's own defaults (greedy, no penalty, --default-max-tokens)."""

    CONFIG = ('{"do_sample": true, "temperature": 0.5, "top_k": 1, "repetition_penalty": 1.8, '
              '"eos_token_id": [151645, 151643], "max_new_tokens": 7}')

    @classmethod
    def setUpClass(cls) -> None:
        require_server()
        cls.tmp = tempfile.TemporaryDirectory()
        source = tiny_model()
        for name in os.listdir(source):  # the fixture's files, its generation_config.json replaced
            if name != "generation_config.json":
                os.symlink(os.path.join(source, name), os.path.join(cls.tmp.name, name))
        with open(os.path.join(cls.tmp.name, "generation_config.json"), "w", encoding="utf-8") as f:
            f.write(cls.CONFIG)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def replies(self, *server_args: str) -> tuple[object, list[int], list[int], list[int], int]:
        """The server's sampling defaults, then the tokens of a request that sets no sampling
        field but max_tokens, of one that asks greedy with the file's penalty, of one that asks
        plain greedy, and how many tokens a request without max_tokens gets."""
        server = ServerProcess(require_server(), ["--model", self.tmp.name, "--port", "0", "--dtype", "f32",
                                                  *server_args])
        try:
            with Client(server.target, timeout=60) as client:
                ask = dict(text=PROMPT, images=[SMALL_IMAGE], max_tokens=24, ignore_eos=True)
                info = client.model_info().sampling_defaults
                unset = client.generate(**ask).token_ids
                penalised = client.generate(**ask, temperature=0.0, repetition_penalty=1.8).token_ids
                plain = client.generate(**ask, temperature=0.0, repetition_penalty=1.0).token_ids
                unbounded = len(client.generate(text=PROMPT, images=[SMALL_IMAGE], ignore_eos=True).token_ids)
        finally:
            self.assertEqual(server.stop(timeout=60), 0, server.stderr()[-4000:])
        return info, unset, penalised, plain, unbounded

    def test_unset_fields_take_the_checkpoints_defaults(self):
        info, unset, penalised, plain, unbounded = self.replies()
        self.assertEqual((info.max_tokens, unbounded), (7, 7))
        self.assertAlmostEqual(info.temperature, 0.5)
        self.assertEqual(info.top_k, 1)
        self.assertAlmostEqual(info.repetition_penalty, 1.8, places=5)
        self.assertEqual(info.source, os.path.join(self.tmp.name, "generation_config.json"))
        self.assertEqual(unset, penalised)  # top_k 1: the argmax after the penalty
        self.assertNotEqual(penalised, plain, "the penalty should move this prompt's tokens")

    def test_none_keeps_iris_defaults(self):
        info, unset, penalised, plain, unbounded = self.replies("--generation-config", "none",
                                                                "--default-max-tokens", "9")
        self.assertEqual((info.temperature, info.top_k, info.top_p, info.repetition_penalty, info.source),
                         (0.0, 0, 1.0, 1.0, ""))
        self.assertEqual((info.max_tokens, unbounded), (9, 9))
        self.assertEqual(unset, plain)
        self.assertNotEqual(unset, penalised)


class ShutdownTest(unittest.TestCase):
    """SIGTERM/SIGINT: draining (health NOT_SERVING, new calls UNAVAILABLE), every call ends,
    exit code 0 within the grace period."""

    GRACE_S = 2.0

    def setUp(self) -> None:
        self.server = start_server("--grace-period-s", str(self.GRACE_S))
        self.client = Client(self.server.target, timeout=60)

    def tearDown(self) -> None:
        self.client.close()
        self.server.kill()

    def wait_draining(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.client.stats(timeout=1).draining:
                    return
            except IrisError as error:
                if error.code == grpc.StatusCode.UNAVAILABLE:
                    return  # already past draining
                raise
            time.sleep(0.02)
        self.fail("the server did not start draining after the signal")

    def test_sigterm_under_load(self):
        n = 16
        outcomes: list = [None] * n
        first_piece = [threading.Event() for _ in range(n)]

        def run(i: int) -> None:
            try:
                stream = self.client.generate(text=f"Tell story number {i}.", stream=True,
                                              max_tokens=1500, ignore_eos=True)
                for _ in stream:
                    first_piece[i].set()
                outcomes[i] = ("OK", stream.completion.finish_reason)
            except IrisError as error:
                outcomes[i] = (error.code.name, error.details)
            except Exception as error:  # noqa: BLE001 - reported by the assertion below
                outcomes[i] = ("EXCEPTION", repr(error))
            finally:
                first_piece[i].set()

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for event in first_piece:
            self.assertTrue(event.wait(60), "a stream produced nothing in 60 s")
        stats = self.client.stats()
        self.assertGreater(stats.running + stats.waiting, 0, stats)

        signalled = time.monotonic()
        self.server.signal(signal.SIGTERM)
        self.wait_draining()
        # New work is refused while draining; health says NOT_SERVING (or the port is gone).
        with self.assertRaises(IrisError) as caught:
            self.client.generate(text="Hi", max_tokens=2)
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE,
                         caught.exception.details)
        services = std_services()
        if services is not None:
            try:
                self.assertEqual(services.health_check(self.client.channel, "", timeout=2),
                                 "NOT_SERVING")
            except grpc.RpcError as error:
                self.assertEqual(error.code(), grpc.StatusCode.UNAVAILABLE)

        for t in threads:
            t.join(max(0.1, signalled + self.GRACE_S + 15 - time.monotonic()))
        self.assertFalse(any(t.is_alive() for t in threads), f"calls hung: {outcomes}")
        for outcome in outcomes:
            self.assertIn(outcome[0], ("OK", "UNAVAILABLE", "CANCELLED"), outcomes)
        if os.environ.get("IRIS_TEST_VERBOSE"):
            sys.stderr.write(f"outcomes: {outcomes}\n")
        code = self.server.wait(max(0.1, signalled + self.GRACE_S + 15 - time.monotonic()))
        self.assertEqual(code, 0, self.server.stderr()[-3000:])
        # The grace period bounds the shutdown (plus a little for stopping the engine).
        self.assertLess(time.monotonic() - signalled, self.GRACE_S + 2)

    def test_sigint_idle_exits_zero(self):
        self.client.generate(text="Hi", max_tokens=2)
        started = time.monotonic()
        self.server.signal(signal.SIGINT)
        self.assertEqual(self.server.wait(self.GRACE_S + 10), 0, self.server.stderr()[-3000:])
        # Idle: nothing to wait for, even with the client's connection still open.
        self.assertLess(time.monotonic() - started, 2)

    def test_in_flight_short_request_completes_during_drain(self):
        stream = self.client.generate(text="Hi", stream=True, max_tokens=30, ignore_eos=True)
        next(stream)
        self.server.signal(signal.SIGTERM)
        reply = stream.reply()  # well within the grace period
        self.assertEqual(reply.usage.completion_tokens, 30)
        self.assertEqual(self.server.wait(self.GRACE_S + 10), 0, self.server.stderr()[-3000:])


if __name__ == "__main__":
    unittest.main()
