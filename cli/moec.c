/* moec.c — the moec command line: compile, dump-ir, run, bench, tokenize and chat-template over the
 * public API (include/moec.h). Usage errors exit 2, library errors exit 1
 * with the library's message. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "file.h"
#include "moec.h"
#include "samples/serve.h"
#include "timer.h"

static const char *USAGE_MAIN =
    "usage: moec <command> [options]\n"
    "\n"
    "moec compiles Mixture-of-Experts models (DeepSeek-V2/V3, Qwen2-MoE, Qwen3-MoE,\n"
    "as published: config.json + *.safetensors) and runs them.\n"
    "\n"
    "commands:\n"
    "  compile MODEL_DIR     compile for the GPU ahead of time into a plan file\n"
    "  dump-ir MODEL_DIR     print the model's IR (see docs/IR.md)\n"
    "  run MODEL_DIR|PLAN    greedy generation from token ids or a text prompt\n"
    "  bench MODEL_DIR|PLAN  decode step time against its memory floor (needs a GPU)\n"
    "  serve MODEL_DIR|PLAN  the generation service over stdin or TCP (`moec serve --help`)\n"
    "  tokenize MODEL_DIR    text on stdin to token ids with the model's tokenizer.json,\n"
    "                        or ids to text (--decode)\n"
    "  chat-template MODEL_DIR  a conversation (JSON on stdin) through the model's chat\n"
    "                        template, as transformers' apply_chat_template renders it\n"
    "\n"
    "options:\n"
    "  -h, --help            this help; `moec <command> --help` for a command's options\n"
    "\n"
    "moec-serve (a separate program, linked against the runtime library alone)\n"
    "serves plan files the same way.\n";

static const char *USAGE_DUMP =
    "usage: moec dump-ir MODEL_DIR [--after PASS | --after all -o DIR] [options]\n"
    "\n"
    "Reads MODEL_DIR/config.json, lowers it to the unfused IR, verifies it and\n"
    "prints it: one value or op per line, each with its dtype and shape\n"
    "(docs/IR.md). Weights are not read.\n"
    "\n"
    "options:\n"
    "  --after PASS        print the module after pass PASS of the pipeline\n"
    "                      (the verifier runs after every pass; a failing pass\n"
    "                      leaves its input IR in $TMPDIR/moec-repro-PASS.mir)\n"
    "  --after all         write DIR/00_frontend.mir and one DIR/NN_PASS.mir\n"
    "                      after every pass (needs -o DIR)\n"
    "  --dtype D           compute dtype the passes compile for: bf16 (default),\n"
    "                      fp16 or fp32 (fold_routed_scale differs in fp16)\n"
    "  -o, --output PATH   write to the file PATH (a folder with --after all)\n"
    "  --summary           print a summary (layers, ops by kind, weight bytes)\n"
    "                      instead of the IR\n"
    "  --tp N              the module of one rank of N (docs/PARALLEL.md): after\n"
    "                      pass shard unless --after says another\n"
    "  --ep M              with --tp: the routed experts in M groups of ranks\n"
    "                      (M divides N; default 1)\n"
    "  --rank R            with --tp: which rank's module, 0 .. N-1 (default 0)\n"
    "  --ep-combine HOW    with --tp: the MoE block's partial sums meet in one\n"
    "                      all-reduce (default) or reduce-scatter: a reduce_scatter\n"
    "                      over the hidden axis then an all_gather\n"
    "  -h, --help          this help\n";

static void print_passes(FILE *out)
{
    fprintf(out, "\npasses, in order:\n");
    for (int i = 0; i < moec_pass_count(); i++)
        fprintf(out, "  %-20s %s\n", moec_pass_name(i), moec_pass_description(i));
}

static const char *USAGE_COMPILE =
    "usage: moec compile MODEL_DIR -o PLAN [options]\n"
    "\n"
    "Compiles the model for the GPU ahead of time: runs every pass, generates the\n"
    "CUDA kernels of each batch bucket and compiles them with NVRTC (no GPU is\n"
    "needed; kernels are cached in $MOEC_CACHE_DIR, else ~/.cache/moec/cubin), and\n"
    "writes PLAN: the fused IR, the kernels, the launch tables, the memory plan,\n"
    "and hashes of MODEL_DIR's config.json and of every checkpoint tensor's name,\n"
    "dtype and shape. A plan runs only against that checkpoint:\n"
    "`moec run PLAN --weights MODEL_DIR ...`. The tensors are checked, not read.\n"
    "Progress goes to stderr. PLAN (and --quantize's folder) is written under a\n"
    "temporary name and renamed into place: a compile that fails or is stopped\n"
    "(SIGINT, SIGTERM, SIGHUP) leaves no partial PLAN or folder, and an existing\n"
    "PLAN as it was (an fp8 folder finished before the failure stays).\n"
    "\n"
    "options:\n"
    "  -o, --output PLAN     the plan file to write (required)\n"
    "  --arch ARCH           GPU target (default sm_90, or $MOEC_ARCH); the plan runs\n"
    "                        on devices of that arch\n"
    "  --dtype D             compute dtype: bf16 (default) or fp32\n"
    "  --buckets LIST        ascending batch buckets (tokens per step, 1 to 4096),\n"
    "                        comma-separated, at most 16 (default 1,2,4,8,16,32,64);\n"
    "                        a step of n tokens runs in the smallest bucket that\n"
    "                        holds it, longer prompts in chunks of the largest\n"
    "                        (--batch-sizes: the same, its older name)\n"
    "  --tp N                split the model over N ranks (docs/PARALLEL.md): one\n"
    "                        plan per rank in PLAN, each reading only its slices of\n"
    "                        the checkpoint; it runs on N GPUs (--tp 1: the same\n"
    "                        path with one rank); an fp8 checkpoint where every\n"
    "                        rank's slices keep to its 128 x 128 scale blocks\n"
    "  --ep M                the routed experts in M groups of the ranks (M divides\n"
    "                        N; --ep alone: N = M)\n"
    "  --ep-combine HOW      all-reduce (default) or reduce-scatter: how the MoE\n"
    "                        block's partial sums meet (a reduce_scatter over the\n"
    "                        hidden axis, then an all_gather; N divides hidden_size)\n"
    "  --quantize fp8        first write an fp8 copy of the checkpoint (block-scaled\n"
    "                        e4m3, as DeepSeek-V3 publishes: every attention, MLP and\n"
    "                        expert linear, one f32 scale per 128x128 block, amax/448)\n"
    "                        into a new model folder, and compile for that folder:\n"
    "                        run the plan with --weights on it (the CPU backend reads\n"
    "                        it too: `moec run FOLDER --backend cpu`)\n"
    "  --quantized-dir DIR   that folder (default: PLAN without .moec, plus .fp8);\n"
    "                        it must not exist\n"
    "  --fp8-layout L        how the fp8 weights lie on the GPU: the routed experts'\n"
    "                        by gate_up (gate_up's in fragment tiles), tiles (down's\n"
    "                        too), down (down's alone) or rows (none); +linear lays\n"
    "                        the dense linears' in tiles too. Default gate_up+linear\n"
    "                        ($MOEC_FP8_TILES=N sets it too): faster than gate_up\n"
    "                        from 2 tokens a step, slower at 1; tiles is faster from\n"
    "                        8 tokens and slower at 1 to 4\n"
    "  -h, --help            this help\n";

static const char *USAGE_RUN =
    "usage: moec run MODEL_DIR --prompt-ids IDS|--prompt TEXT|--chat TEXT --max-new-tokens N [options]\n"
    "       moec run PLAN --weights MODEL_DIR --prompt-ids IDS|--prompt TEXT|--chat TEXT\n"
    "                --max-new-tokens N [options]\n"
    "\n"
    "Loads the model (config.json and its safetensors, every weight checked),\n"
    "runs the prompt, then greedy-decodes up to N tokens, printing the generated\n"
    "ids on one line, separated by spaces (with --prompt or --chat, their text). Given a\n"
    "PLAN file (moec compile), runs it on the GPU with no compile step, after\n"
    "checking that --weights holds the checkpoint it was compiled for and that\n"
    "the device has its arch and memory.\n"
    "\n"
    "options:\n"
    "  --prompt-ids IDS       comma-separated token ids, e.g. 1,2,3\n"
    "  --prompt TEXT          the prompt as text, encoded with the model's\n"
    "                         tokenizer.json (MODEL_DIR's, or a PLAN's --weights\n"
    "                         folder's) as `moec tokenize` does; the generated\n"
    "                         tokens are then printed as text, special tokens left\n"
    "                         out (one of --prompt-ids, --prompt and --chat is\n"
    "                         required)\n"
    "  --chat TEXT            TEXT as the user's message of a conversation, put\n"
    "                         through the model's chat template with the assistant's\n"
    "                         generation prompt (`moec chat-template`), then encoded\n"
    "                         as apply_chat_template does (add_special_tokens=False:\n"
    "                         the template writes the BOS where it wants one); the\n"
    "                         generated tokens are printed as text as with --prompt\n"
    "  --enable-thinking 0|1  with --chat: the template's enable_thinking (Qwen3's\n"
    "                         thinking switch; default: the template's own default)\n"
    "  --max-new-tokens N     tokens to generate, N >= 1 (required)\n"
    "  --weights DIR          the checkpoint (config.json + *.safetensors): required\n"
    "                         with a PLAN; with MODEL_DIR, weights from DIR instead\n"
    "  --backend B            cpu (the fp32 reference interpreter), cuda, or\n"
    "                         auto (default: cuda where a GPU is present, else\n"
    "                         cpu); cuda computes in bf16, or fp32 with\n"
    "                         MOEC_DTYPE=fp32; a PLAN runs on cuda, in the dtype\n"
    "                         it was compiled for\n"
    "  --logits-out FILE      write float32 little-endian logits, one row of\n"
    "                         vocab_size per generated token; row 0 is the\n"
    "                         prompt's last position. Opened before the model\n"
    "                         loads; a run that fails before row 0 leaves FILE as\n"
    "                         it was (or absent); never one of the run's inputs\n"
    "  --max-seq-len N        KV cache length (default: prompt + N - 1, the tokens\n"
    "                         fed to the model); at most the model's\n"
    "                         max_position_embeddings\n"
    "  --arch ARCH            GPU target the kernels are compiled for (default\n"
    "                         sm_90; the same as MOEC_ARCH=ARCH; not with a PLAN)\n"
    "  --ignore-eos           keep generating after any of the model's eos ids\n"
    "  --single-stream        cuda: run the shared experts (and DeepSeek-V3.2's\n"
    "                         indexer) on the main stream too (default: on a\n"
    "                         second stream, overlapping the routed experts (the\n"
    "                         MLA's q path); the same as MOEC_SINGLE_STREAM=1)\n"
    "  --eager                cuda: launch every kernel of a step one by one instead\n"
    "                         of replaying its CUDA Graph (MOEC_DISABLE_GRAPHS=1)\n"
    "  --tp N                 split the model over N ranks (docs/PARALLEL.md): on\n"
    "                         cpu, N reference interpreters in step in this process,\n"
    "                         the collectives done in memory; --tp 1 runs the\n"
    "                         sharded path with one rank. A PLAN runs with the split\n"
    "                         it was compiled for (moec compile --tp), on as many\n"
    "                         GPUs, a thread each; --tp says which split to expect.\n"
    "                         An fp8 checkpoint splits where every rank's slices\n"
    "                         keep to its 128 x 128 scale blocks\n"
    "  --ep M                 the routed experts in M groups of the ranks (M divides\n"
    "                         N; --ep alone: as many ranks as groups)\n"
    "  --ep-combine HOW       all-reduce (default) or reduce-scatter: how the MoE\n"
    "                         block's partial sums meet (reduce_scatter over the\n"
    "                         hidden axis, then all_gather). A PLAN keeps the one it\n"
    "                         was compiled with\n"
    "  -h, --help             this help\n";

static const char *USAGE_BENCH =
    "usage: moec bench MODEL_DIR [--batch-sizes 1,8,32,64] [--context N] [options]\n"
    "       moec bench PLAN --weights MODEL_DIR [options]\n"
    "\n"
    "Compiles the model for the GPU (MOEC_DTYPE=bf16 by default, or fp32), or\n"
    "loads a plan file (moec compile) with no compile step, captures every batch\n"
    "bucket's decode step as a CUDA Graph (once with the shared experts on a\n"
    "second stream, once on one stream), then, per batch size B, decodes one\n"
    "token for each of B sequences that already hold `context` tokens and prints\n"
    "the median step time (CUDA events, after warm-up) four ways: graph replay\n"
    "and eager launches, each with two streams and with one; then the bytes the\n"
    "step must read (weights, the routed experts it selected, the KV cache in\n"
    "use), the floor (those bytes over the copy bandwidth measured at start,\n"
    "read + write) and time / floor for the default way (graph, two streams).\n"
    "The header line gives the setup time (compile or plan load, upload) and the\n"
    "capture time of all buckets. With MOEC_DISABLE_GRAPHS=1 nothing is captured\n"
    "and the graph columns read -1.\n"
    "\n"
    "options:\n"
    "  --weights DIR        the checkpoint a plan was compiled for (with PLAN only)\n"
    "  --batch-sizes LIST   comma-separated batch sizes (default 1,8,32,64)\n"
    "  --context N          tokens already in each sequence (default 1024, or the\n"
    "                       model's max_position_embeddings - 1 where less)\n"
    "  --steps N            timed steps per batch size and way (default 100)\n"
    "  --warmup N           untimed steps first (default 10)\n"
    "  --profile            also print, per batch size, the time of every kernel\n"
    "                       (eager, one stream, an event between launches), summed\n"
    "                       by kernel, to stderr (a split: every rank's, with the\n"
    "                       collectives' time per step; JSON rows gain coll_ms)\n"
    "  --json               one JSON object per batch size and way instead of a table\n"
    "                       (with tp and ep; a split's rows add rank_ms, rank_bytes\n"
    "                       and rank_floor_ms, one per rank)\n"
    "  --arch ARCH          GPU target when compiling (default sm_90; as MOEC_ARCH)\n"
    "  --tp N, --ep M       a split over N ranks on N GPUs, a thread each, stepping\n"
    "                       together as a session does (docs/PARALLEL.md): a model is\n"
    "                       compiled so, a plan must have been. A step's time is its\n"
    "                       slowest rank's (CUDA events on each), each rank's floor\n"
    "                       the bytes it reads; more ranks than GPUs is refused\n"
    "                       before anything compiles\n"
    "  --ep-combine HOW     all-reduce (default) or reduce-scatter, as moec compile\n"
    "  -h, --help           this help\n";

static int usage_error(const char *usage, const char *fmt, const char *arg)
{
    fprintf(stderr, "moec: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n\n%s", usage);
    return 2;
}

static int lib_error(moec_status st)
{
    fprintf(stderr, "moec: error (%s): %s\n", moec_status_name(st), moec_last_error());
    return 1;
}

static int is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }

/* 1 when v looks like a GPU arch (sm_ and a digit first, as moec_compile
 * checks it: sm_90, sm_90a), so that a bad one is a usage error naming the
 * option, not a library error after the compile has begun. */
