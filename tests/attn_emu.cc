// attn_emu.cc — the GQA attention kernels over the paged KV cache
// (codegen/attention.c), as attn_emu_gen writes them for its cases, run on
// the CPU emulator (cuda_emu.h) against a double-precision reference of
// the same bf16 values: each token its own sequence at its own position
// (1 to a few hundred: tile and split edges), its pages scattered over the
// pool, one padding token where there are several (its output must be
// zeros). The splits that hold positions (their partial states' weights)
// show the lanes a position each token ran with, checked against the
// count fixed or the rule the kernel chooses by at run time. Every output
// starts as NaN, so an element a kernel leaves unwritten fails; errors
// are relative to each head's largest magnitude (bf16 outputs: 1e-2).
// The fused prologue's cases (MOEC_ATTN_FUSE_PROLOGUE=1, one token) run
// the prologue kernel then the attention, and the one kernel that does
// both, from the same qkv row and pools: the same output and pool bits.
// The MLA attention's tensor-core cases (codegen/mla_attention.c) run
// against a double-precision reference the same way.
// Built and run by tests/test_attn_emu.sh, under an address or a thread
// sanitizer.
#include "cuda_emu.h"

#include <algorithm>
#include <random>

#define MOEC_NEG_INF (-INFINITY)
#define MOEC_LN2 0.6931471805599453f
#define MOEC_LOG2E 1.4426950408889634f

struct attn_bufs {
    const __nv_bfloat16 *q;
    const int *pos, *slots, *bt;
    int max_blocks;
    const __nv_bfloat16 *kpool, *vpool;
    __nv_bfloat16 *out;
    float scale;
    int window;
    float *part_ml, *part_o;
    unsigned *cnt;
};
struct attn_case {
    const char *name;
    int H, HKV, DK, DV, T, window, bs, ns, lpp, merged;
    int tc_min; // the tensor cores' form: the fewest positions of a split (else 0)
    void (*run)(attn_bufs &);
};

// The fused prologue's cases: one token, its qkv row x (and Qwen3's
// norms), run as the prologue kernel then the attention (f0) and as the
// one attention kernel that runs the prologue itself (f1).
struct pro_bufs {
    const __nv_bfloat16 *x, *qw, *kw;
    float eps;
    const int *pos, *slots, *bt;
    int max_blocks;
    __nv_bfloat16 *kpool, *vpool, *q, *k, *v, *out;
    float scale;
    int window;
    float *part_ml, *part_o;
    unsigned *cnt;
};
struct pro_case {
    int H, HKV, D, N, norm, window, bs, ns, merged, all_pos;
    void (*unfused)(pro_bufs &), (*fused)(pro_bufs &);
};

// The MLA attention on tensor cores (codegen/mla_attention.c): q_c [T, H,
// R] and q_pe [T, H, DR] over the compressed cache's kv_c [rows, R] and
// k_pe [rows, DR] pools; the values are kv_c itself.
struct mla_bufs {
    const __nv_bfloat16 *q_c, *q_pe;
    const int *pos, *slots, *bt;
    int max_blocks;
    const __nv_bfloat16 *kvpool, *pepool;
    __nv_bfloat16 *out;
    float scale;
    int window;
    float *part_ml, *part_o;
    unsigned *cnt;
};
struct mla_case {
    const char *name;
    int H, R, DR, T, window, bs, ns, merged, chunk;
    void (*run)(mla_bufs &);
};

#include EMU_CASES

#define TOL 1e-2

