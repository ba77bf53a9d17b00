/* fuzz_jinja.c — libFuzzer target: every input is a chat template, lexed,
 * parsed and rendered (runtime/jinja*.c) for a conversation with a system
 * prompt, reasoning, tool calls, a tool result and tools, under bounds small
 * enough that each render ends quickly. The only acceptable outcomes are
 * MOEC_OK or the errors a template can earn (syntax, unsupported,
 * rendering, a bound); a crash, a sanitizer report, a leak or an internal
 * error is a bug. */
#include <stdint.h>
#include <stdlib.h>

#include "runtime/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char vars_json[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
    " {\"role\": \"user\", \"content\": \"<think>a</think>b \\u00e9 {{ x }}\"},"
    " {\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"r\", \"tool_calls\":"
    " [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"r\"}, {\"role\": \"user\", \"content\": \"\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}],"
    " \"documents\": null, \"add_generation_prompt\": true, \"enable_thinking\": false,"
    " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cJSON *vars;
    if (!vars && !(vars = cJSON_Parse(vars_json)))
        __builtin_trap();
    jinja_limits lim = {1 << 16, 16 << 20, 100000};
    char *out = NULL;
    size_t len;
    moec_status st = jinja_render((const char *)data, size, vars, &lim, &out, &len);
    free(out);
    if (st != MOEC_OK && st != MOEC_ERR_FORMAT && st != MOEC_ERR_UNSUPPORTED && st != MOEC_ERR_INVALID_ARG &&
        st != MOEC_ERR_CAPACITY && st != MOEC_ERR_OOM)
        __builtin_trap(); /* an internal error: a bug */
    return 0;
}
