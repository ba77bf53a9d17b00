/* fuzz_plan_file.c — libFuzzer target: every input is a candidate plan file
 * for ir_plan_read, the reader `moec run PLAN` and moec_open_plan use. The
 * input is the file without its trailing checksum, which this target
 * appends (FNV-1a 64, as ir_plan_file.c writes it): otherwise nearly every
 * mutation would stop at the checksum and none would reach the header, the
 * IR text or the buckets. The reader takes a path, so the bytes go to a
 * memory file named by its /proc/self/fd path. The only acceptable outcomes
 * are MOEC_OK or an error status; a crash, a sanitizer report or a leak is
 * a bug. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ir/ir_plan_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int g_fd = -1;
static char g_path[64];

static uint64_t checksum(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_fd < 0) {
        g_fd = memfd_create("fuzz.moec", 0);
        if (g_fd < 0)
            __builtin_trap(); /* the harness cannot run */
        snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
    }
    uint64_t sum = checksum(data, size);
    if (ftruncate(g_fd, 0) != 0 || pwrite(g_fd, data, size, 0) != (ssize_t)size ||
        pwrite(g_fd, &sum, sizeof sum, (off_t)size) != (ssize_t)sizeof sum)
        __builtin_trap();
    ir_plan *p = NULL;
    ir_module *m = NULL;
    ir_plan_meta meta;
    moec_status st = ir_plan_read(g_path, &p, &m, &meta);
    if (st == MOEC_OK) {
        ir_plan_free(p);
        ir_module_free(m);
    } else if (st != MOEC_ERR_FORMAT && st != MOEC_ERR_UNSUPPORTED && st != MOEC_ERR_OOM) {
        __builtin_trap(); /* a bad plan is a format error, nothing else */
    }
    return 0;
}
