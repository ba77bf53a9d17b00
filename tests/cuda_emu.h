// cuda_emu.h — a CPU emulation of the CUDA the staged fp8 kernels use
// (codegen/fp8_tc.c) and the streaming expert GEMMs (codegen/moe_routed.c,
// GV_CONSTS), so that their generated source runs without a GPU
// (tests/test_fp8_emu.sh): a block (a cluster) at a time, every CUDA
// thread a fiber of the one host thread (or with EMU_THREADS=1 a host
// thread: see EMU_FIBERS); __syncthreads, a warp's m16n8k16 product
// and shuffle, and the cluster barrier barriers over the block, the warp
// and the cluster; shared memory one malloc a block of exactly the bytes
// the step asks for (filled with 0xff), so that an address sanitizer sees
// every access past it and a thread sanitizer every unordered pair of
// accesses; cp.async a copy checked for its 16-byte
// alignment, its bytes written only once a wait covers it (its group
// committed and waited for, or a wait for all), so that a read before that
// sees the launch's 0xff (and a bulk copy's once a wait sees its mbarrier's
// phase complete). The m16n8k16 product gathers the warp's fragments in the PTX
// ISA's layouts (A row-major 16 x 16, B column-major 16 x 8, C 16 x 8) and
// sums in double. The prologue's moec_silu_mul_frag, moec_e4m3x4_bf16,
// moec_x16, moec_tc_chunk, ldv (fp8 too), moec_prefetch_rows, warp_sum,
// moec_w16 and moec_silu_mul8 are the real ones (fp8_emu_gen copies them); what they call is emulated
// here (moec_e4m3x4 and moec_prefetch_l2 too). The GQA attention kernels
// (codegen/attention.c, tests/test_attn_emu.sh) add __syncwarp (the warp's
// barrier), float4, __threadfence and atomicAdd (the split counters) and
// grids in three dimensions (emu_launch_z); the MLA attention on tensor
// cores (codegen/mla_attention.c) ldmatrix, the warp's vote, cp.async
// groups, and sm_90's mbarriers and bulk copies (a copy's bytes counted
// on its barrier under a lock at once, landed when a wait sees its phase
// complete).
#pragma once
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <pthread.h>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>

#define __device__
#define __constant__
#define __forceinline__ inline
#define __global__
#define __restrict__
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __align__(n) __attribute__((aligned(n)))
// a block's static shared arrays (the few-token linear's): one copy, as
// emu_launch runs one block (cluster) at a time
#define __shared__ static

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct uint4 {
    unsigned x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
struct __half {
    uint16_t v;
};
struct __half2 {
    __half x, y;
};
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct __nv_bfloat16 {
    uint16_t v;
};
struct __nv_fp8_e4m3 {
    uint8_t v;
};

static inline float emu_bf2f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t emu_f2bf(float f) // round to nearest even
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float emu_h2f(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0 ? ldexpf((float)m, -24)
                    : e == 31 ? (m ? NAN : INFINITY)
                              : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}

static inline float2 __half22float2(__half2 h) { return {emu_h2f(h.x.v), emu_h2f(h.y.v)}; }

static inline __nv_bfloat16 __float2bfloat16(float f) { return {emu_f2bf(f)}; }
static inline float ld(const float *p) { return *p; }
static inline float ld(const __nv_bfloat16 *p) { return emu_bf2f(p->v); }
static inline float emu_e4m3(uint8_t c)
{
    const int e = (c >> 3) & 15, m = c & 7;
    const float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    return (c & 0x7f) == 0x7f ? NAN : c & 0x80 ? -v : v;
}
static inline float ld(const __nv_fp8_e4m3 *p) { return emu_e4m3(p->v); }
// the prologue's four codes of a word (its conversion intrinsics emulated)
static inline void moec_e4m3x4(unsigned c, float *v)
{
    for (int i = 0; i < 4; i++)
        v[i] = emu_e4m3((uint8_t)(c >> (8 * i)));
}
static inline void st(float *p, float v) { *p = v; }
static inline void st(__nv_bfloat16 *p, float v) { p->v = emu_f2bf(v); }

static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    uint8_t b[8];
    memcpy(b, &x, 4);
    memcpy(b + 4, &y, 4);
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        unsigned sel = (s >> (4 * i)) & 15;
        assert(sel < 8); // the sign-replicating selectors are not used
        r |= (unsigned)b[sel] << (8 * i);
    }
    return r;
}