// A step's tokens: token t its own sequence t at its position (edge's
// first, tile and split edges, then random ones below 300), a padding
// token (slot -1) where there are more than two; every sequence max_blocks
// pages of bs rows, scattered over the pool: sequence s's page j at
// bt[s * max_blocks + j]. first(t, window): token t's first position in
// its window (0 without one); row(t, pp): the pool row of its position pp.
struct emu_step {
    std::vector<int> pos, slots, bt;
    int max_blocks, pages, bs;
    int first(int t, int window) const
    {
        return window > 0 && pos[t] - window + 1 > 0 ? pos[t] - window + 1 : 0;
    }
    size_t row(int t, int pp) const
    {
        return (size_t)bt[(size_t)slots[t] * max_blocks + pp / bs] * bs + pp % bs;
    }
};
static emu_step emu_tokens(std::mt19937_64 &g, int T, int bs, const int *edge, int n_edge)
{
    emu_step st;
    st.pos.resize(T);
    st.slots.resize(T);
    int max_p = 0;
    for (int t = 0; t < T; t++) {
        st.pos[t] = t < n_edge ? edge[t] : (int)(g() % 300);
        st.slots[t] = t;
        max_p = std::max(max_p, st.pos[t]);
    }
    if (T > 2)
        st.slots[T - 2] = -1; // a padding token
    st.bs = bs;
    st.max_blocks = max_p / bs + 1;
    st.pages = T * st.max_blocks;
    st.bt.resize(st.pages);
    for (int i = 0; i < st.pages; i++)
        st.bt[i] = i;
    std::shuffle(st.bt.begin(), st.bt.end(), g);
    return st;
}

// Head output o [dv] of a token at position p (window: lo .. p) against
// the softmax of score(pp) (scaled) over those positions weighting
// value(pp, d): the worst error relative to the reference's largest
// magnitude (NaN: infinite).
template <typename S, typename V>
static double head_error(const __nv_bfloat16 *o, int dv, int lo, int p, S score, V value)
{
    std::vector<double> sc(p - lo + 1), ref(dv, 0.0);
    double mx = -INFINITY, l = 0;
    for (int pp = lo; pp <= p; pp++) {
        sc[pp - lo] = score(pp);
        mx = std::max(mx, sc[pp - lo]);
    }
    for (int pp = lo; pp <= p; pp++) {
        const double w = std::exp(sc[pp - lo] - mx);
        l += w;
        for (int d = 0; d < dv; d++)
            ref[d] += w * value(pp, d);
    }
    double big = 1e-30, err = 0;
    for (int d = 0; d < dv; d++) {
        ref[d] /= l;
        big = std::max(big, std::fabs(ref[d]));
    }
    for (int d = 0; d < dv; d++) {
        const double e = std::fabs((double)ld(o + d) - ref[d]);
        err = std::max(err, std::isnan(e) ? INFINITY : e);
    }
    return err / big;
}

// v's elements uniform in [-a, a] as bf16, drawn in order from uni.
template <typename U> static void fill_uni(std::vector<__nv_bfloat16> &v, U &uni, float a)
{
    for (auto &x : v)
        x = __float2bfloat16(uni(a));
}

// v's elements NaN: an element a kernel leaves unwritten fails.
static void fill_nan(std::vector<__nv_bfloat16> &v)
{
    for (auto &x : v)
        x.v = 0x7fc0;
}

// A padding token's head output: not zeros, counted.
static int nonzero(const __nv_bfloat16 *o, int n)
{
    int bad = 0;
    for (int d = 0; d < n; d++)
        bad += ld(o + d) != 0.0f;
    return bad;
}

