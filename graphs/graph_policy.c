/* graph_policy.c — when steps run from graphs: captured at bind unless the
 * caller asks for eager launches or MOEC_DISABLE_GRAPHS=1; one stream when
 * the caller or MOEC_SINGLE_STREAM=1 says so. */
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "graphs/graph.h"
#include "timer.h"

static int env_on(const char *name)
{
    const char *e = getenv(name);
    return e && *e && strcmp(e, "0");
}

int graph_disabled_by_env(void) { return env_on("MOEC_DISABLE_GRAPHS"); }

moec_status graph_bind(rt_cuda *c, int eager, int single_stream, graph_set **out,
                       double *capture_s)
{
    *out = NULL;
    *capture_s = 0;
    rt_cuda_set_single_stream(c, single_stream || env_on("MOEC_SINGLE_STREAM"));
    MOEC_TRY(graph_set_init(c, out));
    if (eager || graph_disabled_by_env())
        return MOEC_OK;
    double t0 = moec_now_s();
    MOEC_TRY(graph_capture(*out));
    *capture_s = moec_now_s() - t0;
    return MOEC_OK;
}