// How the CUDA threads run. With EMU_THREADS=1 (a -D of the compile; the
// thread sanitizer's backend until 2026-12) each is a host thread and each
// barrier a pthread barrier, so that a thread sanitizer sees real threads
// and the order the barriers give them (EMU_FIBERS 0). Otherwise (EMU_FIBERS
// 1, the default under every sanitizer) the threads of a block (of a
// cluster) are
// fibers that the launching thread runs one at a time, each on its own
// stack until it waits: at a barrier its arrival is counted and it sleeps
// until the last one's arrival wakes the barrier's sleepers; in
// moec_mbar_wait it sleeps until the next change to an mbarrier. The
// fibers woken run next, before those that were ready, so that a warp
// runs on from one warp barrier to the next, the block's other warps
// waiting, until a block barrier stops it: between two block barriers a
// warp's work is done before the next warp's starts (the first warp to
// the last, in every other block or cluster run the last to the first;
// only the thread whose arrival ended the barrier runs first, to its next
// wait), so that where a block barrier is missing, a read that it should
// have ordered after another warp's write sees the old bytes in one order
// or the other (and a write it should have ordered after another warp's
// read clobbers them). A thread's own state (threadIdx, blockIdx, its
// block and cluster) lives in plain globals, swapped in and out at each
// switch; its cp.async copies in its fiber. A thread that sleeps when no
// fiber is ready (one returned while the others wait at a barrier: a
// deadlock on a GPU too) ends the run with what each one waits on.
// Under the thread sanitizer each fiber is one of its fibers
// (__tsan_create_fiber), switched to without ordering the two
// (__tsan_switch_to_fiber_no_sync), so that it sees the CUDA threads as
// apart as host threads: what orders them is what a barrier gives (each
// arrival a release, each departure an acquire of that barrier's phase),
// an mbarrier's lock, an atomic, and the launch (its start before every
// thread, every thread before its end); the emulator's own bookkeeping
// (the fibers' lists, the barriers' counts, the switch) is not
// instrumented.
#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_TSAN 1
#endif
#endif
#if defined(EMU_THREADS) && EMU_THREADS
#define EMU_FIBERS 0
#endif
#ifndef EMU_FIBERS
#define EMU_FIBERS 1
#endif
#if EMU_FIBERS && defined(EMU_TSAN)
#include <sanitizer/tsan_interface.h>
#define EMU_NO_TSAN __attribute__((no_sanitize_thread))
#else
#define EMU_NO_TSAN
#endif
#if EMU_FIBERS
#define EMU_TLS
#else
#define EMU_TLS thread_local
#endif

struct emu_block;
struct emu_cluster;
// a cp.async copy not yet landed (moec_cp16), and a thread's: those not
// committed, and its groups not yet waited for
struct emu_cp {
    unsigned char *s;
    unsigned char v[16];
};
struct emu_cps {
    std::vector<emu_cp> open;
    std::deque<std::vector<emu_cp>> groups;
};

inline dim3 blockDim, gridDim;
inline EMU_TLS dim3 threadIdx, blockIdx;
inline EMU_TLS emu_block *emu_this_block;
inline EMU_TLS emu_cluster *emu_this_cluster;
#if !EMU_FIBERS
inline thread_local emu_cps emu_cp_thread;
static inline emu_cps &emu_cp_this() { return emu_cp_thread; }
#endif

#if EMU_FIBERS
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
// the address sanitizer told which stack runs (its checks of stack
// accesses, its reports' traces)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
// The switch: on x86-64 emu_ctx_swap, elsewhere (or with EMU_UCONTEXT)
// swapcontext, a system call a switch for the signal mask (the attention's
// cases without a sanitizer: 4.7 s, not 1.1) and under the address
// sanitizer far slower (136 s, not 3: its swapcontext clears the shadow of
// the whole stack switched to, and it warns that it may report falsely).
#if !defined(__x86_64__) || defined(EMU_UCONTEXT)
#define EMU_UCONTEXT 1
#include <ucontext.h>
#endif

// A fiber: its stack, where it stopped, its CUDA thread's state while
// another runs, and its cp.async copies. The launching thread is one too
// (emu_fib.host).
struct emu_fiber {
#ifdef EMU_UCONTEXT
    ucontext_t uc;
#else
    void *sp; // the stack pointer it stopped at (emu_ctx_swap's frame)
#endif
    dim3 tid, bid;
    emu_block *block;
    emu_cluster *cluster;
    emu_fiber *next; // in the list it is on: the ready ones, or a wait's sleepers
    const void *bottom; // its stack, for the address sanitizer
    size_t size;
    void *fake; // the sanitizer's fake stack (stack-use-after-return)
    const char *waits; // what it sleeps on (a deadlock's report)
    bool done; // its kernel returned
    emu_cps cp;
    void *tsan; // the thread sanitizer's fiber
};
// a list of fibers, in order
struct emu_fibers {
    emu_fiber *head, *tail;
    EMU_NO_TSAN void push_back(emu_fiber *f)
    {
        f->next = nullptr;
        (head ? tail->next : head) = f;
        tail = f;
    }
    EMU_NO_TSAN emu_fiber *pop_front()
    {
        emu_fiber *f = head;
        if (f && !(head = f->next))
            tail = nullptr;
        return f;
    }
    EMU_NO_TSAN void wake(emu_fibers &ready) // all of these ready, in front of those that were
    {
        if (!head)
            return;
        tail->next = ready.head;
        if (!ready.head)
            ready.tail = tail;
        ready.head = head;
        head = tail = nullptr;
    }
};
struct emu_sched {
    emu_fiber host;
    emu_fiber *cur, *from; // the one running, the one that switched to it
    emu_fibers ready; // the fibers that may run, the next first
    emu_fibers mbar; // those asleep in moec_mbar_wait
    emu_fiber *all; // the run's fibers
    size_t n, live; // how many, and those not returned
    unsigned long runs; // the runs (blocks, clusters) so far
    const std::function<void()> *fn;
    char run_start, run_end; // the thread sanitizer's: a run's start and end
};
inline emu_sched emu_fib;
static inline emu_cps &emu_cp_this() { return emu_fib.cur->cp; }