static int is_arch(const char *v)
{
    return !strncmp(v, "sm_", 3) && isdigit((unsigned char)v[3]) && strlen(v) <= 10;
}

/* Parses a decimal int in [lo, hi]; 0 on success. */
static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Parses "1,2,3" into a malloc'd array. Returns the count, or -1 with
 * *bad pointing at the offending text. */
static int parse_ids(const char *s, int32_t **out, const char **bad)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids)
        return -1;
    const char *p = s;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            *bad = p;
            free(ids);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *g = realloc(ids, (size_t)cap * sizeof *g);
            if (!g) {
                free(ids);
                return -1;
            }
            ids = g;
        }
        ids[n++] = (int32_t)v;
        if (!*end)
            break;
        p = end + 1;
    }
    *out = ids;
    return n;
}

/* --tp N, --ep M or (with_rank) --rank R at argv[*i] (an int in [lo, 64])
 * into par; 1 when argv[*i] is one of them, -1 (a usage error printed) when
 * its value is bad. */
static int parse_parallel_flag(int argc, char **argv, int *i, const char *usage,
                               moec_parallel *par, int *seen, int with_rank)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--ep-combine")) {
        if (++*i == argc) {
            usage_error(usage, "%s needs a value", a);
            return -1;
        }
        const char *v = argv[*i];
        if (strcmp(v, "all-reduce") && strcmp(v, "reduce-scatter")) {
            char msg[160];
            snprintf(msg, sizeof msg, "--ep-combine: '%.64s' is not all-reduce or reduce-scatter", v);
            usage_error(usage, "%s", msg);
            return -1;
        }
        par->ep_combine = strcmp(v, "all-reduce") ? MOEC_EP_COMBINE_REDUCE_SCATTER
                                                  : MOEC_EP_COMBINE_ALL_REDUCE;
        *seen |= 8;
        return 1;
    }
    int *dst = !strcmp(a, "--tp") ? &par->tp : !strcmp(a, "--ep") ? &par->ep
               : with_rank && !strcmp(a, "--rank") ? &par->rank : NULL;
    if (!dst)
        return 0;
    long v;
    long lo = dst == &par->rank ? 0 : 1;
    if (++*i == argc) {
        usage_error(usage, "%s needs a value", a);
        return -1;
    }
    if (parse_int(argv[*i], lo, 64, &v)) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: '%.64s' is not an integer in [%ld, 64]", a, argv[*i], lo);
        usage_error(usage, "%s", msg);
        return -1;
    }
    *dst = (int)v;
    *seen |= dst == &par->tp ? 1 : dst == &par->ep ? 2 : 4;
    return 1;
}

