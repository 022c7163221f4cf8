"""The newer families served by iris-server.

A text-only model (tiny-qwen2-text, ctest fixture model_tiny-qwen2-text): GetModelInfo says the
family and that images are not accepted, the Python client's greedy reply equals the reference's,
an image part is INVALID_ARGUMENT naming the field, and iris-bench with a text-only JSONL dataset
finishes with 0 failures.

Qwen2-VL (tiny-qwen2-vl, fixture model_tiny-qwen2-vl): GetModelInfo names it, the client's greedy
replies with one and with two images equal the reference's (text and image-token count), and
iris-bench's image dataset finishes with 0 failures.

Needs IRIS_SERVER_BIN; skipped without it.
"""

import json
import os
import subprocess
import sys
import unittest

from fakes import IRIS_BENCH, NoThreadLeak, ServesModel, bench_env
from test_openai_backend import report_values

SERVER_BIN = os.environ.get("IRIS_SERVER_BIN", "")
MODEL = os.path.join(os.environ.get("IRIS_TEST_MODELS", ""), "tiny-qwen2-text")
QWEN2VL_MODEL = os.path.join(os.environ.get("IRIS_TEST_MODELS", ""), "tiny-qwen2-vl")
# iris_client lives beside the generated stubs (the build's python folder).
for _path in reversed(os.environ.get("IRIS_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)
DATA = os.path.join(os.path.dirname(__file__), "..", "data")
N, OUT_LEN = 8, 12


@unittest.skipUnless(SERVER_BIN, "IRIS_SERVER_BIN is not set")
class TextModelE2ETest(ServesModel, NoThreadLeak, unittest.TestCase):
    MODEL_DIR, FIXTURE, SERVER_ARGS = MODEL, "model_tiny-qwen2-text", ("--dtype=f32",)

    def client(self):
        from iris_client import Client
        return Client(self.server.target)

    def test_model_info_says_text_only(self):
        with self.client() as c:
            info = c.model_info()
        self.assertEqual(info.model_type, "qwen2")
        self.assertEqual(info.architecture, "Qwen2ForCausalLM")
        self.assertFalse(info.accepts_images)
        self.assertEqual(info.limits.max_images_per_request, 0)
        self.assertEqual(info.limits.max_pixels, 0)
        self.assertFalse(info.HasField("encoder_techniques"))

    def test_greedy_reply_equals_the_reference(self):
        with open(os.path.join(DATA, "model", "manifest_qwen2text.json")) as f:
            case = next(c for c in json.load(f)["cases"] if c["case"].endswith("plain_user"))
        with self.client() as c:
            reply = c.generate(messages=case["messages"], max_tokens=20)
        self.assertEqual(reply.text, case["greedy"]["text"])
        self.assertEqual(reply.usage.prompt_tokens, case["prompt_len"])
        self.assertEqual(reply.usage.image_tokens, 0)

    def test_an_image_is_invalid_argument_naming_the_field(self):
        from iris_client import IrisError
        import grpc
        with self.client() as c, self.assertRaises(IrisError) as raised:
            c.generate(text="What is this?", images=[os.path.join(DATA, "images", "rgb_300x200.png")])
        self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("messages[0].content[0].image", raised.exception.details)
        self.assertIn("text-only", raised.exception.details)
        with self.client() as c:  # the server is still serving
            self.assertTrue(c.generate(text="hi", max_tokens=2).text is not None)

    def test_iris_bench_text_dataset(self):
        dataset = os.path.join(self.tmp.name, "text.jsonl")
        with open(dataset, "w") as f:
            for i in range(N):
                f.write(json.dumps({"image": None, "prompt": f"Tell me about the number {i}." * (1 + i % 3),
                                    "output_len": OUT_LEN}) + "\n")
        r = subprocess.run([IRIS_BENCH, "--target", self.server.target, "--dataset", "jsonl",
                            "--dataset-path", dataset, "--num-prompts", str(N), "--max-concurrency", "4",
                            "--no-progress"],
                           env=bench_env(), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr + self.server.log()[-3000:])
        values = report_values(r.stdout)
        self.assertEqual(values["Successful requests:"], str(N), r.stdout)
        self.assertEqual(values["Failed requests:"], "0", r.stdout)
        self.assertEqual(values["Total generated tokens:"], str(N * OUT_LEN), r.stdout)


@unittest.skipUnless(SERVER_BIN, "IRIS_SERVER_BIN is not set")
class Qwen2VLModelE2ETest(ServesModel, NoThreadLeak, unittest.TestCase):
    MODEL_DIR, FIXTURE, SERVER_ARGS = QWEN2VL_MODEL, "model_tiny-qwen2-vl", ("--dtype=f32",)

    def client(self):
        from iris_client import Client
        return Client(self.server.target)

    def test_model_info_names_the_family(self):
        with self.client() as c:
            info = c.model_info()
        self.assertEqual(info.model_type, "qwen2_vl")
        self.assertEqual(info.architecture, "Qwen2VLForConditionalGeneration")
        self.assertTrue(info.accepts_images)
        self.assertGreater(info.limits.max_images_per_request, 0)

    def test_greedy_replies_with_images_equal_the_reference(self):
        with open(os.path.join(DATA, "model", "manifest_qwen2vl.json")) as f:
            cases = [c for c in json.load(f)["cases"] if c["images"]]
        self.assertEqual(len(cases), 2)
        for case in cases:
            with self.subTest(case["case"]):
                text = case["messages"][0]["content"][-1]["text"]
                with self.client() as c:
                    reply = c.generate(text=text, images=[os.path.join(DATA, p) for p in case["images"]],
                                       max_tokens=20)
                self.assertEqual(reply.text, case["greedy"]["text"])
                self.assertEqual(reply.usage.prompt_tokens, case["prompt_len"])
                self.assertEqual(reply.usage.image_tokens, case["num_image_tokens"])

    def test_iris_bench_with_images(self):
        r = subprocess.run([IRIS_BENCH, "--target", self.server.target, "--num-prompts", str(N),
                            "--output-len", str(OUT_LEN), "--max-concurrency", "4", "--image-max-pixels", "100352",
                            "--no-progress"],
                           env=bench_env(), capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr + self.server.log()[-3000:])
        values = report_values(r.stdout)
        self.assertEqual(values["Successful requests:"], str(N), r.stdout)
        self.assertEqual(values["Failed requests:"], "0", r.stdout)
        self.assertEqual(values["Total generated tokens:"], str(N * OUT_LEN), r.stdout)


if __name__ == "__main__":
    unittest.main()
