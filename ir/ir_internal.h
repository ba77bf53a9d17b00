/* ir_internal.h — what the ir/ files share with each other and nobody else:
 * the op table's queries, type and name validity, the message-returning
 * forms of inference and attribute checks (so the parser can put a file
 * position in front), and unchecked value/op constructors. */
#ifndef MOEC_IR_INTERNAL_H
#define MOEC_IR_INTERNAL_H

#include "ir/ir.h"

/* Largest static dimension, and largest product of a type's static dims. */
#define IR_DIM_MAX 2147483647LL
#define IR_NUMEL_MAX (1LL << 48)

/* Most parts of a CONCAT binding. */
#define IR_MAX_BIND_PARTS 64

/* Room for one error message built before it is recorded. */
#define IR_MSG_CAP 512

/* rank in [1, IR_MAX_RANK], a known dtype, every dim in [1, IR_DIM_MAX] but a
 * leading T where allow_t, product of dims <= IR_NUMEL_MAX. 1 when valid. */
int ir_type_valid(const ir_type *t, int allow_t);
/* 1 when t's first dim is T. */
int ir_type_has_t(const ir_type *t);

/* [A-Za-z0-9_.]+ */
int ir_value_name_valid(const char *s);
/* [A-Za-z_][A-Za-z0-9_]* : meta keys, attribute keys. */
int ir_key_valid(const char *s);

/* Operand count range and result count of kind; 0 when kind is unknown. */
int ir_op_arity(ir_op_kind kind, int *min_in, int *max_in, int *n_out);
/* 1 when key is an attribute of kind; its kind and whether it is required. */
int ir_op_attr_spec(ir_op_kind kind, const char *key, ir_attr_kind *akind, int *required);
/* The table's own copy of key (stable for the program's life), or NULL. */
const char *ir_op_attr_key(ir_op_kind kind, const char *key);
/* "%first_result: opname" (or "op #id: opname") into buf. */
void ir_op_label(const ir_op *op, char *buf, size_t cap);
/* Attributes known, of the right kind, unique, required ones present. */
moec_status ir_op_check_attrs(const ir_op *op, char *msg, size_t cap);
/* ir_op_infer with the message written to msg instead of recorded. */
moec_status ir_op_infer_msg(const ir_op *op, ir_type *out, char *msg, size_t cap);

/* No control characters (bytes < 0x20 or 0x7f): strings print on one line. */
int ir_string_valid(const char *s);
/* A weight's binding agrees with its type t (STACK: pattern has "{e}",
 * count >= 1 and equal to dim 0; CONCAT: parts are TENSOR or STACK, axis
 * within rank). The problem, without the value's name, into msg. */
moec_status ir_binding_check(const ir_binding *b, const ir_type *t, char *msg, size_t cap);

/* Weight w's block scale agrees with it: none, unless w is f8e4m3; else
 * blocks >= 1, w of rank >= 2 and a float or f8e4m3 dtype, and a scale
 * binding that mirrors w's and fits ir_block_scale_type(w). The problem,
 * without the value's name, into msg. */
moec_status ir_block_scale_check(const ir_value *w, char *msg, size_t cap);

/* Unchecked constructors: append a value / an op to m (no name checks). */
ir_value *ir_module_new_value(ir_module *m, const char *name, size_t name_len,
                              ir_value_kind kind);
ir_op *ir_module_new_op(ir_module *m, ir_op_kind kind);
/* The meta entry for key, cleared and given kind (appended, or the earlier
 * entry of that key reused); the error is recorded. */
moec_status ir_module_meta_slot(ir_module *m, const char *key, ir_attr_kind kind, ir_attr **out);
/* Deep copy of a binding into m's arena; 0 on success. */
int ir_binding_copy(ir_module *m, ir_binding *dst, const ir_binding *src);

/* A name -> value hash set with its own malloc'd storage. */
typedef struct ir_name_map {
    ir_value **slots;
    size_t cap, n;
} ir_name_map;

int ir_name_map_init(ir_name_map *h, size_t expect); /* 0 on success */
void ir_name_map_free(ir_name_map *h);
ir_value *ir_name_map_get(const ir_name_map *h, const char *name, size_t len);
int ir_name_map_put(ir_name_map *h, ir_value *v); /* 0 on success, -1 no memory */

#endif