/* The parallel flags seen (bits: 1 --tp, 2 --ep, 4 --rank, 8 --ep-combine)
 * completed: --ep alone means as many ranks (tp = ep); --rank and
 * --ep-combine need a split. */
static int parallel_finish(const char *usage, moec_parallel *par, int seen)
{
    if ((seen & 2) && !(seen & 1))
        par->tp = par->ep;
    if ((seen & 4) && !(seen & 3))
        return usage_error(usage, "%s", "--rank needs --tp");
    if ((seen & 8) && !(seen & 3))
        return usage_error(usage, "%s", "--ep-combine needs --tp or --ep");
    return 0;
}

static int cmd_dump_ir(int argc, char **argv)
{
    const char *dir = NULL, *outpath = NULL, *after = NULL, *dtype = NULL;
    int summary = 0, par_seen = 0;
    moec_parallel par = {0};
    for (int i = 0; i < argc; i++) {
        int pf = parse_parallel_flag(argc, argv, &i, USAGE_DUMP, &par, &par_seen, 1);
        if (pf < 0)
            return 2;
        if (pf)
            continue;
        if (is_help(argv[i])) {
            fputs(USAGE_DUMP, stdout);
            print_passes(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--summary")) {
            summary = 1;
        } else if (!strcmp(argv[i], "--after") || !strcmp(argv[i], "--dtype")) {
            if (++i == argc)
                return usage_error(USAGE_DUMP, "%s needs a value", argv[i - 1]);
            if (!strcmp(argv[i - 1], "--after"))
                after = argv[i];
            else
                dtype = argv[i];
        } else if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (++i == argc)
                return usage_error(USAGE_DUMP, "%s needs a file name", argv[i - 1]);
            outpath = argv[i];
        } else if (argv[i][0] == '-') {
            return usage_error(USAGE_DUMP, "unknown option %s", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            return usage_error(USAGE_DUMP, "unexpected argument %s", argv[i]);
        }
    }
    if (!dir)
        return usage_error(USAGE_DUMP, "%s", "missing MODEL_DIR");
    if (after && strcmp(after, "all")) {
        int known = 0;
        for (int i = 0; i < moec_pass_count(); i++)
            known |= !strcmp(after, moec_pass_name(i));
        if (!known) {
            fprintf(stderr, "moec: --after: unknown pass '%s'\n", after);
            print_passes(stderr);
            return 2;
        }
    }
    if (after && !strcmp(after, "all") && !outpath)
        return usage_error(USAGE_DUMP, "%s", "--after all needs -o DIR");
    if (after && summary)
        return usage_error(USAGE_DUMP, "%s", "--summary and --after do not go together");
    if (dtype && strcmp(dtype, "bf16") && strcmp(dtype, "fp16") && strcmp(dtype, "fp32"))
        return usage_error(USAGE_DUMP, "--dtype: '%s' is not bf16, fp16 or fp32", dtype);
    if (parallel_finish(USAGE_DUMP, &par, par_seen))
        return 2;
    if (par_seen && summary)
        return usage_error(USAGE_DUMP, "%s", "--summary and --tp do not go together");
    const moec_parallel *pp = par_seen ? &par : NULL;
    char name[256]; /* "w" would empty it: a model folder whose config.json is now IR */
    if (outpath && moec_path_in_folder(outpath, dir, name, sizeof name)) {
        fprintf(stderr, "moec: -o %s is %s/%s, a file of the model\n", outpath, dir, name);
        return 2;
    }
    moec_model_t *m;
    moec_status st = moec_model_open(dir, &m);
    if (st != MOEC_OK)
        return lib_error(st);
    if (after && !strcmp(after, "all")) {
        st = moec_model_dump_passes_rank(m, dtype, pp, outpath);
        if (st == MOEC_OK)
            fprintf(stderr, "moec: wrote %d files to %s\n", moec_pass_count() + 1, outpath);
        moec_model_free(m);
        return st == MOEC_OK ? 0 : lib_error(st);
    }
    FILE *out = stdout;
    if (outpath && !(out = fopen(outpath, "w"))) {
        fprintf(stderr, "moec: cannot write %s: %s\n", outpath, strerror(errno));
        moec_model_free(m);
        return 1;
    }
    st = summary          ? moec_model_summary(m, out)
         : after || pp    ? moec_model_dump_ir_rank(m, after, dtype, pp, out)
                          : moec_model_dump_ir(m, out);
    int rc = st == MOEC_OK ? 0 : lib_error(st);
    if (out != stdout && fclose(out) != 0 && rc == 0) {
        fprintf(stderr, "moec: cannot write %s: %s\n", outpath, strerror(errno));
        rc = 1;
    }
    moec_model_free(m);
    return rc;
}

static int argmax(const float *row, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best])
            best = i;
    return best;
}

/* 1 when t is one of the model's n eos ids. */
static int is_eos(int32_t t, const int32_t *eos, int n)
{
    for (int i = 0; i < n; i++)
        if (eos[i] == t)
            return 1;
    return 0;
}

typedef struct run_opts {
    const char *dir;       /* MODEL_DIR or PLAN */
    const char *weights;   /* --weights */
    const char *ids_text;
    const char *prompt; /* --prompt */
    const char *chat;   /* --chat */
    int enable_thinking; /* --enable-thinking: -1 unset */
    const char *logits_path;
    const char *arch;
    long max_new;
    long max_seq;
    moec_backend backend;
    int backend_set;
    int ignore_eos;
    moec_parallel par;     /* --tp, --ep */
    int par_seen;
} run_opts;