#ifndef EMU_UCONTEXT
// x86-64's switch: the callee-saved registers, MXCSR and the x87 control
// word pushed on this stack, its pointer stored in *from, then the same
// popped from `to` and a return there. A new fiber's stack holds zeros,
// default control words and emu_fiber_entry as the address to return to.
extern "C" void emu_ctx_swap(void **from, void *to);
__asm__(".pushsection .text\n"
        ".weak emu_ctx_swap\n"
        ".hidden emu_ctx_swap\n"
        ".type emu_ctx_swap, @function\n"
        "emu_ctx_swap:\n"
        "pushq %rbp\n"
        "pushq %rbx\n"
        "pushq %r12\n"
        "pushq %r13\n"
        "pushq %r14\n"
        "pushq %r15\n"
        "subq $8, %rsp\n"
        "stmxcsr (%rsp)\n"
        "fnstcw 4(%rsp)\n"
        "movq %rsp, (%rdi)\n"
        "movq %rsi, %rsp\n"
        "ldmxcsr (%rsp)\n"
        "fldcw 4(%rsp)\n"
        "addq $8, %rsp\n"
        "popq %r15\n"
        "popq %r14\n"
        "popq %r13\n"
        "popq %r12\n"
        "popq %rbx\n"
        "popq %rbp\n"
        "ret\n"
        ".size emu_ctx_swap, .-emu_ctx_swap\n"
        ".popsection\n");
#endif

// Back on a fiber's stack: the sanitizer told so (and where the one it
// came from runs: the launching thread's stack, learnt so).
static inline void emu_fiber_landed()
{
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(emu_fib.cur->fake, &emu_fib.from->bottom,
                                    &emu_fib.from->size);
#endif
}

