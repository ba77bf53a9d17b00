#!/usr/bin/env python3
"""fp8_lt_probe.py — how fast cuBLASLt's block-scaled fp8 matmul (activations
quantized per token and 128-wide k block, weights per 128x128 block, as
DeepSeek's fp8 checkpoints and vLLM's `activation_scheme: dynamic` run them)
does V2-Lite's dense linears at decode's token counts, against bf16 in the
same process.

Each shape's weights are cycled through enough copies (more than twice the
H200's L2) that every call reads them from memory, as a decode step does;
each time is the mean of a CUDA Graph of REPS calls, one copy each. The
floor is the bytes (weights, scales, x, out) at the copy rate measured here.

    python3 bench/fp8_lt_probe.py [T ...]      (GPU; torch with _scaled_mm)
"""
import sys

import torch

SHAPES = [  # name, rows (out), K (in): DeepSeek-V2-Lite
    ("q_proj+kv_a", 3072 + 576, 2048),
    ("o_proj", 2048, 2048),
    ("shared gate_up", 2 * 2816, 2048),
    ("shared down", 2048, 2816),
    ("dense gate_up", 2 * 10944, 2048),
    ("dense down", 2048, 10944),
    ("dense down K pad", 2048, 11008),
]
REPS = 40
L2_X = 128 << 20  # bytes of weight copies per shape at least


def graph_ms(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    best = 1e9
    for _ in range(5):
        ev[0].record()
        g.replay()
        ev[1].record()
        torch.cuda.synchronize()
        best = min(best, ev[0].elapsed_time(ev[1]))
    return best / REPS


def copy_rate():
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)

    def f():
        for _ in range(REPS):
            b.copy_(a)

    ms = graph_ms(f)
    return 2 * a.numel() / (ms * 1e-3)


def quant_1x128(x):
    """x [T, K] bf16 -> (codes [T, K] e4m3, scales [T, ceil(K/128)] f32)."""
    T, K = x.shape
    kb = (K + 127) // 128
    xp = torch.nn.functional.pad(x.float(), (0, kb * 128 - K)).view(T, kb, 128)
    s = xp.abs().amax(-1).clamp(min=1e-12) / 448.0
    q = (xp / s[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(T, kb * 128)[:, :K]
    return q.contiguous(), s


def main():
    Ts = [int(a) for a in sys.argv[1:]] or [1, 8, 32, 64]
    torch.manual_seed(0)
    rate = copy_rate()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"copy rate {rate / 1e12:.2f} TB/s")
    print("shape | T | bf16 us | fp8 us | quant us | fp8 floor us | bf16 floor us | max rel err")
    for name, N, K in SHAPES:
        ncopy = max(2, -(-L2_X // (N * K)))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(ncopy)]
        wq, wsc = [], []
        for w in ws:
            nb, kb = -(-N // 128), -(-K // 128)
            wp = torch.nn.functional.pad(w.float(), (0, kb * 128 - K, 0, nb * 128 - N))
            s = wp.view(nb, 128, kb, 128).abs().amax((1, 3)).clamp(min=1e-12) / 448.0
            q = (wp.view(nb, 128, kb, 128) / s[:, None, :, None]).to(torch.float8_e4m3fn)
            wq.append(q.view(nb * 128, kb * 128)[:N, :K].contiguous())
            wsc.append(s.contiguous())
        for T in Ts:
            x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)

            def fb():
                for i in range(REPS):
                    torch.mm(x, ws[i % ncopy].t(), out=out)

            bf = graph_ms(fb)
            xq, xs = quant_1x128(x)
            f8 = qt = float("nan")
            err = float("nan")
            # scale_a: [T, K/128] outer-dim-major; scale_b: [K/128, N/128] of b = w.t()
            sa = xs.t().contiguous().t()
            for form in ("t", "t.contiguous"):
                sb = [s.t() if form == "t" else s.t().contiguous() for s in wsc]
                try:
                    y = torch._scaled_mm(xq, wq[0].t(), sa, sb[0], out_dtype=torch.bfloat16)
                    break
                except Exception as e:  # noqa: BLE001 (report and go on)
                    print(f"# {name} T={T} scale_b {form}: refused: "
                          f"{str(e).splitlines()[0][:200]}")
            try:
                def ff():
                    for i in range(REPS):
                        torch._scaled_mm(xq, wq[i % ncopy].t(), sa, sb[i % ncopy],
                                         out_dtype=torch.bfloat16)

                f8 = graph_ms(ff)
                y = torch._scaled_mm(xq, wq[0].t(), sa, sb[0], out_dtype=torch.bfloat16)
                nb, kb = wsc[0].shape
                wd = (wq[0].float().view(-1)[: N * K].view(N, K))
                wd = torch.nn.functional.pad(wd, (0, kb * 128 - K, 0, nb * 128 - N))
                wd = (wd.view(nb, 128, kb, 128) * wsc[0][:, None, :, None]).view(nb * 128, kb * 128)
                xd = torch.nn.functional.pad(xq.float(), (0, kb * 128 - K)).view(T, kb, 128)
                xd = (xd * xs[..., None]).view(T, kb * 128)
                ref = xd @ wd.t()
                ref = ref[:, :N]
                err = ((y.float() - ref).abs().amax(1) / ref.abs().amax(1)).max().item()
            except Exception as e:  # noqa: BLE001 (report and go on)
                print(f"# {name} T={T}: _scaled_mm refused: {str(e).splitlines()[0][:200]}")

            def fq():
                for _ in range(REPS):
                    quant_1x128(x)

            qt = graph_ms(fq)
            fl8 = (N * K + 4 * -(-N // 128) * -(-K // 128) + T * K * 2 + T * N * 2) / rate * 1e6
            flb = (N * K * 2 + T * K * 2 + T * N * 2) / rate * 1e6
            print(f"{name} | {T} | {bf * 1e3:.2f} | {f8 * 1e3:.2f} | {qt * 1e3:.2f} | "
                  f"{fl8:.2f} | {flb:.2f} | {err:.2e}", flush=True)
        del ws, wq, wsc
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
