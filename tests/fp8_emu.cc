// fp8_emu.cc — the staged fp8 kernels (codegen/fp8_tc.c), the few-token fp8
// linear and the tensor-core bf16 one (codegen/linear.c) and the streaming
// fp8 expert GEMMs (codegen/moe_routed.c), as the generator writes them for
// fp8_emu_gen's cases, run on the CPU emulator (cuda_emu.h) against a
// double-precision reference of the same random weights: e4m3 codes (every
// code but the NaNs) times random block scales (the streaming form and the
// tensor-core linear: bf16 weights too), bf16 activations. Every
// output starts as NaN, so an element a kernel leaves unwritten fails;
// errors are relative to each row's largest magnitude (bf16 outputs and h:
// 1e-2; h is f32 in the streaming form). The routed experts' align and sum
// run here (slots sorted by expert, padded to the kernels' blocks). Built
// and run by tests/test_fp8_emu.sh, under an address or a thread sanitizer.
#include "cuda_emu.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <type_traits>

struct emu_step {
    void (*fn)();
    unsigned gx, gy, block, smem;
    int cluster;
};
struct emu_case {
    int moe;
    const char *what;
    int LN, LK, E, K, H, I, BN, BK, T, bm; // bm: slots a block of the expert kernels
    int h32; // the streaming expert GEMMs (h in f32), else the staged or tensor-core ones (bf16)
    int w16; // bf16 weights (experts: the streaming or tensor-core form), else fp8
    int act; // a linear with act silu_mul: x [T, 2 LK]
    int tl_gu, tl_dn; // the experts' gate_up and down codes in fragment tiles (ir_weight_tiled);
                      // tl_gu: a linear's weight
    int mma; // the experts' first tensor-core form (mma: a warp a block, no shared memory)
    emu_step steps[2];
    int n_steps;
};

#include EMU_CASES

#define TOL 1e-2

static double e4m3(uint8_t c)
{
    const int e = (c >> 3) & 15, m = c & 7;
    const double v = e == 0 ? m * std::ldexp(1.0, -9) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
    return c & 0x80 ? -v : v;
}

template <class T> struct buf {
    std::vector<T> v; // exactly n elements: the sanitizer sees any access past them
    explicit buf(size_t n) : v(n) {}
    T *p() { return v.data(); }
};

struct rng {
    std::mt19937_64 g;
    explicit rng(uint64_t seed) : g(seed) {}
    float uni(float a) { return std::uniform_real_distribution<float>(-a, a)(g); }
    uint8_t code()
    {
        uint8_t q = (uint8_t)(g() >> 56);
        return (q & 0x7f) == 0x7f ? q - 1 : q;
    }
};

// An fp8 weight [n_lead][rows][cols] with its scale grid.
struct f8w {
    int lead, rows, cols, bn, bk, sr, sc;
    buf<uint8_t> q;
    buf<float> s;
    f8w(rng &r, int lead_, int rows_, int cols_, int bn_, int bk_, float a)
        : lead(lead_), rows(rows_), cols(cols_), bn(bn_), bk(bk_), sr((rows_ + bn_ - 1) / bn_),
          sc((cols_ + bk_ - 1) / bk_), q((size_t)lead_ * rows_ * cols_), s((size_t)lead_ * sr * sc)
    {
        for (uint8_t &c : q.v)
            c = r.code();
        for (float &x : s.v)
            x = a / 448.0f * (1.0f + 0.5f * r.uni(1.0f));
    }
    double at(int l, int row, int col) const
    {
        return e4m3(q.v[((size_t)l * rows + row) * cols + col]) *
               s.v[((size_t)l * sr + row / bn) * sc + col / bk];
    }
    // the codes, or with tiled a copy in fragment tiles: each 16 rows a tile,
    // 64 columns a chunk of 1 KiB, which holds lane (g, q)'s 16 codes of rows g,
    // then of rows g + 8, at columns 16 q, lanes in order 4 g + q
    const __nv_fp8_e4m3 *codes(bool tiled = false)
    {
        if (!tiled)
            return (const __nv_fp8_e4m3 *)q.p();
        assert(rows % 16 == 0 && cols % 64 == 0);
        t.v.assign(q.v.size(), 0);
        for (size_t tile = 0; tile < (size_t)lead * rows / 16; tile++)
            for (int ch = 0; ch < cols / 64; ch++)
                for (int half = 0; half < 2; half++)
                    for (int g = 0; g < 8; g++)
                        for (int qq = 0; qq < 4; qq++)
                            memcpy(&t.v[tile * 16 * cols + ch * 1024 + half * 512 + (g * 4 + qq) * 16],
                                   &q.v[(tile * 16 + half * 8 + g) * cols + ch * 64 + qq * 16], 16);
        return (const __nv_fp8_e4m3 *)t.p();
    }
    buf<uint8_t> t{0};
};