static int run_case(int ci, const attn_case &c)
{
    std::mt19937_64 g(0xa77e0000u + (uint64_t)ci);
    auto uni = [&](float a) { return std::uniform_real_distribution<float>(-a, a)(g); };
    const int T = c.T, G = c.H / c.HKV;
    static const int EDGE[] = {300, 0, 31, 32, 33, 127, 128, 129, 5, 64, 255, 1};
    emu_step st = emu_tokens(g, T, c.bs, EDGE, (int)(sizeof EDGE / sizeof EDGE[0]));
    const std::vector<int> &pos = st.pos, &slots = st.slots, &bt = st.bt;
    const int max_blocks = st.max_blocks, pages = st.pages;
    int bad = 0;
    const size_t rows = (size_t)pages * c.bs;
    std::vector<__nv_bfloat16> q((size_t)T * c.H * c.DK), kp(rows * c.HKV * c.DK),
        vp(rows * c.HKV * c.DV), out((size_t)T * c.H * c.DV);
    fill_uni(q, uni, 1.0f);
    fill_uni(kp, uni, 1.0f);
    fill_uni(vp, uni, 1.0f);
    fill_nan(out);
    std::vector<float> part_ml((size_t)T * c.H * c.ns * 2), part_o((size_t)T * c.H * c.ns * c.DV);
    std::vector<unsigned> cnt((size_t)T * c.H, 0u); // a counter a (token, head group) at most
    attn_bufs b{q.data(), pos.data(), slots.data(), bt.data(), max_blocks, kp.data(), vp.data(),
                out.data(), 0.3f, c.window, c.ns > 1 ? part_ml.data() : nullptr,
                c.ns > 1 ? part_o.data() : nullptr, c.merged ? cnt.data() : nullptr};
    c.run(b);
    // the last block of each group sets its counter back to 0 for the next step
    for (unsigned k : cnt)
        bad += k != 0;
    // the lanes a position each token ran with, seen in how many splits
    // hold positions (a weight above -inf in the partial states): with L
    // lanes a tile holds 32 / L positions and a split at least 4 tiles;
    // the kernel's choice at run time (lpp 0) takes 4 while the positions
    // fill no more than ns splits of 32, 2 while no more than ns of 64;
    // the tensor cores' form tiles of 16 and splits of at least tc_min
    int wrong_lanes = 0;
    for (int t = 0; t < T && c.ns > 1; t++) {
        if (slots[t] < 0)
            continue;
        const int p = pos[t], lo = st.first(t, c.window);
        const int n = p - lo + 1;
        const int L = c.lpp ? c.lpp : n <= c.ns * 32 ? 4 : n <= c.ns * 64 ? 2 : 1;
        const int tile = c.tc_min ? 16 : 32 / L, n_tiles = (n + tile - 1) / tile;
        const int per_min = c.tc_min ? (c.tc_min + 15) / 16 : 4;
        const int per = std::max((n_tiles + c.ns - 1) / c.ns, per_min);
        const int want = (n_tiles + per - 1) / per;
        for (int h = 0; h < c.H; h++) {
            int held = 0;
            for (int sp = 0; sp < c.ns; sp++)
                held += part_ml[(((size_t)t * c.H + h) * c.ns + sp) * 2] != -INFINITY;
            if (held != want && wrong_lanes++ < 3)
                printf("  token %d (%d positions), head %d: %d splits hold positions, %d with %d "
                       "lanes a position\n",
                       t, n, h, held, want, L);
        }
    }
    bad += wrong_lanes;
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < c.H; h++) {
            const __nv_bfloat16 *o = &out[((size_t)t * c.H + h) * c.DV];
            if (slots[t] < 0) {
                bad += nonzero(o, c.DV);
                continue;
            }
            const int p = pos[t], kh = h / G, lo = st.first(t, c.window);
            auto row = [&](int pp) { return st.row(t, pp); };
            auto score = [&](int pp) {
                double s = 0;
                for (int d = 0; d < c.DK; d++)
                    s += (double)ld(&q[((size_t)t * c.H + h) * c.DK + d]) *
                         ld(&kp[(row(pp) * c.HKV + kh) * c.DK + d]);
                return s * (double)0.3f;
            };
            auto value = [&](int pp, int d) {
                return (double)ld(&vp[(row(pp) * c.HKV + kh) * c.DV + d]);
            };
            worst = std::max(worst, head_error(o, c.DV, lo, p, score, value));
        }
    const bool ok = worst <= TOL && bad == 0;
    char lanes[48] = "lanes by each token's positions";
    if (strstr(c.name, "_tc_"))
        snprintf(lanes, sizeof lanes, "tensor cores");
    else if (c.lpp > 0)
        snprintf(lanes, sizeof lanes, "%d lanes a position", c.lpp);
    printf("%s case %d %s: T %d, %d splits%s, %s, worst error %.2e%s\n", ok ? "ok" : "FAIL", ci,
           c.name, T, c.ns, c.merged ? " merged by the last block" : "", lanes, worst,
           bad ? ", a padding token's output, a split counter not zero or the splits "
                 "holding positions not as the lanes a position make them"
               : "");
    return ok;
}

