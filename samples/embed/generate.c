/* generate.c — the smallest service: load a compiled plan (moec compile)
 * with the runtime library alone (libmoec_rt, moec_rt.h: no compiler, no
 * NVRTC) and greedily generate from token ids.
 *
 *   generate PLAN WEIGHTS_DIR N_NEW ID [ID...]
 *
 * prints the generated ids on one line. Built against an installed moec
 * (find_package(moec) or pkg-config moec_rt); see samples/README.md. */
#include <stdio.h>
#include <stdlib.h>

#include <moec_rt.h>

static int fail(const char *what)
{
    fprintf(stderr, "generate: %s: %s\n", what, moec_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: generate PLAN WEIGHTS_DIR N_NEW ID [ID...]\n");
        return 2;
    }
    int n_new = atoi(argv[3]), n = argc - 4;
    int32_t *ids = malloc((size_t)(n + n_new) * sizeof *ids);
    if (!ids || n_new < 1)
        return 2;
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)atoi(argv[4 + i]);
    moec_session_t *s;
    if (moec_session_init_plan(argv[1], argv[2], n + n_new, &s) != MOEC_OK)
        return fail(argv[1]);
    int vocab = moec_session_vocab_size(s);
    float *logits = malloc((size_t)n * (size_t)vocab * sizeof *logits);
    int rc = 0, fed = n; /* the prompt first, then each new token */
    for (int k = 0; logits && k < n_new && !rc; k++) {
        if (moec_session_forward(s, ids + (k ? n + k - 1 : 0), k ? 1 : fed, logits) != MOEC_OK) {
            rc = fail("forward");
            break;
        }
        const float *row = logits + (size_t)(k ? 0 : fed - 1) * (size_t)vocab;
        int32_t best = 0;
        for (int v = 1; v < vocab; v++)
            if (row[v] > row[best])
                best = v;
        ids[n + k] = best;
        printf("%s%d", k ? " " : "", best);
    }
    printf("\n");
    free(logits);
    free(ids);
    moec_session_free(s);
    return rc;
}