static int run_parse(int argc, char **argv, run_opts *o, int *done)
{
    *done = 0;
    o->max_new = -1;
    o->enable_thinking = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        int pf = parse_parallel_flag(argc, argv, &i, USAGE_RUN, &o->par, &o->par_seen, 0);
        if (pf < 0)
            return 2;
        if (pf)
            continue;
        if (is_help(a)) {
            fputs(USAGE_RUN, stdout);
            *done = 1;
            return 0;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = 1;
        } else if (!strcmp(a, "--single-stream")) {
            setenv("MOEC_SINGLE_STREAM", "1", 1);
        } else if (!strcmp(a, "--eager")) {
            setenv("MOEC_DISABLE_GRAPHS", "1", 1);
        } else if (!strcmp(a, "--prompt-ids") || !strcmp(a, "--prompt") || !strcmp(a, "--chat") ||
                   !strcmp(a, "--enable-thinking") || !strcmp(a, "--max-new-tokens") ||
                   !strcmp(a, "--backend") || !strcmp(a, "--logits-out") ||
                   !strcmp(a, "--max-seq-len") || !strcmp(a, "--arch") ||
                   !strcmp(a, "--weights")) {
            if (!has_val)
                return usage_error(USAGE_RUN, "%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--prompt-ids"))
                o->ids_text = v;
            else if (!strcmp(a, "--prompt"))
                o->prompt = v;
            else if (!strcmp(a, "--chat"))
                o->chat = v;
            else if (!strcmp(a, "--enable-thinking")) {
                if (strcmp(v, "0") && strcmp(v, "1"))
                    return usage_error(USAGE_RUN, "--enable-thinking: '%s' is not 0 or 1", v);
                o->enable_thinking = v[0] - '0';
            } else if (!strcmp(a, "--logits-out"))
                o->logits_path = v;
            else if (!strcmp(a, "--weights"))
                o->weights = v;
            else if (!strcmp(a, "--arch")) {
                if (!is_arch(v))
                    return usage_error(USAGE_RUN, "--arch: '%s' is not a GPU arch like sm_90", v);
                o->arch = v;
            }
            else if (!strcmp(a, "--max-new-tokens")) {
                if (parse_int(v, 1, 1 << 24, &o->max_new))
                    return usage_error(USAGE_RUN,
                                       "--max-new-tokens: '%s' is not an integer from 1 to "
                                       "16777216",
                                       v);
            } else if (!strcmp(a, "--max-seq-len")) {
                if (parse_int(v, 1, 1 << 26, &o->max_seq))
                    return usage_error(
                        USAGE_RUN, "--max-seq-len: '%s' is not an integer from 1 to 67108864", v);
            } else {
                o->backend_set = 1;
                if (!strcmp(v, "cpu"))
                    o->backend = MOEC_BACKEND_CPU;
                else if (!strcmp(v, "cuda"))
                    o->backend = MOEC_BACKEND_CUDA;
                else if (!strcmp(v, "auto"))
                    o->backend = MOEC_BACKEND_AUTO;
                else
                    return usage_error(USAGE_RUN, "--backend: '%s' is not cpu, cuda or auto", v);
            }
        } else if (a[0] == '-') {
            return usage_error(USAGE_RUN, "unknown option %s", a);
        } else if (!o->dir) {
            o->dir = a;
        } else {
            return usage_error(USAGE_RUN, "unexpected argument %s", a);
        }
    }
    if (!o->dir)
        return usage_error(USAGE_RUN, "%s", "missing MODEL_DIR or PLAN");
    if (!o->ids_text && !o->prompt && !o->chat)
        return usage_error(USAGE_RUN, "%s", "missing --prompt-ids, --prompt or --chat");
    if (!!o->ids_text + !!o->prompt + !!o->chat > 1)
        return usage_error(USAGE_RUN, "%s", "--prompt-ids, --prompt and --chat are exclusive");
    if (o->enable_thinking >= 0 && !o->chat)
        return usage_error(USAGE_RUN, "%s", "--enable-thinking goes with --chat");
    if (o->max_new < 0)
        return usage_error(USAGE_RUN, "%s", "missing --max-new-tokens");
    return parallel_finish(USAGE_RUN, &o->par, o->par_seen) ? 2 : 0;
}

/* A plan file is anything that exists and is not a directory (moec_session_init_plan
 * says when it is not a plan); anything else is taken for a model directory. */
static int is_plan_path(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode);
}

/* Checks what a run of a plan cannot take; 0 when fine, else the exit code. */
static int plan_checks(const run_opts *o)
{
    if (!o->weights)
        return usage_error(USAGE_RUN,
                           "%s is a plan file: --weights MODEL_DIR (the checkpoint it was "
                           "compiled for) is required",
                           o->dir);
    if (o->backend_set && o->backend == MOEC_BACKEND_CPU)
        return usage_error(USAGE_RUN,
                           "--backend cpu: %s is a plan, which runs on the GPU (run MODEL_DIR "
                           "for the CPU interpreter)",
                           o->dir);
    if (o->arch)
        return usage_error(USAGE_RUN,
                           "--arch: %s is a plan, compiled for one arch (moec compile --arch)",
                           o->dir);
    return 0;
}

/* The KV cache of max_seq tokens against the model's max_position_embeddings
 * (0: unknown), naming the flag to change: --max-seq-len where the user set
 * it, else --max-new-tokens. 0 when it fits, else the exit code. */
static int run_check_length(const run_opts *o, int n, long max_seq, int max_pos)
{
    if (max_pos <= 0 || max_seq <= max_pos)
        return 0;
    if (o->max_seq)
        fprintf(stderr, "moec: --max-seq-len %ld exceeds the model's max_position_embeddings %d\n",
                max_seq, max_pos);
    else if (n > max_pos)
        fprintf(stderr,
                "moec: the prompt's %d tokens exceed the model's max_position_embeddings %d\n", n,
                max_pos);
    else
        fprintf(stderr,
                "moec: %d prompt tokens and --max-new-tokens %ld need %ld positions, more than the "
                "model's max_position_embeddings %d: --max-new-tokens can be at most %ld\n",
                n, o->max_new, max_seq, max_pos, (long)max_pos - n + 1);
    return 2;
}

/* A plan's max_position_embeddings, from the config.json in weights_dir
 * (the plan runs only against the config it was compiled from); 0 when that
 * cannot be read, and the plan's own checks say what is wrong. */
static int plan_max_positions(const char *weights_dir)
{
    moec_model_t *m = NULL;
    int max_pos = moec_model_open(weights_dir, &m) == MOEC_OK ? moec_model_max_positions(m) : 0;
    moec_model_free(m);
    return max_pos;
}

/* --prompt: the text encoded by the model's tokenizer (MODEL_DIR's, or a
 * plan's --weights folder's), and a detokenizer for what is generated;
 * --chat: the same for the text its chat template makes of it. */
static int prompt_ids(const run_opts *o, int plan, moec_tokenizer_t **tok,
                      moec_detokenizer_t **detok, int32_t **ids, int *n)
{
    char *chat = NULL;
    moec_status st = moec_tokenizer_open(plan ? o->weights : o->dir, tok);
    if (st == MOEC_OK && o->chat) { /* one user message, the assistant to answer */
        moec_chat_message_t msg = {"user", o->chat};
        moec_chat_options_t opts = {.add_generation_prompt = 1, .enable_thinking = o->enable_thinking};
        st = moec_chat_render(*tok, &msg, 1, &opts, &chat);
    }
    if (st == MOEC_OK) /* the chat template writes its BOS itself, as apply_chat_template has it */
        st = chat ? moec_tokenizer_encode(*tok, chat, strlen(chat), 0, ids, n)
                  : moec_tokenizer_encode(*tok, o->prompt, strlen(o->prompt), 1, ids, n);
    free(chat);
    if (st == MOEC_OK)
        st = moec_detokenizer_init(*tok, 1, detok);
    if (st != MOEC_OK)
        return lib_error(st);
    if (*n == 0) {
        fprintf(stderr, "moec: %s: the text encodes to no tokens\n", o->chat ? "--chat" : "--prompt");
        return 2;
    }
    return 0;
}

/* Prints a generated id (space-separated), or with --prompt the text that
 * it completes; id -1 ends the stream. */
static int print_token(moec_detokenizer_t *d, int32_t id, long k)
{
    if (!d) {
        if (id >= 0)
            printf(k ? " %d" : "%d", (int)id);
        return 0;
    }
    const char *text;
    size_t len;
    moec_status st = id >= 0 ? moec_detokenizer_push(d, id, &text, &len)
                             : moec_detokenizer_finish(d, &text, &len);
    if (st != MOEC_OK)
        return lib_error(st);
    fwrite(text, 1, len, stdout);
    return 0;
}

/* --logits-out opened before the model's weights load (the long part), so
 * that a path that cannot be written fails at once; refused when it is one
 * of the files the run reads (the plan, or a file of MODEL_DIR or of
 * --weights), which would be emptied. Opened without truncation: an
 * existing file is emptied at the first row, so a run that fails before it
 * leaves it as it was (and removes it when *created). 0 when open (or not
 * asked for), else the exit code. */