// A fused-prologue case at positions that end a tile, a split or neither
// (0, 300, 1000; 300 alone where all_pos is 0), and for a padding token: both forms from the same row and the same
// pools must give the same output bits and the same pools (the token's k
// and v rows written, as the prologue writes them), and no NaN.
static int run_pro_case(int ci, const pro_case &c)
{
    std::mt19937_64 g(0x9e0000u + (uint64_t)ci);
    auto uni = [&](float a) { return std::uniform_real_distribution<float>(-a, a)(g); };
    static const int ALL[] = {0, 300, 1000, -1}, FEW[] = {300, -1};
    const int *pos_list = c.all_pos ? ALL : FEW, n_pos = c.all_pos ? 4 : 2;
    int bad = 0;
    for (int pi = 0; pi < n_pos; pi++) {
        const int p = pos_list[pi] < 0 ? 33 : pos_list[pi], slot = pos_list[pi] < 0 ? -1 : 0;
        const int max_blocks = p / c.bs + 1 + 2, pages = max_blocks;
        std::vector<int> bt(pages); // the sequence's pages scattered, each its own
        for (int i = 0; i < pages; i++)
            bt[i] = i;
        std::shuffle(bt.begin(), bt.end(), g);
        const size_t rows = (size_t)pages * c.bs, kvn = rows * c.HKV * c.D;
        std::vector<__nv_bfloat16> x(c.N), qw(c.D), kw(c.D), kp(kvn), vp(kvn);
        fill_uni(x, uni, 2.0f);
        for (auto &e : qw)
            e = __float2bfloat16(0.5f + uni(0.5f));
        for (auto &e : kw)
            e = __float2bfloat16(0.5f + uni(0.5f));
        fill_uni(kp, uni, 1.0f);
        fill_uni(vp, uni, 1.0f);
        std::vector<__nv_bfloat16> out[2], kpo[2], vpo[2];
        for (int f = 0; f < 2; f++) {
            std::vector<__nv_bfloat16> q((size_t)c.H * c.D), k((size_t)c.HKV * c.D),
                v((size_t)c.HKV * c.D);
            kpo[f] = kp;
            vpo[f] = vp;
            out[f].assign((size_t)c.H * c.D, __nv_bfloat16{});
            fill_nan(out[f]);
            std::vector<float> part_ml((size_t)c.H * c.ns * 2), part_o((size_t)c.H * c.ns * c.D);
            std::vector<unsigned> cnt((size_t)c.H, 0u);
            pro_bufs b{x.data(), qw.data(), kw.data(), 1e-6f, &p, &slot, bt.data(), max_blocks,
                       kpo[f].data(), vpo[f].data(), q.data(), k.data(), v.data(), out[f].data(),
                       0.3f, c.window, c.ns > 1 ? part_ml.data() : nullptr,
                       c.ns > 1 ? part_o.data() : nullptr, c.merged ? cnt.data() : nullptr};
            (f ? c.fused : c.unfused)(b);
            for (unsigned u : cnt)
                bad += u != 0;
        }
        int diff = 0, nan = 0;
        for (size_t i = 0; i < out[0].size(); i++) {
            diff += out[0][i].v != out[1][i].v;
            nan += std::isnan(ld(&out[1][i]));
        }
        int pool_diff = 0, row_new = 0;
        for (size_t i = 0; i < kp.size(); i++) {
            pool_diff += kpo[0][i].v != kpo[1][i].v || vpo[0][i].v != vpo[1][i].v;
            row_new += kpo[1][i].v != kp[i].v || vpo[1][i].v != vp[i].v;
        }
        // the token's own rows, every kv head's (an element counted once
        // for its k and v), unless padding
        const int want_new = slot < 0 ? 0 : c.HKV * c.D;
        if (diff || nan || pool_diff || row_new > want_new || (slot >= 0 && row_new == 0)) {
            printf("  position %d%s: %d output elements differ, %d NaN, %d pool elements differ, "
                   "%d changed (at most %d)\n",
                   p, slot < 0 ? " (padding)" : "", diff, nan, pool_diff, row_new, want_new);
            bad++;
        }
    }
    printf("%s prologue case %d: H %d, HKV %d, D %d, row %d%s, %d splits%s, window %d: the fused "
           "kernel against the prologue + attention kernels, bit for bit\n",
           bad ? "FAIL" : "ok", ci, c.H, c.HKV, c.D, c.N, c.norm ? ", q/k norms" : "", c.ns,
           c.merged ? " merged by the last block" : "", c.window);
    return bad == 0;
}

