"""The official `openai` Python package (from PyPI, into a virtual environment this test makes,
so the product's own Python dependencies stay Debian's) against iris-server's HTTP front:
chat.completions.create with an image as a data URL, streaming and not, must give the text,
finish reason and usage of the gRPC reply to the same greedy request.

Exits 77 (ctest SKIP_RETURN_CODE) only when PyPI cannot be reached; any other failure to set up
the environment fails. IRIS_OPENAI_VENV: where the environment lives (kept between runs).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from iris_test_util import ServerProcess, data_path, env_path, tiny_model  # noqa: E402
from test_http_api import HTTP_RE  # noqa: E402

from iris_client import Client  # noqa: E402

SKIP = 77
IMAGE = data_path("images", "rgb_300x200.png")
PROMPT = "Describe this image."

# Runs inside the venv: only the openai package, no iris code.
CLIENT_SCRIPT = r"""
import base64, json, sys
import openai
port, image, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
url = "data:image/png;base64," + base64.b64encode(open(image, "rb").read()).decode()
messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": prompt}]}]
model = client.models.list().data[0].id
reply = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
out = {"openai_version": openai.__version__, "model": model, "object": reply.object,
       "text": reply.choices[0].message.content, "role": reply.choices[0].message.role,
       "finish": reply.choices[0].finish_reason, "usage": reply.usage.model_dump()}
stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0,
                                        stream=True, stream_options={"include_usage": True})
pieces, finishes, usage, ids = [], [], None, set()
for chunk in stream:
    ids.add(chunk.id)
    if chunk.usage is not None:
        usage = chunk.usage.model_dump()
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finishes.append(choice.finish_reason)
out.update(stream_text="".join(pieces), stream_pieces=len(pieces), stream_finishes=finishes,
           stream_usage=usage, stream_ids=len(ids))
try:
    client.chat.completions.create(model=model, messages=messages, max_tokens=16, n=2)
    out["n2"] = "accepted"
except openai.BadRequestError as e:
    body = e.body if isinstance(e.body, dict) else {}
    body = body.get("error", body) if isinstance(body.get("error"), dict) else body
    out["n2"] = {"status": e.status_code, "param": body.get("param")}
print(json.dumps(out))
"""


def pypi_reachable() -> bool:
    try:
        with socket.create_connection(("pypi.org", 443), timeout=10):
            return True
    except OSError:
        return False


def openai_python() -> str:
    """The venv's interpreter with `openai` installed (made on first use)."""
    venv = env_path("IRIS_OPENAI_VENV") or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".openai-venv")
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python) and subprocess.run([python, "-c", "import openai"],
                                                 capture_output=True).returncode == 0:
        return python
    if not pypi_reachable():
        print("PyPI (pypi.org:443) is not reachable: the openai package cannot be installed, test skipped",
              file=sys.stderr)
        sys.exit(SKIP)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", venv], check=True, timeout=300)
    pip = subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", "openai"],
                         capture_output=True, text=True, timeout=600)
    if pip.returncode != 0:
        if not pypi_reachable():
            print("PyPI went unreachable during pip install: test skipped", file=sys.stderr)
            sys.exit(SKIP)
        raise RuntimeError(f"pip install openai failed:\n{pip.stdout}\n{pip.stderr}")
    return python


OPENAI_PYTHON = ""


class OpenAIClientTest(unittest.TestCase):
    def test_official_client_equals_grpc_reply(self):
        server_bin = env_path("IRIS_SERVER_BIN")
        if server_bin is None:
            self.skipTest("IRIS_SERVER_BIN is not set")
        python = OPENAI_PYTHON
        server = ServerProcess(server_bin, ["--model", tiny_model(), "--port", "0", "--http-port", "0",
                                            "--dtype", "f32"])
        try:
            port = HTTP_RE.search(server.stderr()).group(1)
            with Client(server.target, timeout=60) as client:
                expected = client.generate(images=[IMAGE], text=PROMPT, max_tokens=16)
            run = subprocess.run([python, "-c", CLIENT_SCRIPT, port, IMAGE, PROMPT], capture_output=True,
                                 text=True, timeout=300)
            self.assertEqual(run.returncode, 0, run.stderr)
            out = json.loads(run.stdout)
        finally:
            server.stop()
        print(f"openai {out['openai_version']}", file=sys.stderr)
        self.assertEqual(out["model"], "tiny")
        self.assertEqual(out["object"], "chat.completion")
        self.assertEqual(out["role"], "assistant")
        self.assertTrue(expected.text)
        self.assertEqual(out["text"], expected.text)
        self.assertEqual(out["finish"], expected.finish_reason)
        self.assertEqual(out["usage"]["prompt_tokens"], expected.usage.prompt_tokens)
        self.assertEqual(out["usage"]["completion_tokens"], expected.usage.completion_tokens)
        self.assertEqual(out["stream_text"], expected.text)
        self.assertGreater(out["stream_pieces"], 1)
        self.assertEqual(out["stream_finishes"], [expected.finish_reason])
        self.assertEqual(out["stream_usage"]["completion_tokens"], expected.usage.completion_tokens)
        self.assertEqual(out["stream_ids"], 1)
        self.assertEqual(out["n2"], {"status": 400, "param": "n"})


if __name__ == "__main__":
    OPENAI_PYTHON = openai_python()  # before unittest, which would catch the skip's SystemExit
    unittest.main()