static int open_logits(const run_opts *o, int plan, FILE **lf, int *created)
{
    if (!o->logits_path)
        return 0;
    const char *dirs[2] = {plan ? NULL : o->dir, o->weights};
    struct stat a, b;
    char name[256];
    int same = plan && stat(o->logits_path, &a) == 0 && stat(o->dir, &b) == 0 &&
               a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    if (same) {
        fprintf(stderr, "moec: --logits-out %s is the plan %s, which the run reads\n",
                o->logits_path, o->dir);
        return 2;
    }
    for (int k = 0; k < 2; k++)
        if (moec_path_in_folder(o->logits_path, dirs[k], name, sizeof name)) {
            fprintf(stderr, "moec: --logits-out %s is %s/%s, which the run reads\n",
                    o->logits_path, dirs[k], name);
            return 2;
        }
    *created = stat(o->logits_path, &a) != 0;
    int fd = open(o->logits_path, O_WRONLY | O_CREAT, 0666);
    if (fd < 0 || !(*lf = fdopen(fd, "wb"))) {
        fprintf(stderr, "moec: cannot write %s: %s\n", o->logits_path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return 1;
    }
    return 0;
}

static int cmd_run(int argc, char **argv)
{
    run_opts o = {0};
    int done;
    int rc = run_parse(argc, argv, &o, &done);
    if (rc || done)
        return rc;
    int plan = is_plan_path(o.dir);
    if (plan && (rc = plan_checks(&o)) != 0)
        return rc;
    if (o.arch)
        setenv("MOEC_ARCH", o.arch, 1);
    int32_t *ids = NULL;
    const char *bad = NULL;
    moec_tokenizer_t *tok = NULL;
    moec_detokenizer_t *detok = NULL;
    int n = 0;
    if (o.prompt || o.chat) {
        rc = prompt_ids(&o, plan, &tok, &detok, &ids, &n);
    } else if ((n = parse_ids(o.ids_text, &ids, &bad)) < 0) {
        return usage_error(USAGE_RUN, "--prompt-ids: bad token id at '%s' (want comma-separated integers >= 0)",
                           bad ? bad : o.ids_text);
    }
    /* the last new token is printed, never fed back */
    long max_seq = o.max_seq ? o.max_seq : n + o.max_new - 1;
    if (rc == 0 && max_seq < n + o.max_new - 1) {
        fprintf(stderr, "moec: --max-seq-len %ld is too short for %d prompt tokens and %ld new tokens\n",
                max_seq, n, o.max_new);
        rc = 2;
    }
    if (rc) {
        free(ids);
        moec_detokenizer_free(detok);
        moec_tokenizer_free(tok);
        return rc;
    }

    moec_model_t *m = NULL;
    moec_session_t *s = NULL;
    float *logits = NULL;
    FILE *lf = NULL;
    int lf_created = 0;
    long rows = 0; /* written to --logits-out */
    moec_status st;
    if (plan) {
        if ((rc = run_check_length(&o, n, max_seq, plan_max_positions(o.weights))) != 0 ||
            (rc = open_logits(&o, plan, &lf, &lf_created)) != 0)
            goto out;
        st = moec_session_init_plan_parallel(o.dir, o.weights, (int)max_seq,
                                             o.par_seen ? &o.par : NULL, &s);
        if (st != MOEC_OK)
            goto fail;
    } else {
        st = moec_model_open(o.dir, &m);
        if (st != MOEC_OK)
            goto fail;
        if ((rc = run_check_length(&o, n, max_seq, moec_model_max_positions(m))) != 0)
            goto out;
    }
    int vocab = plan ? moec_session_vocab_size(s) : moec_model_vocab_size(m);
    for (int i = 0; i < n; i++) {
        if (ids[i] >= vocab) {
            if (tok) /* the tokenizer's ids past the model's: a mismatched tokenizer.json */
                fprintf(stderr,
                        "moec: %s: the tokenizer's id %d is outside the model's vocabulary "
                        "(vocab_size %d)\n",
                        o.chat ? "--chat" : "--prompt", (int)ids[i], vocab);
            else
                fprintf(stderr, "moec: --prompt-ids: token id %d is outside the vocabulary "
                                "(vocab_size %d)\n", (int)ids[i], vocab);
            rc = 2;
            goto out;
        }
    }
    if (!plan) {
        if ((rc = open_logits(&o, plan, &lf, &lf_created)) != 0)
            goto out;
        st = moec_session_init_parallel(m, o.weights ? o.weights : o.dir, o.backend,
                                        (int)max_seq, o.par_seen ? &o.par : NULL, &s);
        if (st != MOEC_OK)
            goto fail;
    }
    logits = malloc((size_t)n * (size_t)vocab * sizeof *logits);
    if (!logits) {
        fprintf(stderr, "moec: out of memory\n");
        rc = 1;
        goto out;
    }
    st = moec_session_forward(s, ids, n, logits);
    if (st != MOEC_OK)
        goto fail;
    const float *row = logits + (size_t)(n - 1) * (size_t)vocab;
    const int32_t *eos;
    int n_eos = moec_session_eos_tokens(s, &eos);
    for (long k = 0; k < o.max_new; k++) {
        if (lf && ((!rows && ftruncate(fileno(lf), 0) != 0) ||
                   fwrite(row, sizeof *row, (size_t)vocab, lf) != (size_t)vocab)) {
            fprintf(stderr, "moec: cannot write %s: %s\n", o.logits_path, strerror(errno));
            rc = 1;
            goto out;
        }
        rows += lf != NULL;
        int32_t next = argmax(row, vocab);
        if ((rc = print_token(detok, next, k)) != 0)
            goto out;
        fflush(stdout);
        if ((!o.ignore_eos && is_eos(next, eos, n_eos)) || k + 1 == o.max_new)
            break;
        st = moec_session_forward(s, &next, 1, logits);
        if (st != MOEC_OK) {
            printf("\n");
            goto fail;
        }
        row = logits;
    }
    if ((rc = print_token(detok, -1, 0)) != 0)
        goto out;
    printf("\n");
    goto out;
fail:
    rc = lib_error(st);
out:
    if (lf && fclose(lf) != 0 && rc == 0) {
        fprintf(stderr, "moec: cannot write %s: %s\n", o.logits_path, strerror(errno));
        rc = 1;
    }
    if (lf && rc != 0 && !rows && lf_created) /* a failure before the first row */
        unlink(o.logits_path);
    free(logits);
    free(ids);
    moec_session_free(s);
    moec_model_free(m);
    moec_detokenizer_free(detok);
    moec_tokenizer_free(tok);
    return rc;
}

/* Parses a list of 1 to MOEC_BUCKETS_MAX sizes >= 1 (bench's batch sizes,
 * compile's buckets, which moec_buckets_check then checks); 0 on success. */
static int parse_batch_sizes(const char *v, int *out, int *n_out)
{
    int32_t *ids = NULL;
    const char *bad = NULL;
    int n = parse_ids(v, &ids, &bad);
    int ok = n >= 1 && n <= MOEC_BUCKETS_MAX;
    for (int k = 0; ok && k < n; k++)
        ok = ids[k] >= 1;
    for (int k = 0; ok && k < n; k++)
        out[k] = ids[k];
    free(ids);
    if (ok)
        *n_out = n;
    return ok ? 0 : -1;
}

/* Progress of the NVRTC compiles: one line per update, or one line
 * rewritten in place on a terminal. */
static void compile_progress(int done, int total, void *user)
{
    int tty = *(const int *)user;
    fprintf(stderr, "%smoec compile: compiled %d/%d kernels%s", tty ? "\r" : "", done, total,
            tty && done < total ? "" : "\n");
    fflush(stderr);
}

/* What a compile stopped by a signal would leave: the plan's temporary file
 * (PLAN.tmp.PID, ir_plan_file.c) and --quantize's temporary folder
 * (DIR.tmpPID, moec_quantize.c: config.json, generation_config.json and
 * the shards model-00001.safetensors on), a partial checkpoint as large as
 * the model. The paths are made before the compile starts; the handler of
 * SIGINT, SIGTERM and SIGHUP removes them (unlink, rmdir and memcpy are
 * async-signal-safe) and dies of the signal. */
static struct {
    char plan_tmp[4200];
    char q_tmp[4200];  /* "" without --quantize */
    char q_file[4300]; /* q_tmp, '/', and a name the handler writes */
    size_t q_len;      /* strlen(q_tmp) + 1 */
} g_compile_tmp;

static void compile_tmp_unlink(const char *name, size_t n)
{
    memcpy(g_compile_tmp.q_file + g_compile_tmp.q_len, name, n + 1);
    unlink(g_compile_tmp.q_file);
}

static void compile_tmp_remove_and_die(int sig)
{
    unlink(g_compile_tmp.plan_tmp);
    if (g_compile_tmp.q_tmp[0]) {
        compile_tmp_unlink("config.json", strlen("config.json"));
        compile_tmp_unlink("generation_config.json", strlen("generation_config.json"));
        char shard[] = "model-00000.safetensors";
        for (int i = 1; i < 100000; i++) { /* numbered from 1, without gaps */
            for (int k = 10, v = i; k >= 6; k--, v /= 10)
                shard[k] = (char)('0' + v % 10);
            memcpy(g_compile_tmp.q_file + g_compile_tmp.q_len, shard, sizeof shard);
            if (unlink(g_compile_tmp.q_file) != 0)
                break;
        }
        rmdir(g_compile_tmp.q_tmp);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The handler on (with the temporary names of out and, with --quantize,
 * qdir), or off (out NULL): moec_cleanup_on_signals. */
static void compile_tmp_on_signals(const char *out, const char *qdir)
{
    if (out) {
        snprintf(g_compile_tmp.plan_tmp, sizeof g_compile_tmp.plan_tmp, "%s.tmp.%d", out,
                 (int)getpid());
        g_compile_tmp.q_tmp[0] = '\0';
        if (qdir)
            snprintf(g_compile_tmp.q_tmp, sizeof g_compile_tmp.q_tmp, "%s.tmp%ld", qdir,
                     (long)getpid());
        g_compile_tmp.q_len = (size_t)snprintf(g_compile_tmp.q_file, sizeof g_compile_tmp.q_file,
                                               "%s/", g_compile_tmp.q_tmp);
    }
    moec_cleanup_on_signals(out ? compile_tmp_remove_and_die : NULL);
}

static int cmd_compile(int argc, char **argv)
{
    const char *dir = NULL, *outpath = NULL;
    char qdir[4096];
    moec_compile_options o;
    memset(&o, 0, sizeof o);
    int par_seen = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int pf = parse_parallel_flag(argc, argv, &i, USAGE_COMPILE, &o.par, &par_seen, 0);
        if (pf < 0)
            return 2;
        if (pf)
            continue;
        if (is_help(a)) {
            fputs(USAGE_COMPILE, stdout);
            return 0;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--arch") ||
                   !strcmp(a, "--dtype") || !strcmp(a, "--buckets") ||
                   !strcmp(a, "--batch-sizes") || !strcmp(a, "--quantize") ||
                   !strcmp(a, "--quantized-dir") || !strcmp(a, "--fp8-layout")) {
            if (i + 1 == argc)
                return usage_error(USAGE_COMPILE, "%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
                outpath = v;
            } else if (!strcmp(a, "--quantize")) {
                if (strcmp(v, "fp8"))
                    return usage_error(USAGE_COMPILE, "--quantize: '%s' is not fp8", v);
                o.quantize = v;
            } else if (!strcmp(a, "--fp8-layout")) {
                if (moec_fp8_layout_check(v) != MOEC_OK)
                    return usage_error(USAGE_COMPILE,
                                       "--fp8-layout: '%s' is not gate_up, tiles, down or rows, "
                                       "alone or with +linear",
                                       v);
                o.fp8_layout = v;
            } else if (!strcmp(a, "--quantized-dir")) {
                if (!*v)
                    return usage_error(USAGE_COMPILE, "%s", "--quantized-dir: an empty name");
                o.quantized_dir = v;
            } else if (!strcmp(a, "--arch")) {
                if (!is_arch(v))
                    return usage_error(USAGE_COMPILE, "--arch: '%s' is not a GPU arch like sm_90", v);
                o.arch = v;
            } else if (!strcmp(a, "--dtype")) {
                if (strcmp(v, "bf16") && strcmp(v, "fp32"))
                    return usage_error(USAGE_COMPILE, "--dtype: '%s' is not bf16 or fp32", v);
                o.dtype = v;
            } else if (!strcmp(a, "--buckets") || !strcmp(a, "--batch-sizes")) {
                if (parse_batch_sizes(v, o.buckets, &o.n_buckets) ||
                    moec_buckets_check(o.buckets, o.n_buckets) != MOEC_OK)
                    return usage_error(USAGE_COMPILE, strcmp(a, "--buckets")
                        ? "--batch-sizes: '%s' is not 1 to 16 ascending buckets from 1 to 4096 tokens"
                        : "--buckets: '%s' is not 1 to 16 ascending buckets from 1 to 4096 tokens", v);
            }
        } else if (a[0] == '-') {
            return usage_error(USAGE_COMPILE, "unknown option %s", a);
        } else if (!dir) {
            dir = a;
        } else {
            return usage_error(USAGE_COMPILE, "unexpected argument %s", a);
        }
    }
    if (!dir)
        return usage_error(USAGE_COMPILE, "%s", "missing MODEL_DIR");
    if (parallel_finish(USAGE_COMPILE, &o.par, par_seen))
        return 2;
    if (!outpath)
        return usage_error(USAGE_COMPILE, "%s", "missing -o PLAN (the plan file to write)");
    if (o.quantized_dir && !o.quantize)
        return usage_error(USAGE_COMPILE, "%s", "--quantized-dir goes with --quantize fp8");
    if (o.quantize && !o.quantized_dir) {
        size_t n = strlen(outpath);
        if (n > 5 && !strcmp(outpath + n - 5, ".moec"))
            n -= 5;
        snprintf(qdir, sizeof qdir, "%.*s.fp8", (int)(n < 4000 ? n : 4000), outpath);
        o.quantized_dir = qdir;
    }
    const char *arch = o.arch ? o.arch : getenv("MOEC_ARCH");
    if (!o.n_buckets)
        o.n_buckets = moec_buckets_default(o.buckets);
    char buckets[16 * 6] = "";
    for (int i = 0, n = 0; i < o.n_buckets; i++)
        n += snprintf(buckets + n, sizeof buckets - (size_t)n, "%s%d", i ? "," : "", o.buckets[i]);
    int tty = isatty(fileno(stderr));
    o.progress = compile_progress;
    o.progress_user = &tty;
    double t0 = moec_now_s();
    moec_model_t *m = NULL;
    moec_status st = moec_model_open(dir, &m);
    if (st == MOEC_OK) {
        if (o.quantize)
            fprintf(stderr, "moec compile: %s: quantizing to fp8 into %s, then compiling for it\n",
                    dir, o.quantized_dir);
        fprintf(stderr, "moec compile: %s: passes, code generation and NVRTC (%s, %s, buckets %s)\n",
                dir, arch && *arch ? arch : "sm_90", o.dtype ? o.dtype : "bf16", buckets);
        compile_tmp_on_signals(outpath, o.quantize ? o.quantized_dir : NULL);
        st = moec_compile(m, dir, &o, outpath);
        compile_tmp_on_signals(NULL, NULL);
    }
    moec_model_free(m);
    if (st != MOEC_OK)
        return lib_error(st);
    struct stat sb;
    long long size = stat(outpath, &sb) == 0 ? (long long)sb.st_size : -1;
    fprintf(stderr, "moec compile: wrote %s (%lld bytes) in %.1f s\n", outpath, size, moec_now_s() - t0);
    if (o.quantize)
        fprintf(stderr, "moec compile: the fp8 checkpoint is %s: run the plan with --weights %s\n",
                o.quantized_dir, o.quantized_dir);
    return 0;
}

/* A split bench row's per-rank fields for its JSON lines: ", \"rank_ms\":
 * [...], \"rank_bytes\": [...], \"rank_floor_ms\": [...]". */
static void bench_json_split(const moec_bench_result *r, const moec_bench_row *w, char *buf,
                             size_t cap)
{
    static const char *const keys[] = {"rank_ms", "rank_bytes", "rank_floor_ms"};
    size_t n = 0;
    buf[0] = '\0';
    for (int f = 0; f < 3; f++) {
        n += (size_t)snprintf(buf + n, cap - n, ", \"%s\": [", keys[f]);
        for (int k = 0; k < r->tp && n < cap; k++) {
            double v = f == 0 ? w->rank_ms[k]
                       : f == 1 ? w->rank_bytes[k]
                                : w->rank_bytes[k] / r->copy_bytes_per_s * 1e3;
            n += (size_t)snprintf(buf + n, cap - n, f == 1 ? "%s%.0f" : "%s%.4f", k ? ", " : "", v);
        }
        if (n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "]");
        if (n >= cap)
            return;
    }
}

static int cmd_bench(int argc, char **argv)
{
    const char *dir = NULL, *weights = NULL;
    moec_bench_options o = {4, {1, 8, 32, 64}, -1, 100, 10, NULL, NULL, {0}};
    int json = 0, arch = 0, par_seen = 0;
    moec_parallel par = {0};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int pf = parse_parallel_flag(argc, argv, &i, USAGE_BENCH, &par, &par_seen, 0);
        if (pf < 0)
            return 2;
        if (pf)
            continue;
        if (is_help(a)) {
            fputs(USAGE_BENCH, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--profile")) {
            o.profile = stderr;
        } else if (!strcmp(a, "--arch")) {
            if (i + 1 == argc || !is_arch(argv[i + 1]))
                return usage_error(USAGE_BENCH, "%s", "--arch needs a GPU arch like sm_90");
            setenv("MOEC_ARCH", argv[++i], 1);
            arch = 1;
        } else if (!strcmp(a, "--weights")) {
            if (i + 1 == argc)
                return usage_error(USAGE_BENCH, "%s needs a value", a);
            weights = argv[++i];
        } else if (!strcmp(a, "--batch-sizes") || !strcmp(a, "--context") ||
                   !strcmp(a, "--steps") || !strcmp(a, "--warmup")) {
            if (i + 1 == argc)
                return usage_error(USAGE_BENCH, "%s needs a value", a);
            const char *v = argv[++i];
            long x;
            if (!strcmp(a, "--batch-sizes")) {
                if (parse_batch_sizes(v, o.batch, &o.n_batch))
                    return usage_error(USAGE_BENCH, "--batch-sizes: '%s' is not 1 to 16 sizes >= 1", v);
            } else if (parse_int(v, !strcmp(a, "--steps") ? 1 : 0, 1 << 24, &x)) {
                char msg[256];
                snprintf(msg, sizeof msg, "%s: '%.64s' is not an integer from %d to 16777216", a,
                         v, !strcmp(a, "--steps"));
                return usage_error(USAGE_BENCH, "%s", msg);
            } else if (!strcmp(a, "--context")) {
                o.context = (int)x;
            } else if (!strcmp(a, "--steps")) {
                o.steps = (int)x;
            } else {
                o.warmup = (int)x;
            }
        } else if (a[0] == '-') {
            return usage_error(USAGE_BENCH, "unknown option %s", a);
        } else if (!dir) {
            dir = a;
        } else {
            return usage_error(USAGE_BENCH, "unexpected argument %s", a);
        }
    }
    if (!dir)
        return usage_error(USAGE_BENCH, "%s", "missing MODEL_DIR or PLAN");
    if (parallel_finish(USAGE_BENCH, &par, par_seen))
        return 2;
    o.par = par;
    int plan = is_plan_path(dir);
    if (plan && !weights)
        return usage_error(USAGE_BENCH,
                           "%s is a plan file: --weights MODEL_DIR (the checkpoint it was "
                           "compiled for) is required",
                           dir);
    if (!plan && weights)
        return usage_error(USAGE_BENCH, "--weights goes with a plan file; %s is a model directory",
                           dir);
    if (plan && arch)
        return usage_error(USAGE_BENCH, "--arch: %s is a plan, compiled for one arch (moec compile --arch)",
                           dir);
    moec_model_t *m = NULL;
    moec_status st = MOEC_OK;
    moec_bench_result r;
    memset(&r, 0, sizeof r);
    if (plan) {
        o.plan_path = dir;
        fprintf(stderr, "moec bench: loading plan %s and the weights in %s\n", dir, weights);
        st = moec_bench(NULL, weights, &o, &r);
    } else {
        st = moec_model_open(dir, &m);
        if (st == MOEC_OK) {
            fprintf(stderr, "moec bench: compiling %s for the GPU and loading its weights\n", dir);
            st = moec_bench(m, dir, &o, &r);
        }
    }
    moec_model_free(m);
    if (st != MOEC_OK && r.max_context > 0 && r.context > r.max_context) {
        fprintf(stderr,
                "moec: --context %d is more than the model allows: at most %d (its "
                "max_position_embeddings %d, less the token each step decodes)\n",
                r.context, r.max_context, r.max_context + 1);
        return 2;
    }
    if (st != MOEC_OK)
        return lib_error(st);
    const char *dtype = getenv("MOEC_DTYPE");
    dtype = dtype && *dtype ? dtype : "bf16";
    if (!json) {
        printf("device %s, copy bandwidth %.2f TB/s (read+write), %s, context %d, %d steps\n"
               "setup %.2f s (%s), capture of all buckets %.3f s (two streams), %.3f s (one)\n",
               r.device, r.copy_bytes_per_s / 1e12, dtype, r.context, o.steps, r.setup_s,
               plan ? "plan load + upload" : "compile + upload", r.capture_s, r.capture_single_s);
        if (r.tp)
            printf("split over %d ranks (tp %d, ep %d), a GPU each: a step takes its slowest "
                   "rank's time; MB_read and floor are the rank reading the most\n",
                   r.tp, r.tp, r.ep);
        printf("%6s %9s %9s %9s %9s %9s %9s %9s %10s %8s\n", "batch", "graph_ms", "graph_1s",
               "eager_ms", "eager_1s", "MB_read", "floor_ms", "x_floor", "experts", "launches");
    }
    for (int i = 0; i < r.n_rows; i++) {
        const moec_bench_row *w = &r.rows[i];
        if (json) {
            char split[4096] = "";
            if (r.tp)
                bench_json_split(&r, w, split, sizeof split);
            char coll[64] = "";
            if (o.profile)
                snprintf(coll, sizeof coll, ", \"coll_ms\": %.4f", w->coll_ms);
            for (int k = 0; k < MOEC_BENCH_MODES; k++)
                printf("{\"impl\": \"moec\", \"mode\": \"%s\", \"batch\": %d, \"context\": %d, "
                       "\"ms\": %.4f, \"bytes\": %.0f, \"floor_ms\": %.4f, \"copy_tb_s\": %.3f, "
                       "\"experts_hit\": %d, \"experts_total\": %d, \"launches\": %d, "
                       "\"setup_s\": %.3f, \"capture_s\": %.4f, \"dtype\": \"%s\", \"device\": \"%s\", "
                       "\"tp\": %d, \"ep\": %d%s%s}\n",
                       moec_bench_mode_name(k), w->batch, r.context, w->mode_ms[k], w->bytes,
                       w->floor_ms, r.copy_bytes_per_s / 1e12, w->experts_hit, w->experts_total,
                       r.launches_per_step[i], r.setup_s,
                       k == MOEC_BENCH_GRAPH_SINGLE ? r.capture_single_s : r.capture_s, dtype,
                       r.device, r.tp, r.ep, split, coll);
        } else {
            char experts[32];
            snprintf(experts, sizeof experts, "%d/%d", w->experts_hit, w->experts_total);
            printf("%6d %9.3f %9.3f %9.3f %9.3f %9.1f %9.3f %9.2f %10s %8d\n", w->batch,
                   w->mode_ms[MOEC_BENCH_GRAPH_DUAL], w->mode_ms[MOEC_BENCH_GRAPH_SINGLE],
                   w->mode_ms[MOEC_BENCH_EAGER_DUAL], w->mode_ms[MOEC_BENCH_EAGER_SINGLE],
                   w->bytes / 1e6, w->floor_ms, w->step_ms / w->floor_ms, experts,
                   r.launches_per_step[i]);
        }
    }
    return 0;
}

/* `moec serve MODEL_DIR`: the model compiled (CUDA) or interpreted (CPU)
 * now, then served as moec-serve serves a plan. */
static moec_status serve_open_model(const char *model_dir, const char *weights_dir,
                                    const moec_engine_options *opt, moec_engine_t **out)
{
    moec_model_t *m = NULL;
    moec_status st = moec_model_open(model_dir, &m);
    if (st == MOEC_OK)
        st = moec_engine_open(m, weights_dir, opt, out);
    moec_model_free(m); /* the engine keeps what it needs */
    return st;
}

/* ---- moec tokenize ---------------------------------------------------------- */

static const char *USAGE_TOKENIZE =
    "usage: moec tokenize MODEL_DIR [--no-special-tokens] < TEXT\n"
    "       moec tokenize MODEL_DIR --decode [--skip-special-tokens] < IDS\n"
    "\n"
    "Encodes the text on stdin (all of it, a final newline included) with\n"
    "MODEL_DIR/tokenizer.json and tokenizer_config.json as Hugging Face tokenizers\n"
    "does, and prints the ids on one line, comma-separated. Invalid UTF-8 is read\n"
    "as U+FFFD (docs/TOKENIZER.md). With --decode, reads ids separated by commas\n"
    "or whitespace and prints their text exactly, with no newline added.\n"
    "\n"
    "options:\n"
    "  --decode               ids to text instead of text to ids\n"
    "  --no-special-tokens    encode without what the post-processor adds (a BOS)\n"
    "  --skip-special-tokens  decode without the special tokens\n"
    "  -h, --help             this help\n";

/* All of stdin, malloc'd; NULL (errno set) when it cannot be read. */
static char *read_stdin(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, stdin);
        if (n < cap)
            break;
        char *grown = cap < ((size_t)1 << 31) ? realloc(buf, 2 * cap + 1) : NULL;
        if (!grown) {
            free(buf);
            errno = ENOMEM;
            return NULL;
        }
        buf = grown;
        cap *= 2;
    }
    if (buf && ferror(stdin)) {
        free(buf);
        return NULL;
    }
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

/* Ids separated by commas or whitespace; -1 with *bad at the text that is not one. */
static int parse_id_list(const char *s, int32_t **out, const char **bad)
{
    int n = 0, cap = 64;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    for (const char *p = s; ids;) {
        while (*p == ',' || isspace((unsigned char)*p))
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX ||
            (*end && *end != ',' && !isspace((unsigned char)*end))) {
            *bad = p;
            free(ids);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            int32_t *g = realloc(ids, (size_t)cap * sizeof *g);
            if (!g)
                free(ids);
            ids = g;
        }
        if (ids)
            ids[n++] = (int32_t)v;
        p = end;
    }
    *out = ids;
    return ids ? n : -1;
}