// An MLA case: each token its own sequence at its own position (tile
// and split edges), pages scattered, a padding token where there are more
// than two (zeros), or (chunk > 0) every token of sequence 0 at positions
// chunk, chunk + 1, ..., or (chunk < 0, two tokens) sequence 0 at 100 and
// sequence 1 at 5, whose first block is sequence 0's: then this step's
// cache rows are NaN until each block's wait, as if the kernel before
// wrote them then (emu_pdl_fn), so that a tile read before the wait that
// holds one fails the case. Every output NaN first; against a
// double-precision reference of the same bf16 values, errors relative to
// each head's largest magnitude.
static int run_mla_case(int ci, const mla_case &c)
{
    std::mt19937_64 g(0x31a0000u + (uint64_t)ci);
    auto uni = [&](float a) { return std::uniform_real_distribution<float>(-a, a)(g); };
    const int T = c.T;
    static const int EDGE[] = {300, 0, 31, 32, 95, 129};
    std::vector<int> chunk;
    for (int t = 0; c.chunk > 0 && t < T; t++)
        chunk.push_back(c.chunk + t);
    static const int ALIAS[] = {100, 5};
    emu_step st = c.chunk > 0   ? emu_tokens(g, T, c.bs, chunk.data(), T)
                  : c.chunk < 0 ? emu_tokens(g, T, c.bs, ALIAS, 2)
                                : emu_tokens(g, T, c.bs, EDGE, (int)(sizeof EDGE / sizeof EDGE[0]));
    for (int t = 0; c.chunk > 0 && t < T; t++)
        st.slots[t] = 0;
    if (c.chunk < 0) // sequence 1's first block is sequence 0's
        st.bt[(size_t)st.max_blocks] = st.bt[0];
    const std::vector<int> &pos = st.pos, &slots = st.slots, &bt = st.bt;
    const int max_blocks = st.max_blocks, pages = st.pages;
    const size_t rows = (size_t)pages * c.bs;
    std::vector<__nv_bfloat16> qc((size_t)T * c.H * c.R), qpe((size_t)T * c.H * c.DR),
        kv(rows * c.R), pe(rows * c.DR), out((size_t)T * c.H * c.R);
    fill_uni(qc, uni, 1.0f);
    fill_uni(qpe, uni, 1.0f);
    fill_uni(kv, uni, 1.0f);
    fill_uni(pe, uni, 1.0f);
    fill_nan(out);
    std::vector<float> part_ml((size_t)T * c.H * c.ns * 2), part_o((size_t)T * c.H * c.ns * c.R);
    std::vector<unsigned> cnt((size_t)T * c.H, 0u);
    mla_bufs b{qc.data(), qpe.data(), pos.data(), slots.data(), bt.data(), max_blocks, kv.data(),
               pe.data(), out.data(), 0.3f, c.window, c.ns > 1 ? part_ml.data() : nullptr,
               c.ns > 1 ? part_o.data() : nullptr, c.merged ? cnt.data() : nullptr};
    if (c.chunk != 0) { // this step's rows: NaN before each block's wait
        std::vector<__nv_bfloat16> kv0 = kv, pe0 = pe;
        auto step_rows = [&](bool written) {
            for (int t = 0; t < T; t++) {
                const size_t r = st.row(t, pos[t]);
                for (int d = 0; d < c.R; d++)
                    kv[r * c.R + d] = written ? kv0[r * c.R + d] : __nv_bfloat16{0x7fc0};
                for (int d = 0; d < c.DR; d++)
                    pe[r * c.DR + d] = written ? pe0[r * c.DR + d] : __nv_bfloat16{0x7fc0};
            }
        };
        emu_block_fn = [&] { step_rows(false); };
        emu_pdl_fn = [&] { step_rows(true); };
        c.run(b);
        emu_block_fn = nullptr;
        emu_pdl_fn = nullptr;
        step_rows(true);
    } else {
        c.run(b);
    }
    int bad = 0;
    for (unsigned k : cnt)
        bad += k != 0;
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < c.H; h++) {
            const __nv_bfloat16 *o = &out[((size_t)t * c.H + h) * c.R];
            if (slots[t] < 0) {
                bad += nonzero(o, c.R);
                continue;
            }
            const int p = pos[t], lo = st.first(t, c.window);
            auto row = [&](int pp) { return st.row(t, pp); };
            auto score = [&](int pp) {
                double s = 0;
                for (int d = 0; d < c.R; d++)
                    s += (double)ld(&qc[((size_t)t * c.H + h) * c.R + d]) * ld(&kv[row(pp) * c.R + d]);
                for (int d = 0; d < c.DR; d++)
                    s += (double)ld(&qpe[((size_t)t * c.H + h) * c.DR + d]) *
                         ld(&pe[row(pp) * c.DR + d]);
                return s * (double)0.3f;
            };
            auto value = [&](int pp, int d) { return (double)ld(&kv[row(pp) * c.R + d]); };
            worst = std::max(worst, head_error(o, c.R, lo, p, score, value));
        }
    const bool ok = worst <= TOL && bad == 0;
    printf("%s MLA case %d %s: T %d, %d splits%s, window %d, worst error %.2e%s\n",
           ok ? "ok" : "FAIL", ci, c.name, T, c.ns, c.merged ? " merged by the last block" : "",
           c.window, worst, bad ? ", a padding token's output or a split counter not zero" : "");
    return ok;
}

int main(int argc, char **argv)
{
    const int n_attn = (int)(sizeof CASES / sizeof CASES[0]);
    const int n_pro = n_attn + (int)(sizeof PRO_CASES / sizeof PRO_CASES[0]);
    const int n = n_pro + (int)(sizeof MLA_CASES / sizeof MLA_CASES[0]);
    std::vector<int> which;
    if (argc > 1) { // a comma-separated list of cases
        for (char *p = argv[1]; *p;) {
            which.push_back((int)strtol(p, &p, 10));
            if (*p == ',')
                p++;
        }
    } else {
        for (int i = 0; i < n; i++)
            which.push_back(i);
    }
    int passed = 0;
    for (int i : which)
        if (i >= 0 && i < n_attn)
            passed += run_case(i, CASES[i]);
        else if (i >= n_attn && i < n_pro)
            passed += run_pro_case(i, PRO_CASES[i - n_attn]);
        else if (i >= n_pro && i < n)
            passed += run_mla_case(i, MLA_CASES[i - n_pro]);
    printf("attn_emu: %d of %d cases passed\n", passed, (int)which.size());
    return passed == (int)which.size() ? 0 : 1;
}
