/* serve_main.c — moec-serve: the generation service (serve.c) over plan
 * files, linked against the runtime library alone (libmoec_rt). */
#include "samples/serve.h"

int main(int argc, char **argv) { return moec_serve_main(argc, argv, NULL); }