// A bf16 weight [n_lead][rows][cols] (the streaming form's bf16 experts).
struct bfw {
    int lead, rows, cols;
    buf<__nv_bfloat16> w;
    bfw(rng &r, int lead_, int rows_, int cols_, int, int, float a)
        : lead(lead_), rows(rows_), cols(cols_), w((size_t)lead_ * rows_ * cols_)
    {
        for (__nv_bfloat16 &v : w.v)
            v.v = emu_f2bf(r.uni(a));
    }
    double at(int l, int row, int col) const
    {
        return emu_bf2f(w.v[((size_t)l * rows + row) * cols + col].v);
    }
    const __nv_bfloat16 *codes(bool = false) { return w.p(); }
};

// Rows of n: the worst |got - ref| over the row's largest |ref|; a
// non-finite value is infinitely wrong.
static double row_error(const float *got, const double *ref, int n)
{
    double mx = 1e-30, worst = 0;
    for (int i = 0; i < n; i++)
        mx = std::max(mx, std::fabs(ref[i]));
    for (int i = 0; i < n; i++)
        worst = std::max(worst, std::isfinite(got[i]) ? std::fabs(got[i] - ref[i]) / mx : INFINITY);
    return worst;
}

// W: the weight, f8w (codes, then their scales, passed to the kernel) or
// bfw; with c.act, h = silu(gate) * up of x [T, 2 LK], rounded to bf16 as
// the kernels store it.
template <class W> static double run_linear(const emu_case &c)
{
    constexpr bool f8 = std::is_same_v<W, f8w>;
    using fn_t = void (*)(const __nv_bfloat16 *, const __nv_fp8_e4m3 *, const float *, const float *,
                          float, __nv_bfloat16 *);
    using fn16_t = void (*)(const __nv_bfloat16 *, const __nv_bfloat16 *, const float *, float,
                            __nv_bfloat16 *);
    rng r(1000 + c.LN * 7 + c.T);
    W w(r, 1, c.LN, c.LK, c.BN, c.BK, std::sqrt(3.0f / c.LK));
    const int xk = (c.act ? 2 : 1) * c.LK;
    buf<__nv_bfloat16> x((size_t)c.T * xk), y((size_t)c.T * c.LN);
    for (__nv_bfloat16 &v : x.v)
        v.v = emu_f2bf(r.uni(1.7f));
    for (__nv_bfloat16 &v : y.v)
        v.v = 0xffff;
    const emu_step &s = c.steps[0];
    const auto *wq = w.codes(c.tl_gu); // once: the launch runs its blocks on several threads
    emu_launch(s.gx, s.gy, s.block, s.smem, s.cluster, [&] {
        if constexpr (f8)
            ((fn_t)s.fn)(x.p(), wq, w.s.p(), w.s.p(), 1.0f, y.p());
        else
            ((fn16_t)s.fn)(x.p(), wq, nullptr, 1.0f, y.p());
    });
    double worst = 0;
    std::vector<double> ref(c.LN), h(c.LK);
    std::vector<float> got(c.LN);
    for (int t = 0; t < c.T; t++) {
        for (int k = 0; k < c.LK; k++) {
            const double g = emu_bf2f(x.v[(size_t)t * xk + k].v);
            h[k] = c.act ? emu_bf2f(emu_f2bf(
                               (float)(g / (1 + std::exp(-g)) * emu_bf2f(x.v[(size_t)t * xk + c.LK + k].v))))
                         : g;
        }
        for (int n = 0; n < c.LN; n++) {
            double acc = 0;
            for (int k = 0; k < c.LK; k++)
                acc += w.at(0, n, k) * h[k];
            ref[n] = acc;
            got[n] = emu_bf2f(y.v[(size_t)t * c.LN + n].v);
        }
        worst = std::max(worst, row_error(got.data(), ref.data(), c.LN));
    }
    return worst;
}

