/* timer.h — wall-clock seconds from a monotonic clock, for progress lines
 * and the load/capture times moec reports. */
#ifndef MOEC_COMMON_TIMER_H
#define MOEC_COMMON_TIMER_H

double moec_now_s(void);

#endif
