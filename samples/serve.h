/* serve.h — the generation service (serve.c), shared by moec-serve, which
 * links the runtime library alone and serves plan files, and `moec serve`,
 * which can also compile and serve a model folder. */
#ifndef MOEC_SAMPLES_SERVE_H
#define MOEC_SAMPLES_SERVE_H

#include "moec_rt.h"

/* Makes an engine from the model folder model_dir (weights in weights_dir). */
typedef moec_status (*serve_model_opener)(const char *model_dir, const char *weights_dir,
                                          const moec_engine_options *opt, moec_engine_t **out);

/* The service's main: argv as `moec-serve PATH [options]`; open_model NULL
 * refuses anything but a plan file. Returns the exit code. */
int moec_serve_main(int argc, char **argv, serve_model_opener open_model);

#endif