static int tokenize_encode(const moec_tokenizer_t *tok, const char *text, size_t len, int special)
{
    int32_t *ids = NULL;
    int n = 0;
    moec_status st = moec_tokenizer_encode(tok, text, len, special, &ids, &n);
    if (st != MOEC_OK)
        return lib_error(st);
    for (int i = 0; i < n; i++)
        printf(i ? ",%d" : "%d", (int)ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

static int tokenize_decode(const moec_tokenizer_t *tok, const char *in, size_t in_len,
                           int skip_special)
{
    /* the ids are read as a C string: the ones after a NUL would be dropped */
    const char *nul = memchr(in, '\0', in_len);
    if (nul) {
        fprintf(stderr, "moec: tokenize --decode: a NUL byte in the ids (byte %zu)\n",
                (size_t)(nul - in));
        return 2;
    }
    int32_t *ids = NULL;
    const char *bad = NULL;
    int n = parse_id_list(in, &ids, &bad);
    if (n < 0) {
        if (!bad)
            return lib_error(MOEC_ERR_OOM);
        int len = (int)strcspn(bad, ", \t\r\n");
        fprintf(stderr, "moec: tokenize --decode: bad token id at '%.*s' (want integers separated "
                        "by commas or spaces)\n", len > 20 ? 20 : len, bad);
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    moec_status st = moec_tokenizer_decode(tok, ids, n, skip_special, &text, &len);
    free(ids);
    if (st != MOEC_OK)
        return lib_error(st);
    fwrite(text, 1, len, stdout);
    free(text);
    return 0;
}

static int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL;
    int decode = 0, no_special = 0, skip_special = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a)) {
            fputs(USAGE_TOKENIZE, stdout);
            return 0;
        } else if (!strcmp(a, "--decode")) {
            decode = 1;
        } else if (!strcmp(a, "--no-special-tokens")) {
            no_special = 1;
        } else if (!strcmp(a, "--skip-special-tokens")) {
            skip_special = 1;
        } else if (a[0] == '-') {
            return usage_error(USAGE_TOKENIZE, "unknown option %s", a);
        } else if (!dir) {
            dir = a;
        } else {
            return usage_error(USAGE_TOKENIZE, "unexpected argument %s", a);
        }
    }
    if (!dir)
        return usage_error(USAGE_TOKENIZE, "%s", "missing MODEL_DIR");
    if (decode ? no_special : skip_special)
        return usage_error(USAGE_TOKENIZE, "%s", decode ? "--no-special-tokens is for encoding, not --decode"
                                                        : "--skip-special-tokens is for --decode");
    moec_tokenizer_t *tok = NULL;
    moec_status st = moec_tokenizer_open(dir, &tok);
    if (st != MOEC_OK)
        return lib_error(st);
    size_t len = 0;
    char *in = read_stdin(&len);
    int rc;
    if (!in) {
        fprintf(stderr, "moec: cannot read stdin: %s\n", strerror(errno));
        rc = 1;
    } else {
        rc = decode ? tokenize_decode(tok, in, len, skip_special)
                    : tokenize_encode(tok, in, len, !no_special);
    }
    free(in);
    moec_tokenizer_free(tok);
    return rc;
}

