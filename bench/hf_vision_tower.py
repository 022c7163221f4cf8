#!/usr/bin/env python3
"""The encoder_bench inputs through Hugging Face transformers' Qwen2.5-VL vision tower, on the same
checkpoint, for the comparison row of the GPU encoder table.

Runs where PyTorch and transformers are (the GPU machine's python3, not Debian's): loads the
`visual.*` tensors of an iris checkpoint (e.g. `iris-make-model --preset 3b --vision-only`) into
transformers' own vision model, and times its forward on the grids encoder_bench uses (the
processor's smart resize of the same image sizes; random pixel values), with CUDA events, for each
attention implementation available (sdpa always; flash_attention_2 where flash-attn is installed).

  python3 bench/hf_vision_tower.py --model DIR [--dtype bf16] [--min-seconds 2]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
from safetensors.torch import load_file
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen

# The shapes of bench/encoder_bench.cc, as (width, height) image sizes.
SHAPES = [
    ("448x448", [(448, 448)]),
    ("1000x667", [(1000, 667)]),
    ("1344x1008", [(1344, 1008)]),
    ("batch of 8 mixed", [(448, 448), (1000, 667), (640, 480), (300, 200), (640, 480), (56, 56), (350, 70), (800, 600)]),
    ("448x448 x8", [(448, 448)] * 8),
]


def smart_resize(height, width, factor, min_pixels, max_pixels):
    """The processor's resize rule (Python's round is half-to-even, as the processor's)."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def vision_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        vc = dict(json.load(f)["vision_config"])
    cls = getattr(qwen, "Qwen2_5_VLVisionConfig", None)
    if cls is None:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig as cls
    return cls(**vc)


def load_tower(model_dir, config, dtype, attn):
    kwargs = {"attn_implementation": attn}
    try:
        model = qwen.Qwen2_5_VisionTransformerPretrainedModel._from_config(config, dtype=dtype, **kwargs)
    except TypeError:  # older transformers name the argument torch_dtype
        model = qwen.Qwen2_5_VisionTransformerPretrainedModel._from_config(config, torch_dtype=dtype, **kwargs)
    state = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            for k, v in load_file(os.path.join(model_dir, name)).items():
                if k.startswith("visual."):
                    state[k[len("visual."):]] = v
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Buffers (the rotary inverse frequencies) are computed, not stored.
    missing = [m for m in missing if "inv_freq" not in m]
    if missing or unexpected:
        sys.exit(f"hf_vision_tower: checkpoint does not match transformers' tower: missing {missing[:5]}, "
                 f"unexpected {unexpected[:5]}")
    return model.to("cuda", dtype=dtype).eval()


def time_ms(fn, min_seconds, max_runs=50):
    """Median milliseconds of fn() (CUDA events) after one warm-up, over at least min_seconds."""
    fn()
    torch.cuda.synchronize()
    runs = []
    start = time.monotonic()
    while not runs or (time.monotonic() - start < min_seconds and len(runs) < max_runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        runs.append(a.elapsed_time(b))
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--min-seconds", type=float, default=2.0)
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    with open(os.path.join(args.model, "preprocessor_config.json")) as f:
        pp = json.load(f)
    patch, merge, tp = pp.get("patch_size", 14), pp.get("merge_size", 2), pp.get("temporal_patch_size", 2)
    min_pixels, max_pixels = pp.get("min_pixels", 3136), pp.get("max_pixels", 12845056)
    config = vision_config(args.model)

    attns = ["sdpa"]
    try:
        import flash_attn  # noqa: F401
        attns.append("flash_attention_2")
    except ImportError:
        pass
    import transformers
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}; "
          f"attention: {', '.join(attns)}{'' if len(attns) > 1 else ' (flash-attn is not installed here)'}")
    torch.manual_seed(0)
    inputs = []
    for label, sizes in SHAPES:
        grids = []
        for w, h in sizes:
            rh, rw = smart_resize(h, w, patch * merge, min_pixels, max_pixels)
            grids.append([1, rh // patch, rw // patch])
        rows = sum(t * h * w for t, h, w in grids)
        pixels = (torch.rand(rows, 3 * tp * patch * patch, device="cuda") * 3.9 - 1.8).to(dtype)
        inputs.append((label, pixels, torch.tensor(grids, dtype=torch.int64, device="cuda")))

    print("| input | patches | " + " | ".join(f"transformers {a} ms" for a in attns) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in attns) + " |")
    results = {a: [] for a in attns}
    for attn in attns:
        model = load_tower(args.model, config, dtype, attn)
        with torch.inference_mode():
            for label, pixels, grid in inputs:
                results[attn].append(time_ms(lambda: model(pixels, grid_thw=grid), args.min_seconds))
        del model
        torch.cuda.empty_cache()
    for i, (label, pixels, _) in enumerate(inputs):
        print(f"| {label} | {pixels.shape[0]} | " + " | ".join(f"{results[a][i]:.2f}" for a in attns) + " |")


if __name__ == "__main__":
    main()
