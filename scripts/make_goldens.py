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

An fp8 block-scaled checkpoint (quantization_config quant_method "fp8":
F8_E4M3 weights beside F32 weight_scale_inv) is first dequantized exactly,
W = q * scale_inv of its block, into an F32 twin in a temporary folder with
quantization_config removed, and the twin is what transformers loads: the
goldens of the function the checkpoint defines, with no fp8 kernel involved.
The dequantization needs nothing past Python (no torch), so that

  make_goldens.py --dequantize SRC DST

writes the twin on any machine; tests/test_fp8.c checks it bit for bit
against moec's own dequantization. Where numpy imports (beside torch and
transformers it always does), the same arithmetic runs on whole arrays,
which the published shapes of scripts/hf_shapes.py need; MOEC_GOLDENS_PURE=1
keeps to plain Python, and the two write the same bytes (every product of an
e4m3 value and an f32 scale is exact in double, rounded once to f32 either
way; scripts/gpu_refcheck.sh compares them).

DeepSeek-V3.2 (deepseek_v32): its indexer selects index_topk tokens per
query, and a near-tie at the top-k boundary would let rounding decide the
selection, so every indexer call's smallest gap between the k-th and the
next score (relative to the row's largest score) is measured, and a golden
whose gap is under 1e-4 is refused. Where transformers has no checkpoint
conversion for the per-expert tensors of a model (its experts are 3-D
parameters: a missing mlp.experts.gate_up_proj), the experts are merged
into an F32 twin the same way (gate_up_proj = cat(gate, up), down_proj
stacked) and that is loaded.

Then transformers' own bf16 error on the golden (the same model cast to
bfloat16, the prompt and the golden's greedy tokens fed back, each row's
max |bf16 - fp32| over the row's max |fp32|) goes into golden.json's
"transformers_bf16": moec's bf16 GPU rows are held to twice it
(tests/gpu_model.c). --bf16-error measures only that, on existing goldens.

usage: make_goldens.py [--steps N] [--device cpu|cuda] [--bf16-error] [DIR ...]
       make_goldens.py --dequantize SRC DST
"""
import argparse
import json
import math
import os
import platform
import struct
import sys
import tempfile
from array import array


# ---- fp8 checkpoints -------------------------------------------------------

def e4m3_value(code):
    """float8_e4m3fn from the format's definition: sign, 4 exponent bits of
    bias 7, 3 mantissa bits; exponent 0 subnormal; S.1111.111 the only NaN."""
    sign, e, m = code >> 7, (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return math.nan
    v = math.ldexp(m, -9) if e == 0 else math.ldexp(8 + m, e - 10)
    return -v if sign else v


E4M3 = [e4m3_value(c) for c in range(256)]


def fast():
    """numpy, or None: plain Python (no numpy, or MOEC_GOLDENS_PURE=1)."""
    if os.environ.get("MOEC_GOLDENS_PURE") == "1":
        return None
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a single safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        out[name] = (t["dtype"], list(t["shape"]), data[base + lo:base + hi])
    return out


def write_safetensors_f32(path, tensors):
    """tensors: [(name, shape, array('f') or a numpy float32 array)], written
    in that order."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0  # transformers checks the format
    for name, shape, values in tensors:
        size = 4 * len(values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, values in tensors:
            f.write(values.tobytes())


def f32_array(raw):
    np = fast()
    if np:
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    a = array("f")
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def widen(dtype, raw):
    """A float tensor's values as array('f') (numpy: a float32 array)."""
    if dtype == "F32":
        return f32_array(raw)
    np = fast()
    if np and dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype("<u4") << 16).view("<f4")
    if np and dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    if dtype == "BF16":
        a = array("f")
        a.frombytes(b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2)))
        return a
    if dtype == "F16":
        return array("f", (v for (v,) in struct.iter_unpack("<e", raw)))
    sys.exit(f"cannot widen a {dtype} tensor")


