/* bclAllReduce float32 SUM timing harness: ../shared/tools/baselines/mpi_allreduce_bench.c
 * ported line for line onto bcl.h, so that BCL's times come from the same method as the
 * OpenMPI and Gloo figures they are compared with.
 *
 * Per message size:
 *   - W warm-up iterations, then ITERS timed iterations where ITERS is chosen
 *     so that ~T seconds are spent (clamped to [NMIN, NMAX]); all ranks agree.
 *   - each timed iteration: bclBarrier; t0; bclAllReduce; t1.
 *   - per iteration the MAX over ranks is taken (slowest rank = completion),
 *     and we report median / min / mean / p90 of those.
 *   - algbw = bytes / median_time ; busbw = algbw * 2*(n-1)/n  (nccl-tests).
 *   - result is verified after the timed loop (exact small-integer sums).
 * Out-of-place by default (sendbuf != recvbuf), -i for in place.
 *
 * The rank learns its place from its launcher (bclCommInitFromEnv: mpirun, srun, torchrun,
 * or BCL_RANK/BCL_WORLD_SIZE/BCL_ROOT); BCL_TRANSPORT picks the transport.
 * Build: cc -O3 -std=c99 -Iinclude bcl_allreduce_bench.c -Ltarget/release -lbcl -lm
 * Usage: mpirun -np N ./bcl_allreduce_bench [-s 8,16,64,...] [-t secs] [-n nmax] [-m nmin] [-w warm] [-i] [-l label] [-B]
 *   -B: no barrier between timed iterations (back-to-back; per-iteration times still max-reduced)
 */
#define _POSIX_C_SOURCE 200809L
#include "bcl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static bclComm_t comm;

static void check(bclResult_t r, const char *what) {
    if (r != bclSuccess) {
        fprintf(stderr, "%s: %s: %s\n", what, bclGetErrorString(r), bclGetLastError(comm));
        exit(1);
    }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmpd(const void *x, const void *y) { double a = *(const double *)x, b = *(const double *)y; return (a > b) - (a < b); }

static size_t parse_size(const char *s) {
    char *end; double v = strtod(s, &end);
    switch (*end) { case 'k': case 'K': v *= 1024; break; case 'm': case 'M': v *= 1048576; break; case 'g': case 'G': v *= 1073741824.0; break; }
    return (size_t)v;
}

static void *page_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, (bytes + 4095) / 4096 * 4096 + 4096) != 0) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}

