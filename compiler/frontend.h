/* frontend.h — config.json to the unfused IR, one op per module of the
 * Hugging Face reference implementation, for deepseek_v2, deepseek_v3,
 * qwen2_moe and qwen3_moe. Unsupported model types and field values are
 * errors naming the field. */
#ifndef MOEC_FE_FRONTEND_H
#define MOEC_FE_FRONTEND_H

#include "ir/ir.h"

/* Reads <model_dir>/config.json and, when the folder has one,
 * generation_config.json (the eos ids generation stops on), and builds the
 * module. Neither file may write a key twice. */
moec_status fe_model_load(const char *model_dir, ir_module **out);
/* The same from a config file of any name, with no generation config. */
moec_status fe_config_load(const char *path, ir_module **out);
/* Builds the module from config JSON text; filename is used in errors. */
moec_status fe_config_build(const char *json, const char *filename, ir_module **out);

#endif