/* ---- moec chat-template ------------------------------------------------------ */

static const char *USAGE_CHAT_TEMPLATE =
    "usage: moec chat-template MODEL_DIR [--no-generation-prompt] [--enable-thinking 0|1] < JSON\n"
    "\n"
    "Renders the conversation on stdin with MODEL_DIR's chat template\n"
    "(chat_template.jinja, or tokenizer_config.json's chat_template) as\n"
    "transformers' apply_chat_template does, and prints the text exactly, with no\n"
    "newline added (docs/TOKENIZER.md, \"Chat templates\"). The JSON is a list of\n"
    "messages, [{\"role\": \"user\", \"content\": \"Hi\"}, ...] (any other fields of a\n"
    "message, such as tool_calls or reasoning_content, reach the template), or an\n"
    "object {\"messages\": [...], \"tools\": [...], ...} whose other members are\n"
    "variables of the template (DeepSeek-V3.1's \"thinking\": true).\n"
    "\n"
    "options:\n"
    "  --no-generation-prompt  end after the last message (default: end with the\n"
    "                          assistant's prompt, add_generation_prompt=True)\n"
    "  --enable-thinking 0|1   the template's enable_thinking (Qwen3); default:\n"
    "                          unset, the template's own default\n"
    "  -h, --help              this help\n";

