/* CPU a rank uses while its communicator has no operation in flight: init, one small
 * allreduce (the lines path on one host) and a barrier, then S seconds of sleep between two
 * readings of the process's user+system time (getrusage: every thread, BCL's own included).
 * Prints one line per rank: "rank R idle S s: C ms CPU".
 * Build: cc -O2 -std=c99 -Iinclude bcl_idle_cpu.c -Ltarget/release -lbcl
 * Usage: mpirun -np N ./bcl_idle_cpu [S] */
#define _POSIX_C_SOURCE 200809L
#include "bcl.h"
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

static double cpu_ms(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

int main(int argc, char **argv) {
    bclComm_t comm;
    if (bclCommInitFromEnv(&comm) != bclSuccess) { fprintf(stderr, "init failed\n"); return 1; }
    int rank;
    bclCommUserRank(comm, &rank);
    double secs = argc > 1 ? atof(argv[1]) : 5.0;
    float x = 1.0f, y = 0.0f;
    if (bclAllReduce(&x, &y, 1, bclFloat32, bclSum, comm, NULL) != bclSuccess ||
        bclBarrier(comm, NULL) != bclSuccess) {
        fprintf(stderr, "rank %d: %s\n", rank, bclGetLastError(comm));
        return 1;
    }
    double before = cpu_ms();
    struct timespec ts = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
    nanosleep(&ts, NULL);
    double used = cpu_ms() - before;
    printf("rank %d idle %.1f s: %.1f ms CPU (%.2f%% of a core)\n", rank, secs, used, used / (secs * 10.0));
    bclBarrier(comm, NULL);
    bclCommDestroy(comm);
    return 0;
}
