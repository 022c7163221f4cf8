"""iris-bench datasets: the synthetic set (determinism, spread of sizes) and JSONL files."""

import hashlib
import io
import json
import os
import tempfile
import unittest

import fakes  # noqa: F401  (puts bench/ on sys.path)
from iris_bench import datasets
from PIL import Image


def _digest(reqs):
    h = hashlib.sha256()
    for r in reqs:
        h.update(r.prompt.encode())
        h.update(r.image)
        h.update(str(r.output_len).encode())
    return h.hexdigest()


class SyntheticTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.reqs = datasets.synthetic_dataset(120, seed=7, output_len=128)

    def test_deterministic(self):
        again = datasets.synthetic_dataset(12, seed=7, output_len=128)
        self.assertEqual(_digest(again), _digest(self.reqs[:12]))  # same seed, same bytes
        # request i does not depend on how many requests there are
        self.assertEqual(datasets.synthetic_request(7, 100, 128).image, self.reqs[100].image)
        other = datasets.synthetic_dataset(12, seed=8, output_len=128)
        self.assertNotEqual(_digest(other), _digest(again))

    def test_one_image_per_request_no_duplicates(self):
        hashes = set()
        for r in self.reqs:
            self.assertIsNotNone(r.image)
            self.assertEqual(r.output_len, 128)
            self.assertIn(r.prompt, datasets.QUESTIONS)
            hashes.add(hashlib.sha256(r.image).hexdigest())
        self.assertEqual(len(hashes), len(self.reqs))

    def test_images_decode_to_their_recorded_size(self):
        for r in self.reqs[:30]:
            with Image.open(io.BytesIO(r.image)) as im:
                self.assertEqual(im.size, r.image_size)
                self.assertEqual(im.mode, "RGB")
                self.assertEqual({"JPEG": "image/jpeg", "PNG": "image/png"}[im.format], r.image_mime)

    def test_spread_of_sizes(self):
        kinds = {}
        for r in self.reqs:
            kinds[r.kind] = kinds.get(r.kind, 0) + 1
        self.assertEqual(set(kinds), {"photo", "screenshot", "web"})
        self.assertGreater(kinds["photo"], 30)        # 45% of 120 = 54 expected
        self.assertGreater(kinds["screenshot"], 20)   # 35%: 42
        self.assertGreater(kinds["web"], 10)          # 20%: 24
        pixels = [w * h for w, h in (r.image_size for r in self.reqs)]
        self.assertLessEqual(min(pixels), 500 * 400)
        self.assertGreaterEqual(max(pixels), 1600 * 900)
        self.assertLessEqual(max(pixels), 1920 * 1088)
        self.assertTrue(any(w < h for w, h in (r.image_size for r in self.reqs)))   # portrait
        self.assertTrue(any(w > h for w, h in (r.image_size for r in self.reqs)))   # landscape
        self.assertTrue(any(w == h for w, h in (r.image_size for r in self.reqs)))  # square
        self.assertGreater(len({r.image_size for r in self.reqs}), 40)
        self.assertGreater(len({r.prompt for r in self.reqs}), 15)
        # small web pictures stay within 800 px, photos start at 640 px on the long side
        for r in self.reqs:
            long_side = max(r.image_size)
            if r.kind == "web":
                self.assertTrue(398 <= long_side <= 800, r.image_size)
            if r.kind == "photo":
                self.assertTrue(640 <= long_side <= 1920, r.image_size)

    def test_output_len_flag_and_bad_values(self):
        self.assertEqual(datasets.synthetic_dataset(2, 0, 16)[1].output_len, 16)
        with self.assertRaises(datasets.DatasetError):
            datasets.synthetic_dataset(0, 0, 16)
        with self.assertRaises(datasets.DatasetError):
            datasets.synthetic_dataset(1, 0, 0)


class JsonlTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        os.makedirs(os.path.join(self.dir, "img"))
        Image.new("RGB", (64, 48), (10, 200, 30)).save(os.path.join(self.dir, "img", "a.png"))
        Image.new("RGB", (40, 30), (1, 2, 3)).save(os.path.join(self.dir, "b.jpg"), quality=90)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, lines, name="d.jsonl"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def test_parse(self):
        path = self.write([
            json.dumps({"image": "img/a.png", "prompt": "What is this?", "output_len": 7}),
            "",
            json.dumps({"image": None, "prompt": "Text only.", "output_len": 3}),
            json.dumps({"prompt": "Defaults.", "image": os.path.join(self.dir, "b.jpg")}),
        ])
        reqs = datasets.jsonl_dataset(path, default_output_len=99)
        self.assertEqual(len(reqs), 3)
        a, t, b = reqs
        self.assertEqual((a.prompt, a.output_len, a.image_size, a.image_mime), ("What is this?", 7, (64, 48), "image/png"))
        with open(os.path.join(self.dir, "img", "a.png"), "rb") as f:
            self.assertEqual(a.image, f.read())
        self.assertEqual((t.image, t.output_len), (None, 3))
        self.assertEqual((b.output_len, b.image_mime, b.image_size), (99, "image/jpeg", (40, 30)))
        self.assertEqual(a.source, f"{path}:1")
        self.assertEqual(b.source, f"{path}:4")
        self.assertEqual(len(datasets.jsonl_dataset(path, 99, num_prompts=2)), 2)

    def assert_error(self, line, *needles, lineno=2):
        path = self.write([json.dumps({"prompt": "ok"}), line])
        with self.assertRaises(datasets.DatasetError) as cm:
            datasets.jsonl_dataset(path, 16)
        msg = str(cm.exception)
        self.assertIn(f"{path}:{lineno}:", msg)
        for n in needles:
            self.assertIn(n, msg)

    def test_errors_name_line_and_field(self):
        self.assert_error("{not json", "not valid JSON")
        self.assert_error("[1, 2]", "JSON object")
        self.assert_error(json.dumps({"image": None}), "'prompt'", "missing")
        self.assert_error(json.dumps({"prompt": 5}), "'prompt'", "string")
        self.assert_error(json.dumps({"prompt": ""}), "'prompt'")
        self.assert_error(json.dumps({"prompt": "x", "output_len": 0}), "'output_len'", "positive integer")
        self.assert_error(json.dumps({"prompt": "x", "output_len": "8"}), "'output_len'")
        self.assert_error(json.dumps({"prompt": "x", "output_len": True}), "'output_len'")
        self.assert_error(json.dumps({"prompt": "x", "output_len": 2.5}), "'output_len'")
        self.assert_error(json.dumps({"prompt": "x", "image": 3}), "'image'")
        self.assert_error(json.dumps({"prompt": "x", "image": "missing.png"}), "'image'", "missing.png")
        self.assert_error(json.dumps({"prompt": "x", "imgae": "a.png"}), "unknown field 'imgae'")

    def test_file_level_errors(self):
        with self.assertRaises(datasets.DatasetError) as cm:
            datasets.jsonl_dataset(os.path.join(self.dir, "nope.jsonl"), 16)
        self.assertIn("nope.jsonl", str(cm.exception))
        path = self.write(["", "  "])
        with self.assertRaisesRegex(datasets.DatasetError, "no requests"):
            datasets.jsonl_dataset(path, 16)
        path = self.write([json.dumps({"prompt": "x"})])
        with self.assertRaisesRegex(datasets.DatasetError, "fewer than --num-prompts 5"):
            datasets.jsonl_dataset(path, 16, num_prompts=5)


if __name__ == "__main__":
    unittest.main()
