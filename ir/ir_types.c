/* ir_types.c — dtypes and static shapes with one symbolic token dimension:
 * names, sizes, element counts, equality, the "bf16[T, 64]" text form. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir_internal.h"

static const char *const DTYPE_NAMES[IR_DTYPE_COUNT] = {"f32", "f16", "bf16", "i32", "f8e4m3"};
static const size_t DTYPE_SIZES[IR_DTYPE_COUNT] = {4, 2, 2, 4, 1};

const char *ir_dtype_name(ir_dtype dt)
{
    if ((int)dt < 0 || dt >= IR_DTYPE_COUNT)
        return "?";
    return DTYPE_NAMES[dt];
}

int ir_dtype_from_name(const char *name, ir_dtype *out)
{
    if (!name)
        return -1;
    for (int i = 0; i < IR_DTYPE_COUNT; i++) {
        if (!strcmp(name, DTYPE_NAMES[i])) {
            if (out)
                *out = (ir_dtype)i;
            return 0;
        }
    }
    return -1;
}

size_t ir_dtype_size(ir_dtype dt)
{
    if ((int)dt < 0 || dt >= IR_DTYPE_COUNT)
        return 0;
    return DTYPE_SIZES[dt];
}

int64_t ir_type_numel(const ir_type *t, int64_t T)
{
    if (!t || t->rank < 0 || t->rank > IR_MAX_RANK)
        return 0;
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        int64_t d = t->dims[i];
        if (d == IR_DIM_T) {
            if (T <= 0)
                continue;
            d = T;
        }
        n *= d;
    }
    return n;
}

int ir_type_equal(const ir_type *a, const ir_type *b)
{
    if (!a || !b || a->dtype != b->dtype || a->rank != b->rank)
        return 0;
    if (a->rank < 0 || a->rank > IR_MAX_RANK)
        return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return 0;
    return 1;
}

void ir_type_format(const ir_type *t, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return;
    buf[0] = '\0';
    if (!t)
        return;
    size_t n = 0;
    int w = snprintf(buf, cap, "%s[", ir_dtype_name(t->dtype));
    if (w < 0)
        return;
    n = (size_t)w;
    int rank = t->rank < 0 ? 0 : t->rank > IR_MAX_RANK ? IR_MAX_RANK : t->rank;
    for (int i = 0; i < rank && n < cap; i++) {
        const char *sep = i ? ", " : "";
        if (t->dims[i] == IR_DIM_T)
            w = snprintf(buf + n, cap - n, "%sT", sep);
        else
            w = snprintf(buf + n, cap - n, "%s%" PRId64, sep, t->dims[i]);
        if (w < 0)
            return;
        n += (size_t)w;
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

int ir_type_has_t(const ir_type *t)
{
    return t && t->rank >= 1 && t->rank <= IR_MAX_RANK && t->dims[0] == IR_DIM_T;
}

int ir_type_valid(const ir_type *t, int allow_t)
{
    if (!t || (int)t->dtype < 0 || t->dtype >= IR_DTYPE_COUNT)
        return 0;
    if (t->rank < 1 || t->rank > IR_MAX_RANK)
        return 0;
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        int64_t d = t->dims[i];
        if (d == IR_DIM_T && i == 0 && allow_t)
            continue;
        if (d < 1 || d > IR_DIM_MAX)
            return 0;
        if (n > IR_NUMEL_MAX / d)
            return 0;
        n *= d;
    }
    return 1;
}