int main(int argc, char **argv) {
    check(bclCommInitFromEnv(&comm), "bclCommInitFromEnv");
    int rank, n;
    check(bclCommUserRank(comm, &rank), "bclCommUserRank");
    check(bclCommCount(comm, &n), "bclCommCount");
    const char *sizes_str = "8,16,64,256,1K,4K,16K,64K,256K,1M,4M,16M,64M,256M";
    double T = 1.0; int nmax = 2000, nmin = 7, warm = 5, inplace = 0, nobar = 0; const char *label = "bcl";
    int c;
    while ((c = getopt(argc, argv, "s:t:n:m:w:il:B")) != -1) {
        switch (c) {
        case 's': sizes_str = optarg; break;
        case 't': T = atof(optarg); break;
        case 'n': nmax = atoi(optarg); break;
        case 'm': nmin = atoi(optarg); break;
        case 'w': warm = atoi(optarg); break;
        case 'i': inplace = 1; break;
        case 'l': label = optarg; break;
        case 'B': nobar = 1; break;
        default: if (!rank) fprintf(stderr, "bad option\n"); bclCommAbort(comm); return 2;
        }
    }
    size_t sizes[64]; int ns = 0; size_t maxb = 0;
    { char *dup = strdup(sizes_str), *tok, *save;
      for (tok = strtok_r(dup, ",", &save); tok && ns < 64; tok = strtok_r(0, ",", &save)) { sizes[ns] = parse_size(tok); if (sizes[ns] > maxb) maxb = sizes[ns]; ns++; }
      free(dup); }
    float *sbuf = page_alloc(maxb), *rbuf = page_alloc(maxb);
    memset(sbuf, 0, maxb); memset(rbuf, 0, maxb);
    double *tl = malloc(sizeof(double) * nmax), *tm = malloc(sizeof(double) * nmax);
    int version = 0; check(bclGetVersion(&version), "bclGetVersion");
    const char *transport = getenv("BCL_TRANSPORT");
    if (!rank) {
        printf("# label=%s ranks=%d inplace=%d T=%.2fs nmin=%d nmax=%d warm=%d barrier=%d\n# lib=BCL %d transport=%s\n", label, n, inplace, T, nmin, nmax, warm, !nobar, version, transport ? transport : "auto");
        printf("%12s %10s %6s %12s %12s %12s %12s %11s %11s %5s\n", "size_B", "count", "iters", "median_us", "min_us", "mean_us", "p90_us", "algbw_GB/s", "busbw_GB/s", "ok");
        fflush(stdout);
    }
    for (int si = 0; si < ns; si++) {
        size_t bytes = sizes[si], cnt = bytes / sizeof(float);
        if (cnt == 0) continue;
        for (size_t i = 0; i < cnt; i++) sbuf[i] = (float)((rank + 1) * (int)((i % 7) + 1));
        const void *sp = inplace ? (const void *)rbuf : (const void *)sbuf;
        /* warm-up; time it to choose the iteration count */
        double tw = 1e30; /* min warm-up time, ignoring the first when warm > 1 */
        for (int w = 0; w < warm; w++) {
            if (inplace) memcpy(rbuf, sbuf, bytes);
            check(bclBarrier(comm, NULL), "bclBarrier");
            double t0 = now();
            check(bclAllReduce(sp, rbuf, cnt, bclFloat32, bclSum, comm, NULL), "bclAllReduce");
            double dt = now() - t0;
            if ((w >= 1 || warm == 1) && dt < tw) tw = dt;
        }
        double twmax;
        check(bclAllReduce(&tw, &twmax, 1, bclFloat64, bclMax, comm, NULL), "bclAllReduce(max)");
        int iters = (twmax > 0 && twmax < 1e29) ? (int)(T / twmax) : nmax;
        if (iters > nmax) iters = nmax;
        if (iters < nmin) iters = nmin;
        check(bclBroadcast(&iters, &iters, 1, bclInt32, 0, comm, NULL), "bclBroadcast");
        if (nobar) check(bclBarrier(comm, NULL), "bclBarrier");
        for (int it = 0; it < iters; it++) {
            if (!nobar) check(bclBarrier(comm, NULL), "bclBarrier");
            double t0 = now();
            check(bclAllReduce(sp, rbuf, cnt, bclFloat32, bclSum, comm, NULL), "bclAllReduce");
            tl[it] = now() - t0;
        }
        /* verify: in-place result accumulates, so re-run once from a fresh copy */
        if (inplace) { memcpy(rbuf, sbuf, bytes); check(bclAllReduce(rbuf, rbuf, cnt, bclFloat32, bclSum, comm, NULL), "bclAllReduce"); }
        int bad = 0; float tri = (float)(n * (n + 1) / 2);
        for (size_t i = 0; i < cnt; i++) if (rbuf[i] != tri * (float)((i % 7) + 1)) { bad = 1; break; }
        int anybad;
        check(bclAllReduce(&bad, &anybad, 1, bclInt32, bclMax, comm, NULL), "bclAllReduce(check)");
        check(bclReduce(tl, tm, (size_t)iters, bclFloat64, bclMax, 0, comm, NULL), "bclReduce(times)");
        if (!rank) {
            double sum = 0; for (int it = 0; it < iters; it++) sum += tm[it];
            qsort(tm, iters, sizeof(double), cmpd);
            double med = (iters % 2) ? tm[iters / 2] : 0.5 * (tm[iters / 2 - 1] + tm[iters / 2]);
            double p90 = tm[(int)(0.9 * (iters - 1))];
            double alg = bytes / med / 1e9, bus = alg * 2.0 * (n - 1) / n;
            printf("%12zu %10zu %6d %12.2f %12.2f %12.2f %12.2f %11.3f %11.3f %5s\n", bytes, cnt, iters, med * 1e6, tm[0] * 1e6,
                   sum / iters * 1e6, p90 * 1e6, alg, bus, anybad ? "FAIL" : "ok");
            fflush(stdout);
        }
    }
    free(sbuf); free(rbuf); free(tl); free(tm);
    check(bclCommDestroy(comm), "bclCommDestroy");
    return 0;
}