static float h_value(__nv_bfloat16 v) { return emu_bf2f(v.v); }
static float h_value(float v) { return v; }

// TH: h's type, bf16 (the staged and tensor-core kernels) or f32 (the streaming ones); W:
// the weights, f8w (codes, then their scales, passed to the kernels) or bfw.
template <class TH, class W> static double run_moe(const emu_case &c, bool split)
{
    constexpr bool f8 = std::is_same_v<W, f8w>;
    using TW = std::conditional_t<f8, __nv_fp8_e4m3, __nv_bfloat16>;
    using gu_t = void (*)(const __nv_bfloat16 *, const TW *, const TW *, const float *,
                          const float *, const int *, const int *, const int *, TH *);
    using dn_t = void (*)(const TH *, const TW *, const float *, const int *, const int *,
                          const int *, const float *, float, float *);
    using gu16_t = void (*)(const __nv_bfloat16 *, const TW *, const TW *, const int *,
                            const int *, const int *, TH *);
    using dn16_t = void (*)(const TH *, const TW *, const int *, const int *, const int *,
                            const float *, float, float *);
    const int E = c.E, K = c.K, H = c.H, I = c.I, T = c.T, N = T * K;
    const float scale = 0.75f;
    rng r(2000 + E * 31 + H + T);
    W gate(r, E, split ? I : 2 * I, H, c.BN, c.BK, std::sqrt(3.0f / H));
    W up(r, split ? E : 1, split ? I : 1, split ? H : 1, c.BN, c.BK, std::sqrt(3.0f / H));
    W down(r, E, H, I, c.BN, c.BK, std::sqrt(12.0f / I));
    buf<__nv_bfloat16> x((size_t)T * H);
    buf<TH> h((size_t)N * I);
    buf<float> wts(N), y((size_t)N * H);
    for (__nv_bfloat16 &v : x.v)
        v.v = emu_f2bf(r.uni(1.7f));
    std::vector<int> ids(N);
    for (int t = 0; t < T; t++) {
        std::vector<int> p(E);
        for (int e = 0; e < E; e++)
            p[e] = e;
        std::shuffle(p.begin(), p.end(), r.g);
        for (int k = 0; k < K; k++) {
            ids[t * K + k] = p[k];
            wts.v[t * K + k] = 0.5f + 0.5f * r.uni(1.0f);
        }
    }
    // align: each expert's slots in blocks of bm, the blocks past the used ones empty
    const unsigned nb = c.steps[0].gx;
    const int bm = c.bm;
    assert(c.h32   ? bm >= 1 && bm <= 2 && c.steps[1].smem == 0
           : c.mma ? bm >= 8 && c.steps[1].smem == 0
                   : bm >= 8 && c.steps[1].smem == (unsigned)(bm * (I + 8) * 2));
    buf<int> sorted((size_t)nb * bm), blk(nb), used(1);
    std::fill(sorted.v.begin(), sorted.v.end(), -1);
    std::fill(blk.v.begin(), blk.v.end(), -1);
    int off = 0;
    for (int e = 0; e < E; e++) {
        std::vector<int> sl;
        for (int i = 0; i < N; i++)
            if (ids[i] == e)
                sl.push_back(i);
        const int n = ((int)sl.size() + bm - 1) / bm;
        for (int b = 0; b < n; b++)
            blk.v[off + b] = e;
        for (size_t j = 0; j < sl.size(); j++)
            sorted.v[(size_t)off * bm + j] = sl[j];
        off += n;
    }
    assert(off <= (int)nb);
    used.v[0] = off;
    memset(h.p(), 0xff, h.v.size() * sizeof(TH));
    std::fill(y.v.begin(), y.v.end(), NAN);
    const emu_step &g = c.steps[0], &d = c.steps[1];
    const TW *gq = gate.codes(c.tl_gu), *uq = split ? up.codes(c.tl_gu) : gq,
             *dq = down.codes(c.tl_dn);
    emu_launch(g.gx, g.gy, g.block, g.smem, g.cluster, [&] {
        if constexpr (f8)
            ((gu_t)g.fn)(x.p(), gq, uq, gate.s.p(), split ? up.s.p() : gate.s.p(), sorted.p(),
                         blk.p(), used.p(), h.p());
        else
            ((gu16_t)g.fn)(x.p(), gq, uq, sorted.p(), blk.p(), used.p(), h.p());
    });
    emu_launch(d.gx, d.gy, d.block, d.smem, d.cluster, [&] {
        if constexpr (f8)
            ((dn_t)d.fn)(h.p(), dq, down.s.p(), sorted.p(), blk.p(), used.p(), wts.p(),
                         scale, y.p());
        else
            ((dn16_t)d.fn)(h.p(), dq, sorted.p(), blk.p(), used.p(), wts.p(), scale,
                           y.p());
    });
    double worst = 0;
    std::vector<double> ref(H), hv(I);
    std::vector<float> got(H);
    for (int t = 0; t < T; t++) {
        std::fill(ref.begin(), ref.end(), 0.0);
        std::fill(got.begin(), got.end(), 0.0f);
        for (int k = 0; k < K; k++) {
            const int sl = t * K + k, e = ids[sl];
            for (int i = 0; i < I; i++) {
                double gs = 0, us = 0;
                for (int j = 0; j < H; j++) {
                    const double xv = emu_bf2f(x.v[(size_t)t * H + j].v);
                    gs += gate.at(e, i, j) * xv;
                    us += (split ? up.at(e, i, j) : gate.at(e, I + i, j)) * xv;
                }
                hv[i] = gs / (1 + std::exp(-gs)) * us;
            }
            std::vector<float> gh(I);
            for (int i = 0; i < I; i++)
                gh[i] = h_value(h.v[(size_t)sl * I + i]);
            worst = std::max(worst, row_error(gh.data(), hv.data(), I));
            for (int j = 0; j < H; j++) {
                double acc = 0;
                for (int i = 0; i < I; i++)
                    acc += down.at(e, j, i) * hv[i];
                ref[j] += scale * wts.v[sl] * acc;
                got[j] += y.v[(size_t)sl * H + j];
            }
        }
        worst = std::max(worst, row_error(got.data(), ref.data(), H));
    }
    return worst;
}

