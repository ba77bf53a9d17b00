#!/usr/bin/env python3
"""hf_shapes.py — transformers' logits for scripts/gpu_shapes.sh's checkpoints.

  python3 scripts/hf_shapes.py CKPT_ROOT OUT_DIR IDS STEPS

For each checkpoint folder CKPT_ROOT/NAME-DT (a published model's shape,
bf16 or fp8 weights, as gpu_shapes.sh writes them with HF=1), loads it with
transformers in float32 (eager attention; fp8 dequantized exactly first,
experts merged where transformers needs it: make_goldens.py's load_model),
runs the prompt IDS (comma-separated) and STEPS greedy steps with the KV
cache, and writes in `moec run --logits-out`'s layout, for
scripts/compare_logits.py to read as the reference:

  OUT_DIR/NAME-DT-cpu.bin  float32 rows: the prompt's last position, then one
                           row after each of the first STEPS - 1 greedy ids
  OUT_DIR/NAME-DT-cpu.txt  the STEPS greedy ids, space-separated

So the published configs' fields (rope scaling, grouped routing, biases,
head sizes) are checked against the reference implementation's reading of
them, not only against moec's own interpreter. A checkpoint transformers
cannot load cleanly is reported and skipped (exit 1 at the end).
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens  # noqa: E402  (the loader the goldens use)


def run(ckpt, ids, steps, device):
    import json

    import torch

    with open(os.path.join(ckpt, "config.json")) as f:
        quantized = make_goldens.fp8_block(json.load(f)) is not None
    with tempfile.TemporaryDirectory() as twin:
        model = make_goldens.load_model(ckpt, quantized, twin)
    model.to(device).eval()
    rows, greedy = make_goldens.run_steps(model, ids, steps - 1, device)
    return torch.stack([r[-1] for r in rows], 0).contiguous(), greedy


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    root, out_dir, ids, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ids = [int(v) for v in ids.split(",")]
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    os.makedirs(out_dir, exist_ok=True)
    bad = 0
    for name in sorted(os.listdir(root)):
        ckpt = os.path.join(root, name)
        if not os.path.isfile(os.path.join(ckpt, "config.json")):
            continue
        try:
            logits, greedy = run(ckpt, ids, steps, device)
        except (Exception, SystemExit) as e:  # one model's failure is reported, not fatal
            print(f"{name}: transformers failed: {str(e)[:300]}")
            bad += 1
            continue
        logits.numpy().astype("<f4").tofile(os.path.join(out_dir, f"{name}-cpu.bin"))
        with open(os.path.join(out_dir, f"{name}-cpu.txt"), "w") as f:
            f.write(" ".join(str(v) for v in greedy))
        print(f"{name}: {' '.join(str(v) for v in greedy)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
