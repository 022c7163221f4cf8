"""iris_client against an in-process fake server: request building, streaming, unary replies,
errors, cancellation, auth metadata, TLS, AsyncClient and the command line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fake_iris import FakeServer  # noqa: E402
from iris_test_util import make_self_signed_cert  # noqa: E402

import iris_client  # noqa: E402
from iris_client import AsyncClient, Client, IrisError, build_request, iris_pb2  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\nnot really"
JPEG = b"\xff\xd8\xffnot really"


class RequestBuildingTest(unittest.TestCase):
    def test_images_come_before_the_text_in_one_user_message(self):
        request = build_request(text="What is it?", images=[PNG, JPEG])
        self.assertEqual(len(request.messages), 1)
        message = request.messages[0]
        self.assertEqual(message.role, "user")
        kinds = [part.WhichOneof("kind") for part in message.content]
        self.assertEqual(kinds, ["image", "image", "text"])
        self.assertEqual(message.content[0].image.data, PNG)
        self.assertEqual(message.content[1].image.data, JPEG)
        self.assertEqual(message.content[2].text, "What is it?")

    def test_image_paths_are_read_from_disk(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "a.png")
            with open(path, "wb") as f:
                f.write(PNG)
            from pathlib import Path
            request = build_request(images=[path, Path(path)], text="x")
        self.assertEqual([p.image.data for p in request.messages[0].content[:2]], [PNG, PNG])

    def test_images_only_and_text_only(self):
        self.assertEqual([p.WhichOneof("kind") for p in
                          build_request(images=[PNG]).messages[0].content], ["image"])
        self.assertEqual([p.text for p in build_request(text="hi").messages[0].content], ["hi"])

    def test_pixel_bounds_apply_to_every_image(self):
        request = build_request(text="x", images=[PNG, JPEG], min_pixels=3136, max_pixels=50000)
        for part in request.messages[0].content[:2]:
            self.assertEqual(part.image.min_pixels, 3136)
            self.assertEqual(part.image.max_pixels, 50000)

    def test_messages_form(self):
        request = build_request(messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "image", "image": PNG, "min_pixels": 100, "max_pixels": 2000},
                {"type": "image", "image": JPEG},
                {"type": "text", "text": "Compare."}]},
            {"role": "assistant", "content": "They differ."},
        ], max_pixels=9999)
        self.assertEqual([m.role for m in request.messages], ["system", "user", "assistant"])
        self.assertEqual(request.messages[0].content[0].text, "Be brief.")
        user = request.messages[1].content
        self.assertEqual((user[0].image.data, user[0].image.min_pixels, user[0].image.max_pixels),
                         (PNG, 100, 2000))
        # The call-wide bound applies where a part sets none.
        self.assertEqual((user[1].image.data, user[1].image.min_pixels, user[1].image.max_pixels),
                         (JPEG, 0, 9999))
        self.assertEqual(user[2].text, "Compare.")
        self.assertEqual(request.messages[2].content[0].text, "They differ.")

    def test_roles_and_empty_messages_are_sent_as_given(self):
        # The server validates them (and names the field); the client must not hide that.
        self.assertEqual(build_request(messages=[{"role": "robot", "content": "x"}])
                         .messages[0].role, "robot")
        self.assertEqual(len(build_request(messages=[]).messages), 0)

    def test_sampling_fields_are_set_only_when_given(self):
        request = build_request(text="x")
        self.assertFalse(request.HasField("sampling"))
        self.assertEqual(request.request_id, "")
        self.assertFalse(request.HasField("skip_special_tokens"))
        request = build_request(text="x", max_tokens=5, top_k=0, temperature=0.0)
        s = request.sampling
        self.assertTrue(s.HasField("max_tokens") and s.HasField("top_k")
                        and s.HasField("temperature"))
        self.assertEqual((s.max_tokens, s.top_k, s.temperature), (5, 0, 0.0))
        for name in ("top_p", "seed", "repetition_penalty"):
            self.assertFalse(s.HasField(name), name)
        self.assertFalse(s.ignore_eos)

    def test_every_sampling_field(self):
        request = build_request(
            text="x", max_tokens=7, temperature=0.5, top_p=0.75, top_k=40, seed=1234,
            repetition_penalty=1.25, stop=["END", "\n\n"], stop_token_ids=[1, 2],
            ignore_eos=True, request_id="req-1", skip_special_tokens=False, min_tokens=3)
        s = request.sampling
        self.assertEqual(s.min_tokens, 3)
        self.assertEqual((s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed,
                          s.repetition_penalty), (7, 0.5, 0.75, 40, 1234, 1.25))
        self.assertEqual(list(s.stop), ["END", "\n\n"])
        self.assertEqual(list(s.stop_token_ids), [1, 2])
        self.assertTrue(s.ignore_eos)
        self.assertEqual(request.request_id, "req-1")
        self.assertTrue(request.HasField("skip_special_tokens"))
        self.assertFalse(request.skip_special_tokens)
        self.assertEqual(list(build_request(text="x", stop="END").sampling.stop), ["END"])

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            build_request()
        with self.assertRaises(ValueError):
            build_request(text="x", messages=[{"role": "user", "content": "y"}])
        with self.assertRaises(ValueError):
            build_request(messages=[{"role": "user", "content": [{"type": "video"}]}])
        with self.assertRaises(ValueError):
            build_request(messages=[{"role": "user", "content": [{"type": "image"}]}])
        with self.assertRaises(TypeError):
            build_request(images=[123])
        with self.assertRaises(FileNotFoundError):
            build_request(images=["/nonexistent/image.png"])


class FakeServerTestCase(unittest.TestCase):
    def setUp(self):
        self.fake = FakeServer()
        self.servicer = self.fake.servicer
        self.client = Client(self.fake.target, timeout=10)

    def tearDown(self):
        self.client.close()
        self.fake.stop()


class ClientTest(FakeServerTestCase):
    def test_unary_reply(self):
        reply = self.client.generate(text="hi", images=[PNG], max_tokens=4, request_id="r1")
        self.assertIsInstance(reply, iris_client.Reply)
        self.assertEqual(reply.request_id, "r1")
        self.assertEqual(reply.text, "Hello world")
        self.assertEqual(reply.token_ids, [100, 101, 102, 103])
        self.assertEqual(reply.finish_reason, "stop")
        self.assertEqual(reply.usage, iris_client.Usage(12, 4, 4))
        self.assertEqual(reply.timings.total_ms, 9.5)
        self.assertEqual(reply.timings.first_token_ms, 4.0)
        self.assertEqual(reply.completion.finish_reason, "stop")
        sent = self.servicer.requests[0]
        self.assertEqual(sent, build_request(text="hi", images=[PNG], max_tokens=4,
                                             request_id="r1"))

    def test_finish_reasons(self):
        for value, name in ((iris_pb2.FINISH_REASON_LENGTH, "length"),
                            (iris_pb2.FINISH_REASON_CANCELLED, "cancelled"),
                            (iris_pb2.FINISH_REASON_UNSPECIFIED, "unspecified")):
            self.servicer.finish_reason = value
            self.assertEqual(self.client.generate(text="x").finish_reason, name)
            self.assertEqual(self.client.generate(text="x", stream=True).reply().finish_reason,
                             name)

    def test_stream_pieces_and_completion(self):
        stream = self.client.generate(text="hi", stream=True, max_tokens=4)
        self.assertIsInstance(stream, iris_client.Stream)
        self.assertIsNone(stream.completion)
        pieces = list(stream)
        self.assertEqual(pieces, ["Hel", "lo", " world"])  # the empty piece is skipped
        self.assertTrue(stream.done)
        self.assertFalse(stream.cancelled)
        self.assertEqual(stream.text, "Hello world")
        self.assertEqual(stream.token_ids, [100, 101, 102, 103])
        self.assertEqual(stream.request_id, "fake-1")
        completion = stream.completion
        self.assertEqual(completion.finish_reason, "stop")
        self.assertEqual(completion.usage.prompt_tokens, 12)
        self.assertEqual(completion.usage.image_tokens, 4)
        self.assertEqual(completion.timings.preprocess_ms, 1.5)
        reply = stream.reply()
        self.assertEqual((reply.text, reply.finish_reason), ("Hello world", "stop"))

    def test_stream_next_and_reply(self):
        stream = self.client.generate(text="hi", stream=True)
        self.assertEqual(next(stream), "Hel")
        reply = stream.reply()  # reads the rest
        self.assertEqual(reply.text, "Hello world")
        self.assertEqual(reply.token_ids, [100, 101, 102, 103])

    def test_model_info_and_stats(self):
        info = self.client.model_info()
        self.assertIsInstance(info, iris_pb2.ModelInfo)
        self.assertEqual((info.model, info.dtype, info.limits.max_tokens), ("fake", "f32", 64))
        stats = self.client.stats()
        self.assertIsInstance(stats, iris_pb2.ServerStats)
        self.assertEqual(stats.kv_blocks_used, 3)

    def test_auth_metadata(self):
        self.client.generate(text="x")
        self.assertNotIn("authorization", self.servicer.metadata[-1])
        with Client(self.fake.target, token="s3cret") as client:
            client.generate(text="x")
            self.assertEqual(self.servicer.metadata[-1]["authorization"], "Bearer s3cret")
            list(client.generate(text="x", stream=True))
            self.assertEqual(self.servicer.metadata[-1]["authorization"], "Bearer s3cret")
            client.model_info()
            self.assertEqual(self.servicer.metadata[-1]["authorization"], "Bearer s3cret")
            client.stats()
            self.assertEqual(self.servicer.metadata[-1]["authorization"], "Bearer s3cret")

    def test_errors_become_iris_error(self):
        self.servicer.error = (grpc.StatusCode.INVALID_ARGUMENT,
                               "sampling.max_tokens: must be in [1, 64], got 0")
        with self.assertRaises(IrisError) as caught:
            self.client.generate(text="x", max_tokens=0)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("sampling.max_tokens", caught.exception.details)
        self.assertIn("INVALID_ARGUMENT", str(caught.exception))
        stream = self.client.generate(text="x", stream=True)
        with self.assertRaises(IrisError) as caught:
            list(stream)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(stream.done)
        self.servicer.error = (grpc.StatusCode.UNAUTHENTICATED, "missing bearer token")
        for call in (self.client.model_info, self.client.stats):
            with self.assertRaises(IrisError) as caught:
                call()
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAUTHENTICATED)
            self.assertEqual(caught.exception.details, "missing bearer token")

    def test_deadline(self):
        self.servicer.delay = 2.0
        with self.assertRaises(IrisError) as caught:
            self.client.generate(text="x", timeout=0.2)
        self.assertEqual(caught.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        with Client(self.fake.target, timeout=0.2) as client:
            with self.assertRaises(IrisError) as caught:
                list(client.generate(text="x", stream=True))
            self.assertEqual(caught.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)

    def test_unreachable_server(self):
        port = self.fake.port
        self.fake.stop()
        with Client(f"127.0.0.1:{port}", timeout=5) as client:
            with self.assertRaises(IrisError) as caught:
                client.model_info()
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.fake = FakeServer()  # for tearDown

    def _endless_stream(self):
        self.servicer.endless = True
        stream = self.client.generate(text="x", stream=True)
        pieces = [next(stream) for _ in range(5)]
        self.assertEqual(pieces[:2], ["Hel", "lo"])
        return stream

    def test_cancel(self):
        stream = self._endless_stream()
        stream.cancel()
        self.assertTrue(self.servicer.cancelled.wait(5), "the server did not see the cancel")
        self.assertTrue(stream.cancelled)
        self.assertEqual(list(stream), [])  # iteration simply ends
        self.assertIsNone(stream.completion)
        with self.assertRaises(RuntimeError):
            stream.reply()

    def test_break_out_of_the_loop_cancels(self):
        self.servicer.endless = True
        stream = self.client.generate(text="x", stream=True)
        for i, _ in enumerate(stream):
            if i == 5:
                break
        self.assertTrue(self.servicer.cancelled.wait(5), "the server did not see the cancel")
        self.assertTrue(stream.cancelled)

    def test_leaving_with_block_cancels(self):
        self.servicer.endless = True
        with self.client.generate(text="x", stream=True) as stream:
            next(stream)
        self.assertTrue(self.servicer.cancelled.wait(5), "the server did not see the cancel")
        self.assertTrue(stream.cancelled)

    def test_close_cancels(self):
        stream = self._endless_stream()
        stream.close()
        self.assertTrue(self.servicer.cancelled.wait(5))

    def test_closing_the_client_ends_the_stream(self):
        stream = self._endless_stream()
        self.client.close()
        self.assertTrue(self.servicer.cancelled.wait(5))
        with self.assertRaises(IrisError) as caught:
            for _ in stream:
                pass
        self.assertEqual(caught.exception.code, grpc.StatusCode.CANCELLED)


class TlsTest(unittest.TestCase):
    def test_root_certificates_as_path_and_bytes(self):
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = make_self_signed_cert(tmp)
            with open(cert, "rb") as f:
                cert_pem = f.read()
            with open(key, "rb") as f:
                key_pem = f.read()
            fake = FakeServer(cert_pem, key_pem)
            try:
                for roots in (cert, cert_pem):
                    with Client(fake.target, root_certificates=roots, token="t",
                                timeout=10) as client:
                        self.assertEqual(client.generate(text="x").text, "Hello world")
                        self.assertEqual(fake.servicer.metadata[-1]["authorization"],
                                         "Bearer t")
                # Plaintext against a TLS port fails cleanly.
                with Client(fake.target, timeout=5) as client:
                    with self.assertRaises(IrisError) as caught:
                        client.model_info()
                    self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
            finally:
                fake.stop()


class AsyncClientTest(FakeServerTestCase):
    def run_async(self, coro):
        return asyncio.run(asyncio.wait_for(coro, 20))

    def test_unary_stream_info_stats(self):
        async def main():
            async with AsyncClient(self.fake.target, token="tok", timeout=10) as client:
                reply = await client.generate(text="hi", images=[PNG], max_tokens=3)
                stream = await client.generate(text="hi", stream=True)
                pieces = [piece async for piece in stream]
                info = await client.model_info()
                stats = await client.stats()
                return reply, stream, pieces, info, stats

        reply, stream, pieces, info, stats = self.run_async(main())
        self.assertEqual((reply.text, reply.finish_reason), ("Hello world", "stop"))
        self.assertEqual(reply.token_ids, [100, 101, 102, 103])
        self.assertEqual(pieces, ["Hel", "lo", " world"])
        self.assertEqual(stream.completion.finish_reason, "stop")
        self.assertEqual(stream.token_ids, [100, 101, 102, 103])
        self.assertEqual(info.model, "fake")
        self.assertEqual(stats.kv_blocks_used, 3)
        self.assertEqual(self.servicer.requests[0],
                         build_request(text="hi", images=[PNG], max_tokens=3))
        self.assertTrue(all(m["authorization"] == "Bearer tok" for m in self.servicer.metadata))

    def test_errors(self):
        self.servicer.error = (grpc.StatusCode.ALREADY_EXISTS, "request_id: \"a\" is in flight")

        async def main():
            async with AsyncClient(self.fake.target, timeout=10) as client:
                codes = []
                for stream in (False, True):
                    try:
                        result = await client.generate(text="x", stream=stream)
                        if stream:
                            await result.reply()
                    except IrisError as error:
                        codes.append((error.code, error.details))
                return codes

        codes = self.run_async(main())
        self.assertEqual(codes, [(grpc.StatusCode.ALREADY_EXISTS, "request_id: \"a\" is in flight")] * 2)

    def test_cancel(self):
        self.servicer.endless = True

        async def main():
            async with AsyncClient(self.fake.target, timeout=10) as client:
                stream = await client.generate(text="x", stream=True)
                got = []
                async for piece in stream:
                    got.append(piece)
                    if len(got) == 4:
                        stream.cancel()
                rest = [piece async for piece in stream]
                return stream, got, rest

        stream, got, rest = self.run_async(main())
        self.assertEqual(got[:2], ["Hel", "lo"])
        self.assertEqual(rest, [])
        self.assertTrue(stream.cancelled)
        self.assertIsNone(stream.completion)
        self.assertTrue(self.servicer.cancelled.wait(5), "the server did not see the cancel")

    def test_async_with_stream_cancels(self):
        self.servicer.endless = True

        async def main():
            async with AsyncClient(self.fake.target, timeout=10) as client:
                async with await client.generate(text="x", stream=True) as stream:
                    await stream.__anext__()
                return stream

        stream = self.run_async(main())
        self.assertTrue(stream.cancelled)
        self.assertTrue(self.servicer.cancelled.wait(5), "the server did not see the cancel")

    def test_deadline(self):
        self.servicer.delay = 2.0

        async def main():
            async with AsyncClient(self.fake.target) as client:
                try:
                    await client.generate(text="x", timeout=0.2)
                except IrisError as error:
                    return error.code

        self.assertEqual(self.run_async(main()), grpc.StatusCode.DEADLINE_EXCEEDED)


class CommandLineTest(FakeServerTestCase):
    def cli(self, *args, timeout=30):
        env = dict(os.environ)
        return subprocess.run([sys.executable, "-m", "iris_client", *args], env=env,
                              capture_output=True, text=True, timeout=timeout)

    def test_streams_the_reply(self):
        with tempfile.TemporaryDirectory() as tmp:
            a, b = os.path.join(tmp, "a.png"), os.path.join(tmp, "b.jpg")
            for path, data in ((a, PNG), (b, JPEG)):
                with open(path, "wb") as f:
                    f.write(data)
            run = self.cli("--target", self.fake.target, "--image", a, "--image", b,
                           "--max-tokens", "9", "--temperature", "0.5", "--seed", "3",
                           "Describe.")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stdout, "Hello world\n")
        self.assertEqual(run.stderr, "")
        self.assertEqual(self.servicer.requests[-1],
                         build_request(text="Describe.", images=[PNG, JPEG], max_tokens=9,
                                       temperature=0.5, seed=3))

    def test_token_file(self):
        with tempfile.TemporaryDirectory() as tmp:
            token_file = os.path.join(tmp, "token")
            with open(token_file, "w") as f:
                f.write("abc123\n")
            run = self.cli("--target", self.fake.target, "--token-file", token_file, "hi")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(self.servicer.metadata[-1]["authorization"], "Bearer abc123")

    def test_info(self):
        run = self.cli("--target", self.fake.target, "--info")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn('model: "fake"', run.stdout)
        self.assertIn("max_tokens: 64", run.stdout)
        self.assertEqual(len(self.servicer.requests), 1)  # no generation without text

    def test_rpc_error(self):
        self.servicer.error = (grpc.StatusCode.INVALID_ARGUMENT,
                               "messages[0].content[0].image: cannot decode")
        run = self.cli("--target", self.fake.target, "hi")
        self.assertEqual(run.returncode, 1)
        self.assertEqual(run.stderr,
                         "error: INVALID_ARGUMENT: messages[0].content[0].image: cannot decode\n")

    def test_unreachable(self):
        port = self.fake.port
        self.fake.stop()
        run = self.cli("--target", f"127.0.0.1:{port}", "--timeout", "5", "hi")
        self.fake = FakeServer()
        self.assertEqual(run.returncode, 1)
        self.assertTrue(run.stderr.startswith("error: UNAVAILABLE: "), run.stderr)

    def test_usage_errors(self):
        for args in ((), ("hi",), ("--target", self.fake.target),
                     ("--target", self.fake.target, "--max-tokens", "many", "hi"),
                     ("--target", self.fake.target, "--image", "/nonexistent.png", "hi"),
                     ("--target", self.fake.target, "--token-file", "/nonexistent", "hi"),
                     ("--target", self.fake.target, "--tls-ca", "/nonexistent", "hi"),
                     ("--target", self.fake.target, "--max-tokens", "-1", "hi")):
            run = self.cli(*args)
            self.assertEqual(run.returncode, 2, (args, run.stderr))
            self.assertIn("error", run.stderr, args)
            self.assertEqual(run.stdout, "", args)
        self.assertEqual(self.servicer.requests, [])


if __name__ == "__main__":
    unittest.main()
