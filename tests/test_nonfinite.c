/* test_nonfinite.c — non-finite logits on the CPU (t_check_nonfinite): a
 * checkpoint of NaNs, or one NaN embedding row, is an error naming the step
 * and position in a session, and in an engine step naming the token, its
 * slot and position, with next_out -1 for exactly the tokens hit and the
 * other sequences going on. gpu_engine runs the same checks on CUDA. */
#include "testlib.h"

int main(void)
{
    t_check_nonfinite(MOEC_BACKEND_CPU);
    return t_finish("test_nonfinite");
}
