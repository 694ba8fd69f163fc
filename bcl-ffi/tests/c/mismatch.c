/* Two ranks call allreduce with different counts: both get bclMismatch naming the other
 * rank, the communicator is then poisoned (bclCommGetAsyncError, later calls), and abort
 * frees it. */
#include <bcl.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  bclComm_t comm;
  int rank;
  char peer[32];
  if (bclCommInitFromEnv(&comm) != bclSuccess || bclCommUserRank(comm, &rank) != bclSuccess) {
    fprintf(stderr, "init: %s\n", bclGetLastError(NULL));
    return 1;
  }
  float buf[12] = {0};
  bclResult_t r = bclAllReduce(buf, buf, rank == 0 ? 10 : 12, bclFloat32, bclSum, comm, NULL);
  snprintf(peer, sizeof peer, "rank %d (host", 1 - rank);
  if (r != bclMismatch || strstr(bclGetLastError(comm), peer) == NULL) {
    fprintf(stderr, "rank %d: got %d: %s\n", rank, r, bclGetLastError(comm));
    return 2;
  }
  bclResult_t async = bclSuccess;
  if (bclCommGetAsyncError(comm, &async) != bclSuccess || async != bclPoisoned) return 3;
  if (bclAllReduce(buf, buf, 12, bclFloat32, bclSum, comm, NULL) != bclPoisoned) return 4;
  if (bclCommAbort(comm) != bclSuccess) return 5;
  printf("rank %d OK\n", rank);
  return 0;
}
