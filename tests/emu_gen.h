/* emu_gen.h — what the CPU emulator's generators (fp8_emu_gen.c,
 * attn_emu_gen.c) share: a generated kernel's text and parts of the
 * prologue's, as C++ for tests/cuda_emu.h. Each exits with a message where
 * the text lacks what it looks for. */
#ifndef MOEC_TEST_EMU_GEN_H
#define MOEC_TEST_EMU_GEN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cg.h"

/* The kernel text of `name` in src, the C++ the emulator compiles: a plain
 * function (namespaced by the caller) whose shared memory is its block's. */
static inline void put_kernel(FILE *f, const char *src, const char *name)
{
    char pat[320];
    snprintf(pat, sizeof pat, " %s(", name);
    const char *def = strstr(src, pat), *k0 = def;
    while (k0 && k0 > src && strncmp(k0, "extern \"C\" __global__ ", 22))
        k0--;
    const char *k1 = def ? strstr(def, "\n}\n") : NULL;
    if (!def || !k1 || k0 == src) {
        fprintf(stderr, "emu_gen: no kernel %s in the source\n", name);
        exit(1);
    }
    /* the dynamic shared memory (moec_smem or smem_raw): the emulated block's */
    static const char SMEM[] = "extern __shared__ __align__(16) unsigned char ";
    for (const char *p = k0 + 22; p < k1 + 3;) {
        const char *e = !strncmp(p, SMEM, sizeof SMEM - 1) ? strstr(p, "[];") : NULL;
        if (e && e - p < (long)sizeof SMEM + 16) {
            fprintf(f, "unsigned char *%.*s = emu_smem();", (int)(e - p - (sizeof SMEM - 1)),
                    p + sizeof SMEM - 1);
            p = e + 3;
        } else {
            fputc(*p++, f);
        }
    }
}

/* Sets (or, with unset, clears) a case's knobs: NAME=VALUE pairs apart by
 * spaces (env NULL: none). */
static inline void emu_knobs(const char *env, int unset)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", env ? env : "");
    char *save = NULL;
    for (char *kv = strtok_r(buf, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq)
            continue;
        *eq = '\0';
        if (unset)
            unsetenv(kv);
        else
            setenv(kv, eq + 1, 1);
    }
}

/* The prologue's text from `from` up to `to` (both must be there). */
static inline void put_prologue_part(FILE *f, const char *pro, const char *from, const char *to)
{
    const char *a = strstr(pro, from), *b = a ? strstr(a, to) : NULL;
    if (!b) {
        fprintf(stderr, "emu_gen: the prologue has no \"%s\"\n", from);
        exit(1);
    }
    fprintf(f, "%.*s\n", (int)(b - a), a);
}

/* main's start (usage: PROG OUT.inc): OUT.inc opened with its first line,
 * "// written by tests/PROG.c: WHAT", and the prologue's text in *pro;
 * NULL after a message, *rc then main's exit code. */
static inline FILE *emu_gen_open(int argc, char **argv, const char *prog, const char *what,
                                 moec_buf *pro, int *rc)
{
    *rc = 1;
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.inc\n", prog);
        *rc = 2;
        return NULL;
    }
    FILE *f = fopen(argv[1], "w");
    if (!f) {
        perror(argv[1]);
        return NULL;
    }
    cg_emit_prologue(pro);
    if (pro->oom) {
        fclose(f);
        moec_buf_free(pro);
        return NULL;
    }
    fprintf(f, "// written by tests/%s.c: %s\n", prog, what);
    return f;
}

/* c (zeroed) for module m, options o and bucket T, with the kernels of
 * every op of m that `want` takes emitted into it: 0, or -1 after a message
 * naming prog and case ci (c still to be freed). */
static inline int emu_gen_emit(cg_ctx *c, const ir_module *m, const cg_options *o, int T,
                               int (*want)(const ir_op *), const char *prog, int ci)
{
    memset(c, 0, sizeof *c);
    c->m = m;
    c->opt = o;
    c->T = T;
    for (int k = 0; k < m->n_ops; k++)
        if (want(m->ops[k]) && cg_emit_op(c, m->ops[k]) != MOEC_OK) {
            fprintf(stderr, "%s: case %d: %s\n", prog, ci, moec_last_error());
            return -1;
        }
    return 0;
}

#endif
