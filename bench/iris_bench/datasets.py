"""The requests a benchmark sends: a synthetic vision-arena-like set, or a JSONL file.

Synthetic dataset (``--dataset synthetic``)
===========================================

Shaped like the VisionArena-Chat benchmark that ``vllm bench serve`` uses for vision-language
models: every request is one user turn with exactly one image followed by one short question,
and asks for a fixed number of output tokens (``--output-len``, 128 by default; the request
sets ``ignore_eos`` so the reply has that length).

Each request ``i`` draws from its own random stream, ``numpy.random.default_rng([seed, i])``,
so the same seed gives the same bytes for request ``i`` whatever ``--num-prompts`` is, and
different requests never share an image (a server-side encoder cache gets no free hits).

Image kinds, their share of the requests and their sizes (width x height):

* ``photo`` (45%): camera and phone photos, JPEG at quality 75-95. Aspect ratio 4:3 (40%),
  3:2 (25%), 16:9 (20%) or 1:1 (15%); portrait orientation for 30% of the non-square ones; the
  long side log-uniform from 640 px up to 1920 px or the size with 1920x1080's pixel count,
  whichever is smaller (16:9 up to 1920x1080, 4:3 up to 1662x1246, 1:1 up to 1440x1440,
  the smallest 640x360). Content: smooth
  random colour fields (bicubic upsampling of a coarse random grid) with a few filled
  ellipses and polygons as "objects" and fine-grained sensor-like noise.
* ``screenshot`` (35%): desktop and phone screens, PNG (lossless, as screenshots are shared).
  Sizes drawn uniformly from 1920x1080, 1366x768, 1536x864, 1440x900, 1280x800, 1280x720,
  1600x900, 750x1334, 828x1792 and 1080x1920. Content: a light or dark theme with a title bar,
  a sidebar, rows of random text in PIL's default font, coloured buttons and sometimes an embedded picture.
* ``web`` (20%): small web images, JPEG at quality 70-90; aspect 4:3, 3:2, 16:9 or 1:1 (equal
  shares), landscape, the long side uniform in [400, 800] px (400x300 up to 800x600). Content
  as for photos.

Questions are drawn uniformly from ``QUESTIONS`` (short, typical VisionArena-style chat
questions: describe, read the text, count, explain). Images are encoded once, before the run;
nothing here runs inside the timed loop.

Multi-turn dataset (``--dataset multiturn``)
============================================

A chat that comes back to its image, for measuring what a server-side prefix cache saves: each
conversation ``i`` is synthetic request ``i`` (the same image and first question) plus a
follow-up question drawn from ``FOLLOW_UPS``. Turn 1 sends the image and the question; when it
has finished, turn 2 sends turn 1's user message again (the same image bytes), the assistant's
actual reply, and the follow-up as a text-only user message. Both turns ask for
``--output-len`` tokens; ``--num-prompts`` counts conversations (two requests each), and the
report gives each turn's TTFT. Without a prefix cache both turns cost about the same (turn 2
prefills the same image tokens plus the reply); with one, turn 2 prefills only the new tail.

JSONL dataset (``--dataset jsonl --dataset-path F.jsonl``)
==========================================================

One JSON object per line: ``{"image": "photo.jpg" or null, "prompt": "...", "output_len": 128}``.
``image`` is a path relative to the JSONL file's folder (or absolute), or null/absent for a
text-only request; ``prompt`` is required; ``output_len`` (a positive integer) defaults to
``--output-len``. Blank lines are skipped. Any other field, a wrong type or a missing image
file is an error naming the line number and the field.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

QUESTIONS: Tuple[str, ...] = (
    "What is in this image?",
    "Describe this image in detail.",
    "What's happening in this picture?",
    "Can you explain what this screenshot shows?",
    "What does the text in this image say?",
    "Transcribe all the text you can see.",
    "How many people are in this photo?",
    "What colors dominate this image?",
    "Where might this photo have been taken?",
    "Is there anything unusual about this image?",
    "Summarize the content of this screenshot.",
    "What is the main object in the picture?",
    "Write a short caption for this image.",
    "What error is shown on this screen?",
    "Explain this chart.",
    "What time of day does it look like in this photo?",
    "Identify the objects on the table.",
    "What app is this a screenshot of?",
    "Give me a title for this picture.",
    "What emotions does this image convey?",
    "Describe the layout of this web page.",
    "Is this image real or generated? Why?",
    "What would you improve in this design?",
    "Translate the text in the image into English.",
    "What is the weather like in this picture?",
    "List everything you can see in this image.",
    "What brand is shown here?",
    "Solve the problem shown in the image.",
    "Write a tweet about this photo.",
    "What is the person in the picture doing?",
    "Describe the style of this image in one sentence.",
    "Which buttons can I click on this screen?",
)

FOLLOW_UPS: Tuple[str, ...] = (
    "Can you tell me more about that?",
    "What else do you notice in the image?",
    "Which part of the image did you base that on?",
    "Describe the top left corner of the image.",
    "Are you sure? Look at the image again.",
    "Summarize your answer in one sentence.",
    "What colors are in the background?",
    "What would you ask about this image next?",
)

_PHOTO_ASPECTS = ((4, 3, 0.40), (3, 2, 0.25), (16, 9, 0.20), (1, 1, 0.15))
_WEB_ASPECTS = ((4, 3, 0.25), (3, 2, 0.25), (16, 9, 0.25), (1, 1, 0.25))
_SCREEN_SIZES = (
    (1920, 1080), (1366, 768), (1536, 864), (1440, 900), (1280, 800),
    (1280, 720), (1600, 900), (750, 1334), (828, 1792), (1080, 1920),
)
_LETTERS = "abcdefghijklmnopqrstuvwxyz     eeeeaaaoooiiinnsstt,.ABCDEFGHIJ0123456789"
_MAX_PIXELS = 1920 * 1080
_KINDS = (("photo", 0.45), ("screenshot", 0.35), ("web", 0.20))


@dataclasses.dataclass
class SampleRequest:
    """One request of a benchmark: a prompt, at most one encoded image, an output length."""

    prompt: str
    output_len: int
    image: Optional[bytes] = None          # encoded bytes (JPEG, PNG, ...)
    image_mime: Optional[str] = None       # e.g. "image/jpeg"
    image_size: Optional[Tuple[int, int]] = None  # (width, height)
    kind: str = "text"                     # synthetic kind, "jsonl" or "text"
    source: Optional[str] = None           # where it came from (file:line)
    follow_up: Optional[str] = None        # multi-turn: the second turn's question


class DatasetError(ValueError):
    """A dataset file or option that cannot be used; the message says where and why."""


def _choose(rng: np.random.Generator, weighted: Sequence[tuple]) -> tuple:
    weights = np.array([w[-1] for w in weighted], dtype=np.float64)
    k = int(rng.choice(len(weighted), p=weights / weights.sum()))
    return weighted[k]


def _even(x: float) -> int:
    return max(2, int(round(x / 2.0)) * 2)


def _photo_size(rng: np.random.Generator, aspects, long_lo: int, long_hi: int,
                log_uniform: bool, portrait_share: float) -> Tuple[int, int]:
    aw, ah, _ = _choose(rng, aspects)
    long_hi = min(long_hi, int(np.sqrt(_MAX_PIXELS * aw / ah)))  # at most 1920x1080's pixels
    if log_uniform:
        long_side = float(np.exp(rng.uniform(np.log(long_lo), np.log(long_hi))))
    else:
        long_side = float(rng.uniform(long_lo, long_hi))
    w, h = _even(long_side), _even(long_side * ah / aw)
    if aw != ah and rng.random() < portrait_share:
        w, h = h, w
    return w, h


def _natural_image(rng: np.random.Generator, w: int, h: int):
    """A photo-like picture: smooth colour fields, a few shapes, fine noise."""
    from PIL import Image, ImageDraw

    cell = int(rng.integers(12, 40))
    grid = (rng.random((h // cell + 2, w // cell + 2, 3)) * 255).astype(np.uint8)
    img = Image.fromarray(grid).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 8))):
        x0, x1 = sorted(rng.integers(0, w, 2).tolist())
        y0, y1 = sorted(rng.integers(0, h, 2).tolist())
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x1 + 1, y1 + 1), fill=color)
        else:
            pts = [(int(rng.integers(0, w)), int(rng.integers(0, h))) for _ in range(int(rng.integers(3, 7)))]
            draw.polygon(pts, fill=color)
    arr = np.asarray(img).astype(np.int16)
    tile = rng.integers(-10, 11, (64, 64, 1), dtype=np.int16)
    arr += np.tile(tile, (h // 64 + 1, w // 64 + 1, 1))[:h, :w]
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _screenshot_image(rng: np.random.Generator, w: int, h: int):
    """A screen-like picture: flat theme colours, title bar, sidebar, text rows, buttons."""
    from PIL import Image, ImageDraw, ImageFont

    dark = rng.random() < 0.3
    bg = (30, 30, 34) if dark else (248, 248, 250)
    fg = (220, 220, 220) if dark else (40, 40, 48)
    accent = tuple(int(c) for c in rng.integers(40, 220, 3))
    img = Image.new("RGB", (w, h), bg)
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    bar = max(16, h // 30)
    draw.rectangle((0, 0, w, bar), fill=accent)
    left = 0
    if w > h and rng.random() < 0.7:
        left = int(w * rng.uniform(0.12, 0.22))
        side = tuple(max(0, c - 12) for c in bg) if not dark else (44, 44, 50)
        draw.rectangle((0, bar, left, h), fill=side)
        y = bar + 12
        while y < h - 20:
            draw.rectangle((10, y, 10 + int(rng.integers(left // 3, max(left // 3 + 1, left - 20))), y + 8), fill=fg)
            y += 28
    line_h = int(rng.integers(14, 24))
    y = bar + 20
    margin = left + 24
    while y < h - line_h:
        r = rng.random()
        if r < 0.08:  # a button row
            bx = margin
            for _ in range(int(rng.integers(1, 4))):
                bw = int(rng.integers(60, 160))
                draw.rectangle((bx, y, bx + bw, y + line_h + 8), fill=accent)
                bx += bw + 16
            y += line_h + 24
        elif r < 0.12 and h - y > 200:  # an embedded picture
            pw = int(min(w - margin - 24, rng.integers(160, 480)))
            ph = int(min(h - y - 10, rng.integers(100, 300)))
            if pw > 16 and ph > 16:
                img.paste(_natural_image(rng, pw, ph), (margin, y))
            y += ph + 16
        else:  # a line of text: random words in PIL's default bitmap font
            end = w - 24 - int(rng.integers(0, max(1, (w - margin) // 3)))
            n_chars = max(1, (end - margin) // 6)
            letters = rng.integers(0, len(_LETTERS), n_chars)
            line = "".join(_LETTERS[k] for k in letters)
            draw.text((margin, y), line, fill=fg, font=font)
            y += line_h + int(rng.integers(0, 8))
    return img


def _encode(img, fmt: str, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    if fmt == "JPEG":
        img.save(buf, "JPEG", quality=quality)
    else:
        img.save(buf, "PNG", compress_level=6)
    return buf.getvalue()


def synthetic_request(seed: int, index: int, output_len: int) -> SampleRequest:
    """Request `index` of the synthetic dataset for `seed` (deterministic)."""
    rng = np.random.default_rng([int(seed), int(index)])
    kind = _choose(rng, _KINDS)[0]
    if kind == "photo":
        w, h = _photo_size(rng, _PHOTO_ASPECTS, 640, 1920, True, 0.30)
        data = _encode(_natural_image(rng, w, h), "JPEG", int(rng.integers(75, 96)))
        mime = "image/jpeg"
    elif kind == "web":
        w, h = _photo_size(rng, _WEB_ASPECTS, 400, 800, False, 0.0)
        data = _encode(_natural_image(rng, w, h), "JPEG", int(rng.integers(70, 91)))
        mime = "image/jpeg"
    else:
        w, h = _SCREEN_SIZES[int(rng.integers(0, len(_SCREEN_SIZES)))]
        data = _encode(_screenshot_image(rng, w, h), "PNG")
        mime = "image/png"
    prompt = QUESTIONS[int(rng.integers(0, len(QUESTIONS)))]
    return SampleRequest(prompt=prompt, output_len=int(output_len), image=data, image_mime=mime,
                         image_size=(w, h), kind=kind, source=f"synthetic:{seed}:{index}")


def synthetic_dataset(num_prompts: int, seed: int, output_len: int, start: int = 0) -> List[SampleRequest]:
    """`num_prompts` synthetic requests, indices start.. (see the module docstring for the
    distribution)."""
    if num_prompts < 1:
        raise DatasetError("--num-prompts must be at least 1")
    if output_len < 1:
        raise DatasetError("--output-len must be at least 1")
    return [synthetic_request(seed, start + i, output_len) for i in range(num_prompts)]


def multiturn_dataset(num_conversations: int, seed: int, output_len: int,
                      start: int = 0) -> List[SampleRequest]:
    """`num_conversations` two-turn chats (see "Multi-turn dataset" above): synthetic request i
    with a follow-up question drawn from its own stream ([seed, i, 1], so the image and first
    question are those of the synthetic dataset)."""
    out = synthetic_dataset(num_conversations, seed, output_len, start)
    for i, req in enumerate(out, start=start):
        rng = np.random.default_rng([int(seed), int(i), 1])
        req.follow_up = FOLLOW_UPS[int(rng.integers(0, len(FOLLOW_UPS)))]
        req.source = f"multiturn:{seed}:{i}"
    return out


_MIME_BY_FORMAT = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp",
                   "BMP": "image/bmp", "TIFF": "image/tiff", "GIF": "image/gif"}
_JSONL_FIELDS = ("image", "prompt", "output_len")


def _image_info(data: bytes) -> Tuple[Optional[str], Optional[Tuple[int, int]]]:
    """(mime type, (width, height)) from the image header, or (None, None) if unknown."""
    try:
        from PIL import Image
        with Image.open(io.BytesIO(data)) as im:
            return _MIME_BY_FORMAT.get(im.format or "", "application/octet-stream"), im.size
    except Exception:  # the server is the judge of bad images; the bench only reports
        return None, None


def jsonl_dataset(path: str, default_output_len: int,
                  num_prompts: Optional[int] = None) -> List[SampleRequest]:
    """Requests from a JSONL file (see the module docstring); errors name line and field."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read the dataset: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e.reason})") from None
    base = os.path.dirname(os.path.abspath(path))
    out: List[SampleRequest] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(obj, dict):
            raise DatasetError(f"{where}: expected a JSON object with fields {', '.join(_JSONL_FIELDS)}")
        for key in obj:
            if key not in _JSONL_FIELDS:
                raise DatasetError(f"{where}: unknown field '{key}' (known: {', '.join(_JSONL_FIELDS)})")
        if "prompt" not in obj:
            raise DatasetError(f"{where}: field 'prompt' is missing")
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise DatasetError(f"{where}: field 'prompt' must be a non-empty string")
        output_len = obj.get("output_len", default_output_len)
        if isinstance(output_len, bool) or not isinstance(output_len, int) or output_len < 1:
            raise DatasetError(f"{where}: field 'output_len' must be a positive integer, got {output_len!r}")
        image = obj.get("image")
        req = SampleRequest(prompt=prompt, output_len=output_len, kind="jsonl", source=where)
        if image is not None:
            if not isinstance(image, str) or not image:
                raise DatasetError(f"{where}: field 'image' must be a file path or null, got {image!r}")
            image_path = image if os.path.isabs(image) else os.path.join(base, image)
            try:
                with open(image_path, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise DatasetError(f"{where}: field 'image': cannot read {image_path}: {e.strerror or e}") from None
            if not data:
                raise DatasetError(f"{where}: field 'image': {image_path} is empty")
            mime, size = _image_info(data)
            req.image, req.image_mime, req.image_size = data, mime or "application/octet-stream", size
        out.append(req)
        if num_prompts is not None and len(out) >= num_prompts:
            break
    if not out:
        raise DatasetError(f"{path}: no requests in the dataset")
    if num_prompts is not None and len(out) < num_prompts:
        raise DatasetError(f"{path}: has {len(out)} requests, fewer than --num-prompts {num_prompts}")
    return out
