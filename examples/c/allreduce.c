/* Allreduce from C. Start one process per rank with BCL_RANK, BCL_WORLD_SIZE and
 * BCL_UNIQUE_ID set (scripts/c-example.sh shows how). */
#include <bcl.h>
#include <stdio.h>

int main(void) {
  bclComm_t comm;
  int rank, nranks;
  if (bclCommInitFromEnv(&comm) != bclSuccess) {
    fprintf(stderr, "init: %s\n", bclGetLastError(NULL));
    return 1;
  }
  bclCommUserRank(comm, &rank);
  bclCommCount(comm, &nranks);
  float grads[1024];
  for (int i = 0; i < 1024; i++) grads[i] = (float)rank;
  bclResult_t r = bclAllReduce(grads, grads, 1024, bclFloat32, bclSum, comm, NULL);
  if (r != bclSuccess) {
    fprintf(stderr, "allreduce: %s\n", bclGetLastError(comm));
    return 1;
  }
  printf("rank %d of %d: grads[0] = %g (expected %g)\n", rank, nranks, grads[0],
         nranks * (nranks - 1) / 2.0);
  bclCommDestroy(comm);
  return grads[0] == nranks * (nranks - 1) / 2.0f ? 0 : 2;
}
