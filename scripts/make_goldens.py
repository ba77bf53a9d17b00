#!/usr/bin/env python3
"""Computes the reference logits and greedy tokens of the tiny test models
with Hugging Face transformers, in fp32.

For each tests/data/<name>/ holding config.json, model.safetensors and
prompt.json, loads the model with transformers (eager attention, float32,
weights widened from their stored dtype), runs the prompt, then N greedy
decode steps with the KV cache, and writes:

  logits.bin   float32 little-endian, rows = len(prompt) + N, each vocab_size:
               every prompt position, then each decode step's position
  golden.json  prompt ids, greedy ids (N + 1: one from the prompt's last row,
               one per decode step), shapes, versions, device

Loading fails if transformers reports any missing, unexpected or misshaped
tensor, so the sample writer's names are checked against the reference too.

usage: make_goldens.py [--steps N] [--device cpu|cuda] [DIR ...]
"""
import argparse
import json
import os
import platform
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM


def golden(model_dir, steps, device):
    with open(os.path.join(model_dir, "prompt.json")) as f:
        prompt = json.load(f)["prompt_ids"]
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if bad or info.get("error_msgs"):
        sys.exit(f"{model_dir}: transformers could not load every tensor cleanly: {info}")
    model.to(device).eval()
    rows, greedy = [], []
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device)
        out = model(input_ids=ids, use_cache=True)
        rows.append(out.logits[0].float().cpu())
        past = out.past_key_values
        nxt = int(out.logits[0, -1].argmax())
        greedy.append(nxt)
        for _ in range(steps):
            out = model(input_ids=torch.tensor([[nxt]], device=device), past_key_values=past,
                        use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0].float().cpu())
            nxt = int(out.logits[0, -1].argmax())
            greedy.append(nxt)
    logits = torch.cat(rows, 0).contiguous()
    logits.numpy().astype("<f4").tofile(os.path.join(model_dir, "logits.bin"))
    meta = {
        "prompt_ids": prompt,
        "greedy_ids": greedy,
        "rows": int(logits.shape[0]),
        "vocab_size": int(logits.shape[1]),
        "decode_steps": steps,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
    }
    with open(os.path.join(model_dir, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"{model_dir}: {logits.shape[0]} rows, greedy {greedy}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("dirs", nargs="*")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
    dirs = a.dirs or sorted(os.path.join(root, d) for d in os.listdir(root)
                            if os.path.exists(os.path.join(root, d, "prompt.json")))
    for d in dirs:
        golden(d, a.steps, a.device)


if __name__ == "__main__":
    main()
