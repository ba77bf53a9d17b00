/* moec_quantize.c — `moec compile --quantize fp8` (moec.h,
 * moec_quantize_fp8): a bf16 (f16, f32) checkpoint made block-scaled fp8
 * as DeepSeek-V3 publishes its own, written as a model folder of its own:
 * config.json with the quantization_config, generation_config.json copied,
 * and safetensors shards in which every linear the frontend quantizes for
 * that config (compiler/fe_quant.c decides, for this as for published
 * checkpoints) is F8_E4M3 beside its F32 weight_scale_inv, and every other
 * tensor is copied as it is. The folder is an fp8 checkpoint like any
 * other, so the CPU interpreter, plans and their checks read it as they
 * read DeepSeek-V3's: the GPU and the CPU run the same quantized weights.
 *
 * Each block of 128 x 128 (edge blocks partial) gets scale = amax / 448 (a
 * block of zeros: 1), and each weight the e4m3 code nearest to w / scale,
 * ties to even (moec_f32_to_f8e4m3). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file.h"
#include "common/json.h"
#include "compiler/api_internal.h"
#include "compiler/frontend.h"
#include "err.h"
#include "runtime/safetensors.h"
#include "runtime/weights.h"

#define QZ_BLOCK 128
#define QZ_SHARD_BYTES ((size_t)4 << 30) /* a shard is written once it holds this much */

/* A tensor waiting for its shard: its data owned (quantized here) or in the
 * source checkpoint's mapping. */
typedef struct qz_tensor {
    char *name;
    rt_st_dtype dtype;
    int rank;
    int64_t shape[RT_ST_MAX_RANK];
    const void *data;
    void *owned;
    size_t bytes;
} qz_tensor;

typedef struct qz_out {
    const char *dir; /* the folder being written (a temporary name) */
    qz_tensor *pend;
    int n_pend, cap_pend;
    size_t pend_bytes;
    int shards;
    char **seen; /* every tensor name added, so that a tensor two weights bind is written once */
    int n_seen, cap_seen;
    int n_quantized, n_copied;
} qz_out;

static void qz_pending_free(qz_out *o)
{
    for (int i = 0; i < o->n_pend; i++) {
        free(o->pend[i].name);
        free(o->pend[i].owned);
    }
    o->n_pend = 0;
    o->pend_bytes = 0;
}

static void qz_out_free(qz_out *o)
{
    qz_pending_free(o);
    free(o->pend);
    for (int i = 0; i < o->n_seen; i++)
        free(o->seen[i]);
    free(o->seen);
}

