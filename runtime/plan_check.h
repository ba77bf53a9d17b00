/* plan_check.h — the checkpoint hashes of a plan file's meta, and the
 * check that a plan runs only against the checkpoint it was compiled for. */
#ifndef MOEC_RT_PLAN_CHECK_H
#define MOEC_RT_PLAN_CHECK_H

#include "ir/ir_plan_file.h"

/* Hashes for the meta: the bytes of config.json and, when the folder has
 * one, generation_config.json (its eos ids); the name, dtype and shape of
 * every checkpoint tensor m binds (block scales included), as the
 * checkpoint in dir has them. */
moec_status rt_hash_config(const char *model_dir, char out[17]);
moec_status rt_hash_weights(const ir_module *m, const char *model_dir, char out[17]);

/* Checks that meta was made for the checkpoint in model_dir (both hashes);
 * MOEC_ERR_MISMATCH naming the plan file and the directory otherwise. */
moec_status rt_plan_check_checkpoint(const ir_plan_meta *meta, const ir_module *m,
                                     const char *plan_path, const char *model_dir);

#endif
