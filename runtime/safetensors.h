/* safetensors.h — reading checkpoints in the safetensors format: one file or
 * a sharded set named by model.safetensors.index.json, mmapped. Every header
 * is validated (length, JSON, dtypes, shapes against byte sizes, offsets in
 * range and not overlapping) and every failure names the file and tensor. */
#ifndef MOEC_RT_SAFETENSORS_H
#define MOEC_RT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "moec_rt.h"

/* Every dtype the format names; moec computes with F32/F16/BF16 only. */
typedef enum rt_st_dtype {
    RT_ST_F32, RT_ST_F16, RT_ST_BF16,
    RT_ST_F64, RT_ST_I64, RT_ST_I32, RT_ST_I16, RT_ST_I8, RT_ST_U8, RT_ST_BOOL,
    RT_ST_F8_E4M3, RT_ST_F8_E5M2, RT_ST_U16, RT_ST_U32, RT_ST_U64,
    RT_ST_DTYPE_COUNT,
} rt_st_dtype;

#define RT_ST_MAX_RANK 8

typedef struct rt_st_tensor {
    const char *name;
    rt_st_dtype dtype;
    int rank;
    int64_t shape[RT_ST_MAX_RANK];
    const void *data;   /* inside the mmapped file */
    size_t nbytes;
    const char *file;   /* the file it lives in (path) */
} rt_st_tensor;

typedef struct rt_safetensors rt_safetensors;

/* Opens a model directory: model.safetensors.index.json if present (every
 * shard it names must exist and hold the tensors it maps to it), else the
 * single model.safetensors, else every *.safetensors file in it. */
moec_status rt_safetensors_open_dir(const char *dir, rt_safetensors **out);
/* Opens one file. */
moec_status rt_safetensors_open_file(const char *path, rt_safetensors **out);
void rt_safetensors_free(rt_safetensors *st);

/* NULL when absent. */
const rt_st_tensor *rt_safetensors_find(const rt_safetensors *st, const char *name);
int rt_safetensors_count(const rt_safetensors *st);
const rt_st_tensor *rt_safetensors_at(const rt_safetensors *st, int i);

const char *rt_st_dtype_name(rt_st_dtype dt); /* "BF16" */
size_t rt_st_dtype_size(rt_st_dtype dt);

/* Validates a whole safetensors image held in memory (8-byte header length,
 * JSON header, data section) without keeping anything: the fuzz target's
 * entry point, and the same code path rt_safetensors_open_file uses. */
moec_status rt_safetensors_check_buffer(const uint8_t *buf, size_t len, const char *filename);

/* Writes a single-file safetensors image (samples and tests). Tensors are
 * written in the order given, data packed back to back. */
typedef struct rt_st_write_tensor {
    const char *name;
    rt_st_dtype dtype;
    int rank;
    const int64_t *shape;
    const void *data;
} rt_st_write_tensor;
moec_status rt_safetensors_write(const char *path, const rt_st_write_tensor *tensors, int n);

#endif
