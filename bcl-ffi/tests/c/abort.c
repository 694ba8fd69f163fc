/* bclCommAbort from another thread while this rank is inside allreduces: the call in flight,
 * here and on the other rank, returns bclRemoteError with the verdict naming rank 0 (or, when
 * the abort lands between two calls, the next call is refused). */
#define _POSIX_C_SOURCE 200809L
#include <bcl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bclComm_t comm;

static void* abort_soon(void* unused) {
  (void)unused;
  struct timespec pause = {0, 300 * 1000 * 1000};
  nanosleep(&pause, NULL);
  bclResult_t r = bclCommAbort(comm);
  return r == bclSuccess ? NULL : (void*)1;
}

int main(void) {
  int rank;
  if (bclCommInitFromEnv(&comm) != bclSuccess || bclCommUserRank(comm, &rank) != bclSuccess) {
    fprintf(stderr, "init: %s\n", bclGetLastError(NULL));
    return 1;
  }
  pthread_t aborter;
  if (rank == 0 && pthread_create(&aborter, NULL, abort_soon, NULL) != 0) return 2;
  size_t count = 1 << 18;
  float* buf = calloc(count, sizeof(float));
  if (buf == NULL) return 3;
  bclResult_t r;
  long done = 0;
  while ((r = bclAllReduce(buf, buf, count, bclFloat32, bclSum, comm, NULL)) == bclSuccess) done++;
  const char* why = bclGetLastError(comm);
  /* In flight: bclRemoteError with the verdict. Between two calls: rank 0's comm is gone
   * (bclInvalidArgument), rank 1's is poisoned by the verdict (bclPoisoned). */
  int named = strstr(why, "rank 0 (host") != NULL && strstr(why, "aborted the communicator") != NULL;
  int ok = (r == bclRemoteError && named) || (r == bclPoisoned && named) ||
           (rank == 0 && r == bclInvalidArgument && strstr(why, "not a live communicator") != NULL);
  if (!ok || done == 0) {
    fprintf(stderr, "rank %d after %ld allreduces: got %d: %s\n", rank, done, r, why);
    return 4;
  }
  if (rank == 0) {
    void* failed;
    if (pthread_join(aborter, &failed) != 0 || failed != NULL) return 5;
  } else if (bclCommDestroy(comm) != bclSuccess) {
    return 6;
  }
  free(buf);
  printf("rank %d OK\n", rank);
  return 0;
}
