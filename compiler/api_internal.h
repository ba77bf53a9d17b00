/* api_internal.h — what the library's own files (not its users) may ask of
 * the public handles. */
#ifndef MOEC_API_INTERNAL_H
#define MOEC_API_INTERNAL_H

#include "ir/ir.h"
#include "moec.h"

/* The model's unfused, verified module (owned by the model). */
const ir_module *moec_model_module(const moec_model_t *model);

#endif
