/* ir_plan_file.h — the versioned plan file `moec compile` writes and the runtime
 * loads with no NVRTC call: the final IR text, per bucket the cubin and the
 * launch table, the memory plan (in the IR), and hashes of the config and of
 * every bound weight's name, shape and dtype, so that a plan is never run
 * against another checkpoint. A truncated, corrupt or newer file is an error
 * naming the file.
 *
 * Layout (little endian): "MOECPLAN", u32 format, u32 0, u64 header length,
 * the JSON header, blobs (IR text, cubins) at 16-byte aligned offsets the
 * header names, and a trailing FNV-1a 64 checksum of everything before it. */
#ifndef MOEC_IR_PLAN_FILE_H
#define MOEC_IR_PLAN_FILE_H

#include "ir/ir_plan.h"

/* 2: a plan per rank ("ranks"), tp and ep in the header, collective steps.
 * 3: the device sampler's step ends every bucket ("sampler"), reading and
 * writing the IR_INPUT_SAMPLE_* inputs. Format 1 and 2 files still read
 * (their requests sample on the host).
 * 4: a step's `plain` (a kernel launched without the programmatic-dependent
 * attribute), its twelfth number; files of formats 1 to 3 still read
 * (every kernel as the plan's pdl says).
 * 5: a step's `prio` (a kernel launched at the device's greatest priority),
 * its thirteenth number; files of formats 1 to 4 still read (none).
 * 6: the header's fp8_tiles may be 2 or 3 (IR_FP8_TILES_*: down's or
 * gate_up's expert weights alone in fragment tiles; a reader of format 5
 * took them for 0 and would address tiled weights as rows); files of
 * formats 1 to 5 still read.
 * 7: fp8_tiles may carry IR_FP8_TILES_LINEAR (4 to 7: dense linears'
 * weights in fragment tiles too, which a format-6 reader would refuse by
 * range: now by version); files of formats 1 to 6 still read. */
#define IR_PLAN_FORMAT 7

typedef struct ir_plan_meta {
    int format;
    char config_hash[17];  /* hex FNV-1a 64 of config.json (+ generation_config.json) */
    char weights_hash[17]; /* hex FNV-1a 64 over every bound tensor's name, dtype, shape */
    char moec_version[16];
    int tp, ep;            /* the split the plan was compiled for (pass shard); 0, 0:
                            * unsharded, one plan; else tp plans, one per rank */
} ir_plan_meta;

/* The plans a file holds: 1 when unsharded, else tp. */
int ir_plan_meta_ranks(const ir_plan_meta *meta);

/* Writes plan p (its module printed as IR text) to path, atomically
 * (a temporary file renamed into place). */
moec_status ir_plan_write(const char *path, const ir_plan *p, const ir_plan_meta *meta);
/* The same for every rank's plan, plans[r] for rank r (ir_plan_meta_ranks
 * of them); cubins the ranks share are stored once. */
moec_status ir_plan_write_ranks(const char *path, const ir_plan *const *plans,
                                const ir_plan_meta *meta);

/* Reads a plan: *module_out owns the parsed IR the plan points to (free it
 * after the plan). A plan split over several ranks is an error naming its
 * tp (ir_plan_read_ranks reads those). */
moec_status ir_plan_read(const char *path, ir_plan **out, ir_module **module_out,
                         ir_plan_meta *meta);
/* Reads every rank's plan and module into out[r], modules[r] (room for
 * IR_MAX_RANKS; ir_plan_meta_ranks(meta) of them), each module checked to
 * be its rank's (metas tp, ep and rank). */
moec_status ir_plan_read_ranks(const char *path, ir_plan **out, ir_module **modules,
                               ir_plan_meta *meta);

#endif