// From one fiber to another (from->done: its fake stack goes). Not
// instrumented: no frame of the sanitizer's to set up and clear, and none
// left on a returned fiber's stack.
__attribute__((noinline, no_sanitize_address)) EMU_NO_TSAN static void
emu_fiber_switch(emu_fiber *from, emu_fiber *to)
{
    from->tid = threadIdx;
    from->bid = blockIdx;
    from->block = emu_this_block;
    from->cluster = emu_this_cluster;
    threadIdx = to->tid;
    blockIdx = to->bid;
    emu_this_block = to->block;
    emu_this_cluster = to->cluster;
    emu_fib.from = from;
    emu_fib.cur = to;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(from->done ? nullptr : &from->fake, to->bottom, to->size);
#endif
#if EMU_FIBERS && defined(EMU_TSAN)
    __tsan_switch_to_fiber(to->tsan, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef EMU_UCONTEXT
    swapcontext(&from->uc, &to->uc);
#else
    emu_ctx_swap(&from->sp, to->sp);
#endif
    emu_fiber_landed();
}

[[noreturn]] EMU_NO_TSAN static void emu_fiber_deadlock()
{
    emu_fib.cur->tid = threadIdx;
    emu_fib.cur->bid = blockIdx;
    fprintf(stderr,
            "cuda_emu: deadlock: the %zu threads left of the block (the cluster) of block"
            " (%u, %u, %u) all wait, and none can move on:\n",
            emu_fib.live, blockIdx.x, blockIdx.y, blockIdx.z);
    size_t k = 0;
    for (size_t i = 0; i < emu_fib.n; i++) {
        const emu_fiber &f = emu_fib.all[i];
        if (!f.done && k++ < 16)
            fprintf(stderr, "  thread %u of block (%u, %u, %u) at %s\n", f.tid.x, f.bid.x,
                    f.bid.y, f.bid.z, f.waits);
    }
    if (k > 16)
        fprintf(stderr, "  (and %zu more)\n", k - 16);
    abort();
}

// The running fiber, asleep (on a list of sleepers, or returned): on to
// the next ready one, or with none left the launching thread.
__attribute__((noinline)) EMU_NO_TSAN static void emu_fiber_sleep(const char *what)
{
    emu_fiber *f = emu_fib.cur, *to = emu_fib.ready.pop_front();
    f->waits = what;
    if (!to && emu_fib.live)
        emu_fiber_deadlock();
    emu_fiber_switch(f, to ? to : &emu_fib.host);
}

// Where a fiber starts: its thread's kernel, then on to the next one.
EMU_NO_TSAN static void emu_fiber_entry()
{
    emu_fiber_landed();
#if defined(EMU_TSAN)
    __tsan_acquire(&emu_fib.run_start);
#endif
    (*emu_fib.fn)();
#if defined(EMU_TSAN)
    __tsan_release(&emu_fib.run_end);
#endif
    emu_fib.cur->done = true;
    emu_fib.live--;
    emu_fiber_sleep("(returned)");
    abort(); // never switched back to
}

// The fibers' stacks: one mapping, pages taken as touched, a page below
// each that no access may reach (a stack overflow faults); kept from
// launch to launch, as many as the largest block (cluster) so far.
struct emu_stacks {
    static constexpr size_t bytes = 512 << 10;
    unsigned char *base = nullptr;
    size_t n = 0, each = 0;
    void reserve(size_t m)
    {
        if (m <= n)
            return;
        if (base)
            munmap(base, n * each);
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        each = bytes + page;
        void *p = mmap(nullptr, m * each, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (p == MAP_FAILED) {
            perror("cuda_emu: mmap of the fibers' stacks");
            abort();
        }
        base = (unsigned char *)p;
        n = m;
        for (size_t i = 0; i < n; i++)
            if (mprotect(base + i * each, page, PROT_NONE)) {
                perror("cuda_emu: mprotect of a stack's guard page");
                abort();
            }
    }
    ~emu_stacks()
    {
        if (base)
            munmap(base, n * each);
    }
    unsigned char *stack(size_t i) const { return base + (i + 1) * each - bytes; }
};
inline emu_stacks emu_fib_stacks;
#if defined(EMU_TSAN)
// ... and the thread sanitizer's fibers, one a stack: kept as the stacks
// are (creating and destroying one a CUDA thread a run took most of the
// run's time in the kernel); a run's start and end order a kept fiber's
// uses anyway
inline std::vector<void *> emu_tsan_fibers;
#endif

// Runs fn on n fibers, fiber i's thread state set by set(i, fiber), until
// every one returned: ready first to last, every other run last to first.
template <typename S>
EMU_NO_TSAN static inline void emu_fibers_run(size_t n, const std::function<void()> &fn, S set)
{
    emu_stacks &st = emu_fib_stacks;
    st.reserve(n);
    std::vector<emu_fiber> fibers(n);
    emu_fib.ready = emu_fibers{};
    emu_fib.mbar = emu_fibers{};
    for (size_t i = 0; i < n; i++) {
        emu_fiber &f = fibers[i];
        set(i, f);
        unsigned char *s = st.stack(i);
        f.bottom = s;
        f.size = emu_stacks::bytes;
        f.fake = nullptr;
        f.done = false;
#if defined(EMU_TSAN)
        while (emu_tsan_fibers.size() <= i)
            emu_tsan_fibers.push_back(__tsan_create_fiber(0));
        f.tsan = emu_tsan_fibers[i];
#endif
#ifdef EMU_UCONTEXT
        getcontext(&f.uc);
        f.uc.uc_stack.ss_sp = s;
        f.uc.uc_stack.ss_size = emu_stacks::bytes;
        f.uc.uc_link = nullptr;
        makecontext(&f.uc, emu_fiber_entry, 0);
#else
        void **sp = (void **)(s + emu_stacks::bytes);
        *--sp = nullptr; // emu_fiber_entry's return address: it never returns
        *--sp = (void *)emu_fiber_entry;
        for (int r = 0; r < 6; r++)
            *--sp = nullptr; // rbp (the end of the frame chain) and the others
        *--sp = (void *)(0x1f80ull | 0x37full << 32); // MXCSR, x87 control word
        f.sp = sp;
#endif
    }
    const bool rev = emu_fib.runs++ % 2;
    for (size_t i = 0; i < n; i++)
        emu_fib.ready.push_back(&fibers[rev ? n - 1 - i : i]);
    emu_fib.fn = &fn;
    emu_fib.all = fibers.data();
    emu_fib.n = emu_fib.live = n;
    emu_fib.cur = &emu_fib.host;
#if defined(EMU_TSAN)
    emu_fib.host.tsan = __tsan_get_current_fiber();
    __tsan_release(&emu_fib.run_start);
#endif
    emu_fiber_sleep("(the launch)");
#if defined(EMU_TSAN)
    __tsan_acquire(&emu_fib.run_end);
#endif
#if defined(EMU_ASAN) && !defined(EMU_UCONTEXT)
    // the frames a fiber returned from its stack with (the last switch's)
    // never returned: their redzones' marks go, before the stack's next
    // fiber's frames lie there
    for (size_t i = 0; i < n; i++) {
        unsigned char *sp = (unsigned char *)fibers[i].sp;
        __asan_unpoison_memory_region(sp, st.stack(i) + emu_stacks::bytes - sp);
    }
#endif
}
#endif

// A barrier of count threads (a block's, a warp's, a cluster's); what: the
// wait's name in a deadlock's report.
struct emu_barrier {
#if EMU_FIBERS
    unsigned count, arrived;
    emu_fibers asleep;
    unsigned phase; // phases completed (the thread sanitizer's)
    char sync[2];   // the thread sanitizer's: a phase's arrivals, by its parity
#else
    pthread_barrier_t b;
#endif
};
static inline void emu_barrier_init(emu_barrier *b, unsigned count)
{
#if EMU_FIBERS
    *b = emu_barrier{count, 0, {}, 0, {0, 0}};
#else
    pthread_barrier_init(&b->b, nullptr, count);
#endif
}
static inline void emu_barrier_destroy(emu_barrier *b)
{
#if EMU_FIBERS
    assert(b->arrived == 0 && !b->asleep.head);
#else
    pthread_barrier_destroy(&b->b);
#endif
}
// Under the thread sanitizer an arrival releases the phase's cell and a
// departure acquires it: a phase's departures are ordered after all its
// arrivals, and (two cells) never after the next phase's.
EMU_NO_TSAN static inline void emu_barrier_wait(emu_barrier *b, const char *what)
{
#if EMU_FIBERS
#if defined(EMU_TSAN)
    char *cell = &b->sync[b->phase & 1];
    __tsan_release(cell);
#endif
    if (++b->arrived == b->count) {
        b->arrived = 0;
        b->phase++;
        b->asleep.wake(emu_fib.ready);
    } else {
        b->asleep.push_back(emu_fib.cur);
        emu_fiber_sleep(what);
    }
#if defined(EMU_TSAN)
    __tsan_acquire(cell);
#endif
#else
    (void)what;
    pthread_barrier_wait(&b->b);
#endif
}
// a change to an mbarrier: what moec_mbar_wait's sleepers wait for
EMU_NO_TSAN static inline void emu_mbar_changed()
{
#if EMU_FIBERS
    emu_fib.mbar.wake(emu_fib.ready);
#endif
}
// moec_mbar_wait's wait for a change
EMU_NO_TSAN static inline void emu_mbar_sleep()
{
#if EMU_FIBERS
    emu_fib.mbar.push_back(emu_fib.cur);
    emu_fiber_sleep("moec_mbar_wait");
#else
    std::this_thread::yield();
#endif
}

struct emu_warp {
    emu_barrier bar;
    unsigned a[32][4], b[32][2];
    float f[32];
    const void *p[32];
    int v[32];
};
// a bulk copy not yet landed (moec_bulk_g2s; moec_mbar_wait lands it)
struct emu_bulk {
    const void *bar;
    uint8_t phase; // the barrier's phase the copy completes
    unsigned char *dst;
    std::vector<unsigned char> v;
};
struct emu_block {
    unsigned char *smem;
    size_t smem_bytes;
    emu_barrier bar;
    std::vector<emu_warp> warps;
    std::vector<emu_bulk> bulk; // its bulk copies not yet landed (none lands after the launch)
};
struct emu_cluster {
    std::vector<emu_block *> blocks;
    emu_barrier bar;
};

static inline unsigned char *emu_smem() { return emu_this_block->smem; }
static inline void __syncthreads() { emu_barrier_wait(&emu_this_block->bar, "__syncthreads"); }
// The wait of programmatic launch, in the harness's hands where it sets
// emu_pdl_fn: a block barrier, after which one thread runs it (the writes
// of the kernel before this one landing, at the earliest moment a thread
// of the block may read them), then the barrier again; emu_launch runs
// emu_block_fn before each block (to take them back, so that every block
// reads before its wait what the kernel before it had not written yet).
// Every thread of a kernel run so calls moec_pdl_enter.
inline std::function<void()> emu_pdl_fn, emu_block_fn;
static inline void moec_pdl_enter()
{
    if (!emu_pdl_fn)
        return;
    emu_barrier_wait(&emu_this_block->bar, "moec_pdl_enter's barrier");
    if (threadIdx.x == 0)
        emu_pdl_fn();
    emu_barrier_wait(&emu_this_block->bar, "moec_pdl_enter's barrier");
}
/* the range a kernel prefetches lies in what it may read: the harness's
   allocations are checked by the address sanitizer on the first and last
   byte. Under the thread sanitizer nothing is read: a prefetch returns no
   data, so no write to those bytes (a fused prologue's cache row) is
   unordered with it */
static inline void moec_prefetch_l2(const void *p, unsigned long long bytes)
{
#if defined(__SANITIZE_THREAD__)
    (void)p;
    (void)bytes;
#else
    if (bytes) {
        volatile const unsigned char *b = (const unsigned char *)p;
        (void)b[0];
        (void)b[bytes - 1];
    }
#endif
}

// cp.async: a copy reads its 16 bytes when issued and writes them to
// shared memory only once a wait covers it, as a GPU may: moec_cp_commit
// closes this thread's open copies into a group, moec_cp_wait_group<N>
// lands all but the N newest groups, moec_cp_wait (wait_all) every copy,
// committed or not. A copy no wait covers never lands: the bytes stay as
// they were (0xff from the launch), so a read of them fails the case.
static inline void emu_cp_land(std::vector<emu_cp> &g)
{
    for (const emu_cp &c : g)
        memcpy(c.s, c.v, 16);
    g.clear();
}

static inline void moec_cp16(void *s, const void *g, bool valid)
{
    unsigned char *p = (unsigned char *)s, *base = emu_this_block->smem;
    assert(p >= base && p + 16 <= base + emu_this_block->smem_bytes && (p - base) % 16 == 0);
    assert((uintptr_t)g % 16 == 0);
    emu_cp c;
    c.s = p;
    if (valid)
        memcpy(c.v, g, 16);
    else
        memset(c.v, 0, 16);
    emu_cp_this().open.push_back(c);
}

static inline void moec_cp_commit()
{
    emu_cps &t = emu_cp_this();
    t.groups.push_back(std::move(t.open));
    t.open.clear();
}
template <int N> static inline void moec_cp_wait_group()
{
    std::deque<std::vector<emu_cp>> &g = emu_cp_this().groups;
    while (g.size() > (size_t)N) {
        emu_cp_land(g.front());
        g.pop_front();
    }
}
// cp.async.wait_all: a commit, then a wait for every group (the PTX ISA)
static inline void moec_cp_wait()
{
    moec_cp_commit();
    moec_cp_wait_group<0>();
}

template <typename T> static inline T __ldcg(const T *p) { return *p; } // ld.global.cg

static inline uint4 moec_ldg16(const void *p)
{
    assert((uintptr_t)p % 16 == 0);
    uint4 v;
    memcpy(&v, p, 16);
    return v;
}

static inline unsigned moec_bf16x2_exp120(unsigned v) // fma.rn.bf16x2 v, 2^120, -0
{
    const float k = ldexpf(1.0f, 120);
    return emu_f2bf(emu_bf2f(v & 0xffffu) * k) | (unsigned)emu_f2bf(emu_bf2f(v >> 16) * k) << 16;
}

// two floats as a bf16 pair (round to nearest even), a in the low half
static inline unsigned moec_pack_bf16(float a, float b)
{
    return emu_f2bf(a) | (unsigned)emu_f2bf(b) << 16;
}

static inline void moec_mma_bf16(float *c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                 unsigned b0, unsigned b1)
{
    emu_warp *w = &emu_this_block->warps[threadIdx.x / 32];
    const int lane = threadIdx.x % 32, g = lane >> 2, q = lane & 3;
    const unsigned a[4] = {a0, a1, a2, a3};
    memcpy(w->a[lane], a, sizeof a);
    w->b[lane][0] = b0;
    w->b[lane][1] = b1;
    emu_barrier_wait(&w->bar, "moec_mma_bf16");
    // A[r][k]: lane (r % 8, k % 8 / 2), register (r >= 8) + 2 (k >= 8), half k % 2
    auto A = [&](int r, int k) {
        unsigned v = w->a[(r & 7) * 4 + ((k & 7) >> 1)][(r >= 8) + 2 * (k >= 8)];
        return emu_bf2f((k & 1) ? v >> 16 : v & 0xffffu);
    };
    // B[k][n]: lane (n, k % 8 / 2), register k >= 8, half k % 2
    auto B = [&](int k, int n) {
        unsigned v = w->b[n * 4 + ((k & 7) >> 1)][k >= 8];
        return emu_bf2f((k & 1) ? v >> 16 : v & 0xffffu);
    };
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
        double s = 0;
        for (int k = 0; k < 16; k++)
            s += (double)A(row, k) * B(k, col);
        c[i] += (float)s;
    }
    emu_barrier_wait(&w->bar, "moec_mma_bf16");
}

// A warp's butterfly exchange: every lane of the warp takes part.
static inline float __shfl_xor_sync(unsigned, float v, int o)
{
    emu_warp *w = &emu_this_block->warps[threadIdx.x / 32];
    const int lane = threadIdx.x % 32;
    w->f[lane] = v;
    emu_barrier_wait(&w->bar, "__shfl_xor_sync");
    const float r = w->f[lane ^ o];
    emu_barrier_wait(&w->bar, "__shfl_xor_sync");
    return r;
}

// ... of an int (its bits through the float exchange)
static inline int __shfl_xor_sync(unsigned m, int v, int o)
{
    float f;
    memcpy(&f, &v, 4);
    f = __shfl_xor_sync(m, f, o);
    int r;
    memcpy(&r, &f, 4);
    return r;
}

// The special function unit's 2^x (moec_ex2), as the library computes it.
static inline float moec_ex2(float x) { return exp2f(x); }

// A warp's vote: every lane of the warp takes part.
static inline bool __any_sync(unsigned, bool pred)
{
    emu_warp *w = &emu_this_block->warps[threadIdx.x / 32];
    const int lane = threadIdx.x % 32;
    w->v[lane] = pred;
    emu_barrier_wait(&w->bar, "__any_sync");
    bool any = false;
    for (int i = 0; i < 32; i++)
        any = any || w->v[i];
    emu_barrier_wait(&w->bar, "__any_sync");
    return any;
}

static inline float __bfloat162float(__nv_bfloat16 h) { return emu_bf2f(h.v); }
static inline float __int_as_float(int i)
{
    float f;
    memcpy(&f, &i, 4);
    return f;
}

// ldmatrix: N (2 or 4) 8x8 bf16 matrices of shared memory, lanes 8m ..
// 8m + 7 giving the 16-byte rows of matrix m; lane L's register m holds
// matrix m's row L / 4, columns 2 (L % 4) and 2 (L % 4) + 1 (T: of its
// transpose), the first in the low half.
template <int N, bool T> static inline void moec_ldmatrix(unsigned *r, const __nv_bfloat16 *p)
{
    static_assert(N == 2 || N == 4, "two or four matrices");
    emu_warp *w = &emu_this_block->warps[threadIdx.x / 32];
    const int lane = threadIdx.x % 32;
    const unsigned char *base = emu_this_block->smem;
    w->p[lane] = p;
    emu_barrier_wait(&w->bar, "moec_ldmatrix");
    auto el = [&](int m, int row, int col) {
        const unsigned char *q = (const unsigned char *)w->p[8 * m + row];
        assert(q >= base && q + 16 <= base + emu_this_block->smem_bytes && (q - base) % 16 == 0);
        uint16_t v;
        memcpy(&v, q + 2 * col, 2);
        return (unsigned)v;
    };
    for (int m = 0; m < N; m++) {
        const int a = lane / 4, b = 2 * (lane % 4);
        r[m] = T ? el(m, b, a) | el(m, b + 1, a) << 16 : el(m, a, b) | el(m, a, b + 1) << 16;
    }
    emu_barrier_wait(&w->bar, "moec_ldmatrix");
}

// A shared-window address (moec_ldmatrix_s's): the offset into the block's
// shared memory.
static inline unsigned moec_smem_addr(const void *p)
{
    return (unsigned)((const unsigned char *)p - emu_this_block->smem);
}

template <int N, bool T> static inline void moec_ldmatrix_s(unsigned *r, unsigned a)
{
    moec_ldmatrix<N, T>(r, (const __nv_bfloat16 *)(emu_this_block->smem + a));
}

// sm_90's mbarriers and bulk copies (the MLA attention's tiles): an
// mbarrier's 8 bytes hold the arrivals a phase expects, those arrived,
// the phase (counted) and the bytes announced and not yet copied, under
// one lock; a bulk copy reads its source when issued and counts its bytes
// done at once, and its bytes land in shared memory when a wait first sees
// its phase complete, as a GPU may: a kernel that reads them before such a
// wait reads what was there before. A phase completes once every arrival
// came and every announced byte arrived.
struct emu_mbar {
    uint8_t expect, arrived, phase, pad;
    int32_t pending;
};
static_assert(sizeof(emu_mbar) == 8, "an mbarrier's 8 bytes");
inline pthread_mutex_t emu_mbar_lock = PTHREAD_MUTEX_INITIALIZER;
static inline emu_mbar *emu_mbar_of(const void *bar)
{
    const unsigned char *q = (const unsigned char *)bar, *base = emu_this_block->smem;
    assert(q >= base && q + 8 <= base + emu_this_block->smem_bytes && (q - base) % 8 == 0);
    return (emu_mbar *)bar;
}
static inline void emu_mbar_complete(emu_mbar *m)
{
    if (m->arrived == m->expect && m->pending == 0) {
        m->arrived = 0;
        m->phase++;
    }
}
static inline void moec_mbar_init(unsigned long long *bar, unsigned count)
{
    assert(count >= 1 && count < 256);
    emu_mbar *m = emu_mbar_of(bar);
    pthread_mutex_lock(&emu_mbar_lock);
    *m = emu_mbar{(uint8_t)count, 0, 0, 0, 0};
    emu_mbar_changed();
    pthread_mutex_unlock(&emu_mbar_lock);
}
static inline void moec_mbar_init_fence() {}
static inline void moec_fence_async() {}
static inline void emu_mbar_arrive(unsigned long long *bar, int bytes)
{
    emu_mbar *m = emu_mbar_of(bar);
    pthread_mutex_lock(&emu_mbar_lock);
    assert(m->arrived < m->expect);
    m->arrived++;
    m->pending += bytes;
    emu_mbar_complete(m);
    emu_mbar_changed();
    pthread_mutex_unlock(&emu_mbar_lock);
}
static inline void moec_mbar_arrive_tx(unsigned long long *bar, unsigned bytes)
{
    emu_mbar_arrive(bar, bytes);
}
static inline void moec_mbar_arrive(unsigned long long *bar) { emu_mbar_arrive(bar, 0); }
static inline void moec_bulk_g2s(void *dst, const void *src, unsigned bytes, unsigned long long *bar)
{
    const unsigned char *q = (const unsigned char *)dst, *base = emu_this_block->smem;
    assert(q >= base && q + bytes <= base + emu_this_block->smem_bytes && (q - base) % 16 == 0);
    assert((uintptr_t)src % 16 == 0 && bytes % 16 == 0);
    emu_mbar *m = emu_mbar_of(bar);
    const unsigned char *sv = (const unsigned char *)src;
    pthread_mutex_lock(&emu_mbar_lock);
    emu_this_block->bulk.push_back(
        emu_bulk{bar, m->phase, (unsigned char *)dst, std::vector<unsigned char>(sv, sv + bytes)});
    m->pending -= (int32_t)bytes;
    assert(m->pending >= 0);
    emu_mbar_complete(m);
    emu_mbar_changed();
    pthread_mutex_unlock(&emu_mbar_lock);
}
// until the phase of parity `parity` completed (the barrier's phase moved
// past it)
static inline void moec_mbar_wait(unsigned long long *bar, unsigned parity)
{
    emu_mbar *m = emu_mbar_of(bar);
    for (;;) {
        pthread_mutex_lock(&emu_mbar_lock);
        const bool done = (m->phase & 1u) != (parity & 1u);
        if (done) { // the copies of this barrier's completed phases land
            std::vector<emu_bulk> &b = emu_this_block->bulk;
            size_t k = 0;
            for (size_t i = 0; i < b.size(); i++) {
                if (b[i].bar == bar && b[i].phase != m->phase)
                    memcpy(b[i].dst, b[i].v.data(), b[i].v.size());
                else if (k++ != i)
                    b[k - 1] = std::move(b[i]);
            }
            b.resize(k);
        }
        pthread_mutex_unlock(&emu_mbar_lock);
        if (done)
            return;
        emu_mbar_sleep();
    }
}

// blocks run one at a time: a fence orders nothing more, and only a
// block's thread 0 counts its arrival
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline unsigned atomicAdd(unsigned *p, unsigned v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

static inline void __syncwarp()
{
    emu_barrier_wait(&emu_this_block->warps[threadIdx.x / 32].bar, "__syncwarp");
}

static inline void moec_cluster_sync()
{
    emu_barrier_wait(&emu_this_cluster->bar, "moec_cluster_sync");
}

static inline float moec_ld_cluster(const float *p, unsigned rank)
{
    const size_t off = (const unsigned char *)p - emu_this_block->smem;
    assert(off + 4 <= emu_this_block->smem_bytes && rank < emu_this_cluster->blocks.size());
    float v;
    memcpy(&v, emu_this_cluster->blocks[rank]->smem + off, 4);
    return v;
}

// Runs fn (the kernel's call) over a grid of gx x gy blocks of `block`
// threads and `smem` bytes of shared memory, clusters of s blocks along x
// one at a time (blockIdx.z = z: emu_launch_z's layer of its grid).
static inline void emu_launch(unsigned gx, unsigned gy, unsigned block, unsigned smem, unsigned s,
                              const std::function<void()> &fn, unsigned z = 0)
{
    assert(s >= 1 && gx % s == 0 && block % 32 == 0);
    blockDim.x = block;
    gridDim.x = gx;
    gridDim.y = gy;
    for (unsigned y = 0; y < gy; y++)
        for (unsigned x0 = 0; x0 < gx; x0 += s) {
            emu_cluster cl;
            std::vector<emu_block> blocks(s);
            emu_barrier_init(&cl.bar, s * block);
            for (unsigned r = 0; r < s; r++) {
                emu_block &b = blocks[r];
                b.smem_bytes = smem;
                b.smem = (unsigned char *)malloc(smem ? smem : 1);
                memset(b.smem, 0xff, smem);
                emu_barrier_init(&b.bar, block);
                b.warps = std::vector<emu_warp>(block / 32);
                for (emu_warp &w : b.warps)
                    emu_barrier_init(&w.bar, 32);
                cl.blocks.push_back(&b);
            }
            if (emu_block_fn)
                emu_block_fn();
#if EMU_FIBERS
            emu_fibers_run((size_t)s * block, fn, [&](size_t i, emu_fiber &f) {
                const unsigned r = (unsigned)(i / block);
                f.tid = dim3{(unsigned)(i % block), 0, 0};
                f.bid = dim3{x0 + r, y, z};
                f.block = &blocks[r];
                f.cluster = &cl;
            });
#else
            std::vector<std::thread> threads;
            for (unsigned r = 0; r < s; r++)
                for (unsigned t = 0; t < block; t++)
                    threads.emplace_back([&, r, t] {
                        threadIdx = dim3{t, 0, 0};
                        blockIdx = dim3{x0 + r, y, z};
                        emu_this_block = &blocks[r];
                        emu_this_cluster = &cl;
                        fn();
                    });
            for (std::thread &t : threads)
                t.join();
#endif
            for (emu_block &b : blocks) {
                free(b.smem);
                emu_barrier_destroy(&b.bar);
                for (emu_warp &w : b.warps)
                    emu_barrier_destroy(&w.bar);
            }
            emu_barrier_destroy(&cl.bar);
        }
}

// emu_launch over a grid of gx x gy x gz blocks (smem bytes of dynamic
// shared memory, default none: the kernel's static arrays; no clusters),
// z slowest.
static inline void emu_launch_z(unsigned gx, unsigned gy, unsigned gz, unsigned block,
                                const std::function<void()> &fn, unsigned smem = 0)
{
    gridDim.z = gz;
    for (unsigned z = 0; z < gz; z++)
        emu_launch(gx, gy, block, smem, 1, fn, z);
    gridDim.z = 1;
}
