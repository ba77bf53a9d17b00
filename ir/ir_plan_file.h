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

#define IR_PLAN_FORMAT 1

typedef struct ir_plan_meta {
    int format;
    char config_hash[17];  /* hex FNV-1a 64 of config.json (+ generation_config.json) */
    char weights_hash[17]; /* hex FNV-1a 64 over every bound tensor's name, dtype, shape */
    char moec_version[16];
} ir_plan_meta;

/* Writes plan p (its module printed as IR text) to path, atomically
 * (a temporary file renamed into place). */
moec_status ir_plan_write(const char *path, const ir_plan *p, const ir_plan_meta *meta);

/* Reads a plan: *module_out owns the parsed IR the plan points to (free it
 * after the plan). */
moec_status ir_plan_read(const char *path, ir_plan **out, ir_module **module_out,
                         ir_plan_meta *meta);

#endif