def dequantize_tensor(name, shape, codes, scale_shape, scales, block):
    """W[.., i, j] = e4m3(q[.., i, j]) * s[.., i // bn, j // bk]: the product
    of an exact double and an f32 rounded once to f32, as one fp32 multiply
    rounds it."""
    if len(shape) < 2:
        sys.exit(f"{name}: an fp8 tensor needs rows and columns, has shape {shape}")
    bn, bk = block
    rows, cols = shape[-2], shape[-1]
    srows, scols = -(-rows // bn), -(-cols // bk)
    if scale_shape != shape[:-2] + [srows, scols]:
        sys.exit(f"{name}_scale_inv: shape {scale_shape}, expected {shape[:-2] + [srows, scols]} "
                 f"for {name} {shape} in blocks of {block}")
    if not all(math.isfinite(s) for s in scales):
        sys.exit(f"{name}_scale_inv: a scale is not finite")
    lead = len(codes) // (rows * cols)
    np = fast()
    if np:  # the same products in double, each rounded once to f32
        q = np.array(E4M3, dtype=np.float64)[np.frombuffer(codes, dtype=np.uint8)]
        s = np.asarray(scales, dtype=np.float64).reshape(lead, srows, scols)
        s = np.repeat(np.repeat(s, bn, axis=1)[:, :rows], bk, axis=2)[:, :, :cols]
        return (q.reshape(lead, rows, cols) * s).astype(np.float32).ravel()
    out = array("f", bytes(4 * len(codes)))
    for b in range(lead):
        for i in range(rows):
            srow = (b * srows + i // bn) * scols
            at = (b * rows + i) * cols
            for j in range(cols):
                out[at + j] = E4M3[codes[at + j]] * scales[srow + j // bk]
    return out


def fp8_block(config):
    """weight_block_size of an fp8 quantization_config, else None."""
    q = config.get("quantization_config")
    if not q:
        return None
    if q.get("quant_method") != "fp8" or q.get("fmt", "e4m3") != "e4m3":
        sys.exit(f"quantization_config {q} is not fp8 e4m3")
    block = q.get("weight_block_size", [128, 128])
    if not (isinstance(block, list) and len(block) == 2 and all(int(b) == b >= 1 for b in block)):
        sys.exit(f"weight_block_size {block} is not two sizes")
    return [int(b) for b in block]


def dequantize_checkpoint(src, dst):
    """Writes dst/config.json (quantization_config removed, torch_dtype
    float32) and dst/model.safetensors (every tensor F32, fp8 ones
    dequantized, their scales dropped) from the fp8 checkpoint in src."""
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    block = fp8_block(config)
    if block is None:
        sys.exit(f"{src}: config.json has no fp8 quantization_config")
    tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    scales = {n for n in tensors if n.endswith("_scale_inv")}
    out = []
    for name, (dtype, shape, raw) in tensors.items():
        if name in scales:
            if name[:-len("_scale_inv")] not in tensors:
                sys.exit(f"{name}: a scale without its tensor")
            continue
        if dtype == "F8_E4M3":
            sname = name + "_scale_inv"
            if sname not in tensors or tensors[sname][0] != "F32":
                sys.exit(f"{name}: fp8 without an F32 {sname}")
            values = dequantize_tensor(name, shape, raw, tensors[sname][1],
                                       f32_array(tensors[sname][2]), block)
        else:
            if name + "_scale_inv" in tensors:
                sys.exit(f"{name}: a {dtype} tensor with a block scale")
            values = widen(dtype, raw)
        out.append((name, shape, values))
    os.makedirs(dst, exist_ok=True)
    write_safetensors_f32(os.path.join(dst, "model.safetensors"), out)
    del config["quantization_config"]
    config["torch_dtype"] = "float32"
    config.pop("dtype", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return block


# ---- per-expert tensors merged ----------------------------------------------

def merge_experts_twin(src, dst):
    """Writes dst/config.json and dst/model.safetensors: src's checkpoint in
    F32 with each layer's per-expert gate/up/down tensors merged into the 3-D
    mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I]
    that transformers' DeepseekV3/V32 experts hold."""
    import re
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    pat = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
    experts, out = {}, []
    for name, (dtype, shape, raw) in tensors.items():
        m = pat.match(name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = (shape, widen(dtype, raw))
        else:
            out.append((name, shape, widen(dtype, raw)))
    for prefix, parts in sorted(experts.items()):
        n = 1 + max(e for e, _ in parts)
        gate_up = concat([parts[(e, p)][1] for e in range(n) for p in ("gate", "up")])
        down = concat([parts[(e, "down")][1] for e in range(n)])
        gs, ds = parts[(0, "gate")][0], parts[(0, "down")][0]
        out.append((prefix + ".gate_up_proj", [n, 2 * gs[0], gs[1]], gate_up))
        out.append((prefix + ".down_proj", [n, ds[0], ds[1]], down))
    os.makedirs(dst, exist_ok=True)
    write_safetensors_f32(os.path.join(dst, "model.safetensors"), out)
    config["torch_dtype"] = "float32"
    config.pop("dtype", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def concat(values):
    """The f32 arrays of values end to end (array('f'), or numpy's)."""
    np = fast()
    if np:
        return np.concatenate(values)
    out = array("f")
    for v in values:
        out.extend(v)
    return out


def experts_unconverted(info):
    """True when loading left only the 3-D expert parameters missing and
    the per-expert tensors unused: no conversion mapping for the model."""
    missing, unexpected = info.get("missing_keys") or [], info.get("unexpected_keys") or []
    return bool(missing) and (all(k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))
                            for k in missing)
            and all(".mlp.experts." in k for k in unexpected))


# ---- DSA: the indexer's top-k boundary --------------------------------------

class TopkMargin:
    """The smallest gap, relative to the row's largest |score|, between the
    k-th and the next index score of every call of a DSA indexer (a module
    whose class name ends in Indexer) while it is attached: Tensor.topk is
    wrapped during the indexer's forward only. Masked scores (-inf, or the
    mask's finfo.min added) are left out."""

    MASKED = -1e30

    def __init__(self, model):
        self.gap, self.calls, self.saved, self.handles = math.inf, 0, None, []
        for mod in model.modules():
            if type(mod).__name__.endswith("Indexer"):
                self.handles.append(mod.register_forward_pre_hook(self.enter))
                self.handles.append(mod.register_forward_hook(self.leave))

    def enter(self, mod, args):
        import torch
        self.saved = torch.Tensor.topk
        saved, margin = self.saved, self

        def topk(t, k, *a, **kw):
            n = t.shape[-1]
            if k < n:
                x = t.float()
                valid = torch.isfinite(x) & (x > margin.MASKED)
                v = saved(x, k + 1, dim=-1).values
                at_ok = torch.isfinite(v[..., k]) & (v[..., k] > margin.MASKED)
                if bool(at_ok.any()):
                    big = torch.where(valid, x.abs(), torch.zeros_like(x)).amax(-1).clamp_min(1e-30)
                    rel = ((v[..., k - 1] - v[..., k]) / big)[at_ok]
                    margin.gap = min(margin.gap, float(rel.min()))
            margin.calls += 1
            return saved(t, k, *a, **kw)

        torch.Tensor.topk = topk

    def leave(self, mod, args, out):
        import torch
        torch.Tensor.topk = self.saved


# ---- goldens ---------------------------------------------------------------

def load_model(model_dir, quantized, twin):
    """The fp32 model of model_dir (dequantized, or with its experts merged,
    into the folder twin when transformers needs it) and the folder it was
    loaded from."""
    import torch
    from transformers import AutoModelForCausalLM

    load_dir = model_dir
    if quantized:
        dequantize_checkpoint(model_dir, twin)
        load_dir = twin
    model, info = AutoModelForCausalLM.from_pretrained(
        load_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    if experts_unconverted(info):
        merged = os.path.join(twin, "merged")
        merge_experts_twin(load_dir, merged)
        print(f"{model_dir}: transformers does not convert per-expert tensors for this model; "
              f"loading them merged", file=sys.stderr)
        model, info = AutoModelForCausalLM.from_pretrained(
            merged, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if bad or info.get("error_msgs"):
        sys.exit(f"{model_dir}: transformers could not load every tensor cleanly: {info}")
    return model


def run_steps(model, prompt, steps, device, forced=None):
    """The prompt, then `steps` decode calls with the KV cache, each fed the
    argmax of the last row before it (greedy) or forced[k]: each call's
    logits (float32, on the CPU) and the argmax of each call's last row."""
    import torch

    rows, greedy = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
        for k in range(steps + 1):
            rows.append(out.logits[0].float().cpu())
            greedy.append(int(rows[-1][-1].argmax()))
            if k == steps:
                break
            nxt = greedy[-1] if forced is None else forced[k]
            out = model(input_ids=torch.tensor([[nxt]], device=device),
                        past_key_values=out.past_key_values, use_cache=True)
    return rows, greedy


def golden(model_dir, steps, device):
    import torch
    import transformers

    with open(os.path.join(model_dir, "prompt.json")) as f:
        prompt = json.load(f)["prompt_ids"]
    with open(os.path.join(model_dir, "config.json")) as f:
        block = fp8_block(json.load(f))
    quantized = block is not None
    with tempfile.TemporaryDirectory() as twin:
        model = load_model(model_dir, quantized, twin)
    if getattr(model.config, "quantization_config", None):
        sys.exit(f"{model_dir}: the dequantized twin still loaded as quantized")
    model.to(device).eval()
    margin = TopkMargin(model)
    rows, greedy = run_steps(model, prompt, steps, device)
    if margin.handles:
        print(f"{model_dir}: {margin.calls} indexer top-k calls, smallest relative gap at the "
              f"boundary {margin.gap:.3g}")
        if margin.gap < 1e-4:
            sys.exit(f"{model_dir}: an indexer top-k boundary is a near-tie (relative gap "
                     f"{margin.gap:.3g} < 1e-4): rounding would decide the golden; change the "
                     f"prompt or the weights (moec-sample --seed)")
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
    if quantized:
        meta["weights"] = f"fp8 e4m3, block scales {block[0]}x{block[1]}, dequantized to fp32"
    with open(os.path.join(model_dir, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"{model_dir}: {logits.shape[0]} rows, greedy {greedy}")


def bf16_error(model_dir, device):
    """transformers' own bf16 error on the golden: the model loaded as for
    the golden, cast to bfloat16, run on the prompt and then teacher-forced
    on the golden's greedy tokens; the worst row error against the fp32
    logits.bin (max |bf16 - fp32| over the row's max |fp32|, as the tests
    measure) and the rows whose argmax moved, written into golden.json's
    "transformers_bf16". tests/gpu_model.c holds moec's bf16 rows to twice
    this error."""
    import numpy
    import torch
    import transformers

    with open(os.path.join(model_dir, "golden.json")) as f:
        meta = json.load(f)
    with open(os.path.join(model_dir, "config.json")) as f:
        quantized = fp8_block(json.load(f)) is not None
    prompt, greedy, vocab = meta["prompt_ids"], meta["greedy_ids"], meta["vocab_size"]
    ref = numpy.fromfile(os.path.join(model_dir, "logits.bin"), dtype="<f4").reshape(-1, vocab)
    with tempfile.TemporaryDirectory() as twin:
        model = load_model(model_dir, quantized, twin)
    model.to(device=device, dtype=torch.bfloat16).eval()
    rows, _ = run_steps(model, prompt, len(greedy) - 1, device, forced=greedy[:-1])
    got = torch.cat(rows, 0).numpy()
    if got.shape != ref.shape:
        sys.exit(f"{model_dir}: bf16 rows {got.shape} but logits.bin {ref.shape}")
    err = numpy.abs(got - ref).max(1) / numpy.maximum(numpy.abs(ref).max(1), 1e-30)
    flips = int((got.argmax(1) != ref.argmax(1)).sum())
    meta["transformers_bf16"] = {
        "worst_row_error": float(err.max()),
        "mean_row_error": float(err.mean()),
        "argmax_flips": flips,
        "teacher_forced_rows": int(got.shape[0]),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
    }
    with open(os.path.join(model_dir, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"{model_dir}: transformers bf16 worst row error {err.max():.4g} (mean {err.mean():.4g}), "
          f"{flips} argmax flips over {got.shape[0]} rows")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--device", default=None, help="cuda when available, else cpu")
    ap.add_argument("--dequantize", nargs=2, metavar=("SRC", "DST"),
                    help="only write the F32 twin of the fp8 checkpoint SRC into DST")
    ap.add_argument("--bf16-error", action="store_true",
                    help="only measure transformers' bf16 error against the existing goldens "
                         "(golden.json's transformers_bf16)")
    ap.add_argument("dirs", nargs="*")
    a = ap.parse_args()
    if a.dequantize:
        dequantize_checkpoint(*a.dequantize)
        return
    import torch
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")
    dirs = a.dirs or sorted(os.path.join(root, d) for d in os.listdir(root)
                            if os.path.exists(os.path.join(root, d, "prompt.json")))
    for d in dirs:
        if a.bf16_error:
            bf16_error(d, device)
        else:
            golden(d, a.steps, device)
            bf16_error(d, device)


if __name__ == "__main__":
    main()
