/* nan_model.c — t_write_nan_model for the shell tests:
 *   nan_model SRC DST [TENSOR ROW]
 * writes DST, the model in SRC with every weight NaN, or only row ROW of
 * TENSOR (see testlib.h). */
#include "testlib.h"

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: nan_model SRC DST [TENSOR ROW]\n");
        return 2;
    }
    t_write_nan_model(argv[1], argv[2], argc == 5 ? argv[3] : NULL, argc == 5 ? atoi(argv[4]) : 0);
    return 0;
}
