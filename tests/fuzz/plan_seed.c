/* plan_seed.c — `plan_seed PLAN OUT`: a seed for fuzz_plan_file from a plan
 * `moec compile` wrote: every bucket's cubin cut to its first 16 bytes (the
 * reader copies cubins without looking inside; at 170 kB they would be
 * nine tenths of each input, and of where mutations land), written back by
 * the plan writer so that the seed is in the current format. */
#include <stdio.h>

#include "ir/ir_plan_file.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: plan_seed PLAN OUT\n");
        return 2;
    }
    ir_plan *p = NULL;
    ir_module *m = NULL;
    ir_plan_meta meta;
    moec_status st = ir_plan_read(argv[1], &p, &m, &meta);
    if (st == MOEC_OK) {
        for (int b = 0; b < p->n_buckets; b++)
            if (p->buckets[b].cubin_size > 16)
                p->buckets[b].cubin_size = 16;
        st = ir_plan_write(argv[2], p, &meta);
        ir_plan_free(p);
        ir_module_free(m);
    }
    if (st != MOEC_OK) {
        fprintf(stderr, "plan_seed: %s\n", moec_last_error());
        return 1;
    }
    return 0;
}