/* Whether name was added before; records it when not. -1: out of memory. */
static int qz_seen(qz_out *o, const char *name)
{
    for (int i = 0; i < o->n_seen; i++)
        if (!strcmp(o->seen[i], name))
            return 1;
    if (o->n_seen == o->cap_seen) {
        int cap = o->cap_seen ? 2 * o->cap_seen : 256;
        char **p = realloc(o->seen, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        o->seen = p;
        o->cap_seen = cap;
    }
    if (!(o->seen[o->n_seen] = strdup(name)))
        return -1;
    o->n_seen++;
    return 0;
}

/* Writes the pending tensors as the next shard, model-NNNNN.safetensors. */
static moec_status qz_flush(qz_out *o)
{
    if (o->n_pend == 0)
        return MOEC_OK;
    rt_st_write_tensor *w = calloc((size_t)o->n_pend, sizeof *w);
    if (!w)
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory writing %s", o->dir);
    for (int i = 0; i < o->n_pend; i++)
        w[i] = (rt_st_write_tensor){o->pend[i].name, o->pend[i].dtype, o->pend[i].rank,
                                    o->pend[i].shape, o->pend[i].data};
    char path[8400];
    snprintf(path, sizeof path, "%s/model-%05d.safetensors", o->dir, ++o->shards);
    moec_status st = rt_safetensors_write(path, w, o->n_pend);
    free(w);
    qz_pending_free(o);
    return st;
}

/* Queues one tensor (taking `owned`, which may be NULL); writes a shard
 * when enough is queued. */
static moec_status qz_add(qz_out *o, const char *name, rt_st_dtype dt, int rank,
                          const int64_t *shape, const void *data, void *owned)
{
    if (o->n_pend == o->cap_pend) {
        int cap = o->cap_pend ? 2 * o->cap_pend : 64;
        qz_tensor *p = realloc(o->pend, (size_t)cap * sizeof *p);
        if (!p) {
            free(owned);
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory writing %s", o->dir);
        }
        o->pend = p;
        o->cap_pend = cap;
    }
    qz_tensor *t = &o->pend[o->n_pend];
    memset(t, 0, sizeof *t);
    t->owned = owned;
    if (!(t->name = strdup(name))) {
        free(owned);
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory writing %s", o->dir);
    }
    o->n_pend++;
    t->dtype = dt;
    t->rank = rank;
    t->bytes = rt_st_dtype_size(dt);
    for (int d = 0; d < rank; d++) {
        t->shape[d] = shape[d];
        t->bytes *= (size_t)shape[d];
    }
    t->data = data;
    o->pend_bytes += t->bytes;
    return o->pend_bytes >= QZ_SHARD_BYTES ? qz_flush(o) : MOEC_OK;
}

/* Quantizes float tensor t [rows, cols] in blocks of block[0] x block[1]:
 * queues the codes under t's name and the scales under scale_name. */
static moec_status qz_quantize(qz_out *o, const rt_st_tensor *t, const int64_t *block,
                               const char *scale_name)
{
    if (t->rank != 2)
        return MOEC_ERR(MOEC_ERR_MISMATCH, "tensor '%s' in %s has rank %d; a quantized linear "
                        "is [out, in]", t->name, t->file, t->rank);
    int64_t rows = t->shape[0], cols = t->shape[1];
    int64_t sr = (rows + block[0] - 1) / block[0], sc = (cols + block[1] - 1) / block[1];
    size_t n = (size_t)(rows * cols);
    float *w = malloc((n ? n : 1) * sizeof *w);
    uint8_t *q = malloc(n ? n : 1);
    float *s = malloc((size_t)(sr * sc) * sizeof *s);
    moec_status st = w && q && s ? rt_tensor_read_f32(t, w)
                                 : MOEC_ERR(MOEC_ERR_OOM, "out of memory quantizing '%s'", t->name);
    for (size_t i = 0; st == MOEC_OK && i < n; i++)
        if (!isfinite(w[i]))
            st = MOEC_ERR(MOEC_ERR_MISMATCH,
                          "tensor '%s' in %s holds %s at element %zu ([%lld, %lld]): it cannot "
                          "be quantized",
                          t->name, t->file, isnan(w[i]) ? "nan" : "inf", i,
                          (long long)(i / (size_t)cols), (long long)(i % (size_t)cols));
    for (int64_t bi = 0; st == MOEC_OK && bi < sr; bi++)
        for (int64_t bj = 0; bj < sc; bj++) {
            int64_t r1 = (bi + 1) * block[0] < rows ? (bi + 1) * block[0] : rows;
            int64_t c1 = (bj + 1) * block[1] < cols ? (bj + 1) * block[1] : cols;
            float amax = 0.0f;
            for (int64_t r = bi * block[0]; r < r1; r++)
                for (int64_t c = bj * block[1]; c < c1; c++)
                    amax = fmaxf(amax, fabsf(w[r * cols + c]));
            float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
            s[bi * sc + bj] = scale;
            for (int64_t r = bi * block[0]; r < r1; r++)
                for (int64_t c = bj * block[1]; c < c1; c++)
                    q[r * cols + c] = moec_f32_to_f8e4m3(w[r * cols + c] / scale);
        }
    free(w);
    if (st != MOEC_OK) {
        free(q);
        free(s);
        return st;
    }
    int64_t sshape[2] = {sr, sc};
    o->n_quantized++;
    st = qz_add(o, t->name, RT_ST_F8_E4M3, 2, t->shape, q, q);
    if (st != MOEC_OK) {
        free(s);
        return st;
    }
    return qz_add(o, scale_name, RT_ST_F32, 2, sshape, s, s);
}

/* Every tensor weight v of the quantized module binds, from the source
 * checkpoint src: quantized when v is block-scaled, else copied. */
static moec_status qz_weight(qz_out *o, const rt_safetensors *src, const char *src_dir,
                             const ir_value *v)
{
    int count = v->bind.kind == IR_BIND_STACK ? v->bind.count : 1;
    int scaled = v->scale.block[0] > 0;
    for (int e = 0; e < count; e++) {
        char name[1024], sname[1024];
        if (ir_binding_tensor_name(&v->bind, e, name, sizeof name) ||
            (scaled && ir_binding_tensor_name(&v->scale.bind, e, sname, sizeof sname)))
            return MOEC_ERR(MOEC_ERR_INVALID_ARG, "weight %%%s: a tensor name is too long",
                            v->name);
        int seen = qz_seen(o, name);
        if (seen < 0)
            return MOEC_ERR(MOEC_ERR_OOM, "out of memory writing %s", o->dir);
        if (seen)
            continue;
        const rt_st_tensor *t = rt_safetensors_find(src, name);
        if (!t)
            return MOEC_ERR(MOEC_ERR_MISMATCH, "weight %%%s: tensor '%s' not found in %s",
                            v->name, name, src_dir);
        if (scaled) {
            MOEC_TRY(qz_quantize(o, t, v->scale.block, sname));
        } else {
            o->n_copied++;
            MOEC_TRY(qz_add(o, name, t->dtype, t->rank, t->shape, t->data, NULL));
        }
    }
    return MOEC_OK;
}

static moec_status qz_write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return MOEC_ERR(MOEC_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    int ok = fwrite(data, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    return ok ? MOEC_OK : MOEC_ERR(MOEC_ERR_IO, "cannot write %s: %s", path, strerror(errno));
}

/* dir/config.json: the source's text as it is (moec_json_object_append:
 * the folder must load in transformers too) with a quantization_config
 * (DeepSeek-V3's: fp8, e4m3, dynamic activations, blocks of 128 x 128)
 * last; its generation_config.json copied when it has one. */
static moec_status qz_write_config(const char *src_dir, const char *dir)
{
    char path[8400];
    char *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    MOEC_TRY(moec_file_read(path, MOEC_FILE_CONFIG_MAX, &text, &len));
    char member[256], *out = NULL;
    snprintf(member, sizeof member,
             "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
             "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [%d, %d]}",
             QZ_BLOCK, QZ_BLOCK);
    moec_status st = moec_json_object_append(text, len, member, path, &out);
    free(text);
    MOEC_TRY(st);
    snprintf(path, sizeof path, "%s/config.json", dir);
    st = qz_write_file(path, out, strlen(out));
    free(out);
    MOEC_TRY(st);
    snprintf(path, sizeof path, "%s/generation_config.json", src_dir);
    MOEC_TRY(moec_file_read_optional(path, MOEC_FILE_CONFIG_MAX, &text, &len));
    if (!text)
        return MOEC_OK;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    st = qz_write_file(path, text, len);
    free(text);
    return st;
}

/* out_dir is new, in a folder that exists and can be written. */
static moec_status qz_check_out(const char *out_dir)
{
    struct stat sb;
    if (stat(out_dir, &sb) == 0)
        return MOEC_ERR(MOEC_ERR_IO,
                        "cannot write the fp8 checkpoint %s: it exists (remove it, or name "
                        "another folder)",
                        out_dir);
    char parent[4096];
    moec_path_parent(out_dir, parent, sizeof parent);
    if (stat(parent, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(parent, W_OK) != 0)
        return MOEC_ERR(MOEC_ERR_IO,
                        "cannot write the fp8 checkpoint %s: %s is not a writable folder",
                        out_dir, parent);
    return MOEC_OK;
}

/* Removes what a failed run wrote into dir, and dir. */
static void qz_remove(const char *dir, int shards)
{
    char path[8400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    remove(path);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    remove(path);
    for (int i = 1; i <= shards; i++) {
        snprintf(path, sizeof path, "%s/model-%05d.safetensors", dir, i);
        remove(path);
    }
    rmdir(dir);
}

moec_status moec_quantize_fp8(const moec_model_t *model, const char *weights_dir,
                              const char *out_dir, moec_quantize_stats *stats)
{
    if (!model || !weights_dir || !out_dir)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "moec_quantize_fp8: NULL argument");
    const ir_module *src = moec_model_module(model);
    for (int i = 0; i < src->n_values; i++)
        if (src->values[i]->kind == IR_VALUE_WEIGHT && src->values[i]->scale.block[0] > 0)
            return MOEC_ERR(MOEC_ERR_INVALID_ARG,
                            "%s is quantized already (its config.json has a quantization_config): "
                            "nothing to quantize",
                            weights_dir);
    MOEC_TRY(qz_check_out(out_dir));
    /* the source checkpoint checked whole before anything is written */
    rt_weights *w = NULL;
    MOEC_TRY(rt_weights_open(src, weights_dir, &w));
    rt_weights_free(w);
    char tmp[4200];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp%ld", out_dir, (long)getpid()) >= sizeof tmp)
        return MOEC_ERR(MOEC_ERR_INVALID_ARG, "the folder name %.100s... is too long", out_dir);
    if (mkdir(tmp, 0755) != 0)
        return MOEC_ERR(MOEC_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    qz_out o = {.dir = tmp};
    ir_module *qm = NULL;
    rt_safetensors *st_src = NULL;
    moec_status st = qz_write_config(weights_dir, tmp);
    if (st == MOEC_OK)
        st = fe_model_load(tmp, &qm);
    if (st == MOEC_OK)
        st = rt_safetensors_open_dir(weights_dir, &st_src);
    for (int i = 0; st == MOEC_OK && i < qm->n_values; i++)
        if (qm->values[i]->kind == IR_VALUE_WEIGHT)
            st = qz_weight(&o, st_src, weights_dir, qm->values[i]);
    if (st == MOEC_OK)
        st = qz_flush(&o);
    if (st == MOEC_OK && rename(tmp, out_dir) != 0)
        st = MOEC_ERR(MOEC_ERR_IO, "cannot rename %s to %s: %s", tmp, out_dir, strerror(errno));
    if (st != MOEC_OK)
        qz_remove(tmp, o.shards);
    else if (stats)
        *stats = (moec_quantize_stats){o.n_quantized, o.n_copied, o.shards};
    qz_out_free(&o);
    rt_safetensors_free(st_src);
    ir_module_free(qm);
    return st;
}
