/* fuzz_config.c — libFuzzer target: every input is a candidate config.json
 * for fe_config_build, the frontend's reader behind `moec compile`, `moec
 * run` and moec_model_open (fe_model_load reads the file and calls it). A
 * config it accepts is built into the IR and verified, as a real one is.
 * The only acceptable outcomes are MOEC_OK or an error status; a crash, a
 * sanitizer report or a leak is a bug. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1); /* the reader takes NUL-terminated text */
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    ir_module *m = NULL;
    moec_status st = fe_config_build(text, "fuzz/config.json", &m);
    free(text);
    if (st == MOEC_OK)
        ir_module_free(m);
    else if (st != MOEC_ERR_FORMAT && st != MOEC_ERR_UNSUPPORTED && st != MOEC_ERR_OOM)
        __builtin_trap(); /* a bad config is a format or unsupported error, nothing else */
    return 0;
}