// fp8_emu [I,J,...]: the cases given (indices into CASES), or all of them.
int main(int argc, char **argv)
{
    const int all = (int)(sizeof CASES / sizeof CASES[0]);
    std::vector<int> which;
    for (char *p = argc > 1 ? argv[1] : nullptr; p && *p; p += *p == ',') {
        char *end;
        const long i = strtol(p, &end, 10);
        if (end == p || i < 0 || i >= all) {
            fprintf(stderr, "fp8_emu: bad case list %s (0 to %d)\n", argv[1], all - 1);
            return 2;
        }
        which.push_back((int)i);
        p = end;
    }
    if (which.empty())
        for (int i = 0; i < all; i++)
            which.push_back(i);
    int failed = 0;
    for (int i : which) {
        const emu_case &c = CASES[i];
        const auto t0 = std::chrono::steady_clock::now();
        const bool split = strstr(c.what, "split") != nullptr;
        const double worst = !c.moe   ? (c.w16 ? run_linear<bfw>(c) : run_linear<f8w>(c))
                             : c.w16 ? (c.h32 ? run_moe<float, bfw>(c, split)
                                              : run_moe<__nv_bfloat16, bfw>(c, split))
                             : c.h32 ? run_moe<float, f8w>(c, split)
                                     : run_moe<__nv_bfloat16, f8w>(c, split);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const bool ok = worst <= TOL;
        failed += !ok;
        printf("%s %-48s worst error %.3g (%.1f s)\n", ok ? "ok  " : "FAIL", c.what, worst, s);
    }
    printf("fp8_emu: %d of %d cases passed\n", (int)which.size() - failed, (int)which.size());
    return failed ? 1 : 0;
}