static int cmd_chat_template(int argc, char **argv)
{
    const char *dir = NULL;
    moec_chat_options_t opts = {.add_generation_prompt = 1, .enable_thinking = -1};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a)) {
            fputs(USAGE_CHAT_TEMPLATE, stdout);
            return 0;
        } else if (!strcmp(a, "--no-generation-prompt")) {
            opts.add_generation_prompt = 0;
        } else if (!strcmp(a, "--enable-thinking")) {
            if (i + 1 >= argc)
                return usage_error(USAGE_CHAT_TEMPLATE, "%s needs a value", a);
            const char *v = argv[++i];
            if (strcmp(v, "0") && strcmp(v, "1"))
                return usage_error(USAGE_CHAT_TEMPLATE, "--enable-thinking: '%s' is not 0 or 1", v);
            opts.enable_thinking = v[0] - '0';
        } else if (a[0] == '-') {
            return usage_error(USAGE_CHAT_TEMPLATE, "unknown option %s", a);
        } else if (!dir) {
            dir = a;
        } else {
            return usage_error(USAGE_CHAT_TEMPLATE, "unexpected argument %s", a);
        }
    }
    if (!dir)
        return usage_error(USAGE_CHAT_TEMPLATE, "%s", "missing MODEL_DIR");
    moec_tokenizer_t *tok = NULL;
    moec_status st = moec_tokenizer_open(dir, &tok);
    if (st != MOEC_OK)
        return lib_error(st);
    size_t len = 0;
    char *in = read_stdin(&len), *text = NULL;
    int rc = 0;
    if (!in) {
        fprintf(stderr, "moec: cannot read stdin: %s\n", strerror(errno));
        rc = 1;
    } else if ((st = moec_chat_render_json(tok, in, len, &opts, &text)) != MOEC_OK) {
        rc = lib_error(st);
    } else {
        fputs(text, stdout);
    }
    free(text);
    free(in);
    moec_tokenizer_free(tok);
    return rc;
}

/* The command's exit code, made 1 when what it printed never reached stdout
 * (a full disk, a closed file): ids, text or IR lost must not pass for
 * success. */
static int finish_stdout(int rc)
{
    int e = fflush(stdout) != 0 ? errno : ferror(stdout) ? EIO : 0;
    if (e && rc == 0) {
        fprintf(stderr, "moec: cannot write stdout: %s\n", strerror(e));
        rc = 1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(USAGE_MAIN, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (is_help(cmd)) {
        fputs(USAGE_MAIN, stdout);
        return finish_stdout(0);
    }
    if (!strcmp(cmd, "compile"))
        return finish_stdout(cmd_compile(argc - 2, argv + 2));
    if (!strcmp(cmd, "dump-ir"))
        return finish_stdout(cmd_dump_ir(argc - 2, argv + 2));
    if (!strcmp(cmd, "run"))
        return finish_stdout(cmd_run(argc - 2, argv + 2));
    if (!strcmp(cmd, "bench"))
        return finish_stdout(cmd_bench(argc - 2, argv + 2));
    if (!strcmp(cmd, "serve")) /* its replies' writes are its own to check */
        return moec_serve_main(argc - 1, argv + 1, serve_open_model);
    if (!strcmp(cmd, "tokenize"))
        return finish_stdout(cmd_tokenize(argc - 2, argv + 2));
    if (!strcmp(cmd, "chat-template"))
        return finish_stdout(cmd_chat_template(argc - 2, argv + 2));
    return usage_error(USAGE_MAIN, "unknown command '%s'", cmd);
}
