/* The recovery loop in C, one rank of 4 processes (BCL_RANK, BCL_WORLD_SIZE, BCL_UNIQUE_ID):
 * split by parity (rank 3 takes no part: NULL); ranks 3 and 1 make a group by themselves
 * (bclCommCreateGroup: 0 and 2 do not call, and their bad calls are refused); rank 3 then dies without a word; the others'
 * allreduce fails, they shrink with BCL_SHRINK_FAILED and the next allreduce on 3 is correct;
 * rank 0 revokes the shrunk communicator and the survivors shrink it again, excluding no one.
 * Exit 0 and "rank R OK" on success. */
#include <bcl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

enum { COUNT = 4096 };

/* Sum of ones over `comm`: the communicator's size, in every element. */
static int allreduce_ones(bclComm_t comm, bclResult_t* result) {
  static float x[COUNT];
  int n;
  for (int i = 0; i < COUNT; i++) x[i] = 1.0f;
  *result = bclAllReduce(x, x, COUNT, bclFloat32, bclSum, comm, NULL);
  if (*result != bclSuccess) return 0;
  if (bclCommCount(comm, &n) != bclSuccess) return 0;
  for (int i = 0; i < COUNT; i++)
    if (x[i] != (float)n) return 0;
  return 1;
}

int main(void) {
  bclComm_t comm, half, shrunk, again, pair = NULL;
  bclResult_t r;
  int rank, n;
  CHECK(bclCommInitFromEnv(&comm));
  CHECK(bclCommUserRank(comm, &rank));

  /* Split: ranks 0 and 2 (color 0), rank 1 (color 1), rank 3 in none. */
  CHECK(bclCommSplit(comm, rank == 3 ? BCL_SPLIT_NOCOLOR : rank % 2, -rank, &half, NULL));
  /* A group of its members alone: ranks 3 and 1 become 0 and 1 of it. */
  if (rank == 1 || rank == 3) {
    const int members[2] = {3, 1};
    int me;
    CHECK(bclCommCreateGroup(comm, members, 2, 0, &pair, NULL));
    CHECK(bclCommUserRank(pair, &me));
    EXPECT(me == (rank == 3 ? 0 : 1), "rank %d: rank %d in the group\n", rank, me);
    EXPECT(allreduce_ones(pair, &r), "rank %d: allreduce on the group: %d\n", rank, r);
  } else {
    const int others[2] = {1, 3};
    EXPECT(bclCommCreateGroup(comm, others, 2, 0, &again, NULL) == bclInvalidArgument,
           "rank %d: a group without the caller accepted\n", rank);
    EXPECT(strstr(bclGetLastError(NULL), "not among the members") != NULL, "rank %d: %s\n", rank,
           bclGetLastError(NULL));
    EXPECT(bclCommCreateGroup(comm, NULL, 2, 0, &again, NULL) == bclInvalidArgument,
           "rank %d: NULL ranks accepted\n", rank);
  }
  if (rank == 3) {
    EXPECT(half == NULL, "rank 3: NOCOLOR should give NULL\n");
    printf("rank 3 OK\n");
    fflush(stdout);
    sleep(1); /* let the others finish the split before this rank's sockets go */
    _exit(0); /* dies: no destroy, no goodbye */
  }
  CHECK(bclCommCount(half, &n));
  EXPECT(n == (rank % 2 == 0 ? 2 : 1), "rank %d: half of %d\n", rank, n);
  EXPECT(allreduce_ones(half, &r), "rank %d: allreduce on the half: %d\n", rank, r);
  EXPECT(bclCommSplit(comm, -5, 0, &again, NULL) == bclInvalidArgument, "bad color accepted\n");
  EXPECT(bclCommShrink(comm, NULL, 0, NULL, NULL, BCL_SHRINK_FAILED) == bclInvalidArgument,
         "NULL newcomm accepted\n");
  EXPECT(bclCommShrink(comm, NULL, 0, &again, NULL, 64) == bclInvalidArgument, "bad flags\n");

  /* Allreduce until the dead rank is noticed. */
  while (allreduce_ones(comm, &r)) {
  }
  /* In flight when the verdict came: bclRemoteError; called after it: bclPoisoned. */
  EXPECT(r == bclRemoteError || r == bclPoisoned, "rank %d: expected a verdict, got %d: %s\n", rank, r,
         bclGetLastError(NULL));
  CHECK(bclCommShrink(comm, NULL, 0, &shrunk, NULL, BCL_SHRINK_ABORT | BCL_SHRINK_FAILED));
  CHECK(bclCommCount(shrunk, &n));
  EXPECT(n == 3, "rank %d: shrunk to %d\n", rank, n);
  EXPECT(allreduce_ones(shrunk, &r), "rank %d: allreduce after the shrink: %d\n", rank, r);
  CHECK(bclCommDestroy(comm));

  /* Revoke from rank 0; every survivor's next call fails naming it, then they shrink again. */
  if (rank == 0) CHECK(bclCommRevoke(shrunk, 0));
  while (allreduce_ones(shrunk, &r)) {
  }
  EXPECT(strstr(bclGetLastError(NULL), "revoked") != NULL, "rank %d: %s\n", rank,
         bclGetLastError(NULL));
  CHECK(bclCommShrink(shrunk, NULL, 0, &again, NULL, BCL_SHRINK_DEFAULT));
  EXPECT(allreduce_ones(again, &r), "rank %d: allreduce after the second shrink\n", rank);
  CHECK(bclCommDestroy(shrunk));
  CHECK(bclCommDestroy(again));
  CHECK(bclCommDestroy(half));
  if (pair != NULL) CHECK(bclCommDestroy(pair)); /* its other member, rank 3, is dead */
  printf("rank %d OK\n", rank);
  return 0;
}
