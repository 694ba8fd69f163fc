/* One rank of a multi-process run: collectives on a host stream return at once and run in
 * call order; events and bclStreamQuery tell when they have finished; bad use is refused.
 * Rank 0 joins each collective late, so the others can see their call return (and the
 * stream report bclInProgress) while it is still waiting for rank 0. Exit 0 and "rank R OK". */
#include <bcl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

static void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

int main(void) {
  bclComm_t comm;
  int rank, n;
  CHECK(bclCommInitFromEnv(&comm));
  CHECK(bclCommUserRank(comm, &rank));
  CHECK(bclCommCount(comm, &n));
  bclStream_t s;
  bclEvent_t first, all;
  CHECK(bclStreamCreate(&s));
  CHECK(bclEventCreate(&first));
  CHECK(bclEventCreate(&all));
  EXPECT(bclEventQuery(first) == bclSuccess, "an event never recorded is complete\n");

  enum { COUNT = 1 << 16 };
  float* x = malloc(sizeof(float) * COUNT);
  int* gathered = malloc(sizeof(int) * n);
  for (int i = 0; i < COUNT; i++) x[i] = 1.0f;
  int mine = rank * 3;

  if (rank == 0) sleep_ms(500);
  /* Three operations, each depending on the one before: x -> n -> n*n (in place twice), then
   * an allgather. They must run in this order. */
  CHECK(bclAllReduce(x, x, COUNT, bclFloat32, bclSum, comm, s));
  CHECK(bclEventRecord(first, s));
  CHECK(bclAllReduce(x, x, COUNT, bclFloat32, bclSum, comm, s));
  CHECK(bclAllGather(&mine, gathered, 1, bclInt32, comm, s));
  CHECK(bclBarrier(comm, s));
  CHECK(bclEventRecord(all, s));
  if (rank != 0) {
    /* Rank 0 is still asleep: nothing can have finished yet. */
    bclResult_t q = bclStreamQuery(s);
    EXPECT(q == bclInProgress, "rank %d: stream query while rank 0 sleeps = %d (%s)\n", rank, q,
           bclGetErrorString(q));
    EXPECT(bclEventQuery(first) == bclInProgress, "rank %d: event query\n", rank);
  }
  CHECK(bclEventSynchronize(first));
  CHECK(bclEventSynchronize(all));
  EXPECT(bclStreamQuery(s) == bclSuccess, "rank %d: stream done\n", rank);
  for (int i = 0; i < COUNT; i++)
    EXPECT(x[i] == (float)(n * n), "rank %d: x[%d] = %f, want %d\n", rank, i, x[i], n * n);
  for (int r = 0; r < n; r++)
    EXPECT(gathered[r] == r * 3, "rank %d: gathered[%d] = %d\n", rank, r, gathered[r]);

  /* A blocking call after queued work waits for it: the queued allreduce's result is what
   * the blocking one reduces. */
  for (int i = 0; i < COUNT; i++) x[i] = 1.0f;
  CHECK(bclAllReduce(x, x, COUNT, bclFloat32, bclSum, comm, s));
  CHECK(bclAllReduce(x, x, COUNT, bclFloat32, bclSum, comm, NULL));
  EXPECT(x[COUNT - 1] == (float)(n * n), "rank %d: blocking after queued = %f\n", rank,
         x[COUNT - 1]);
  CHECK(bclStreamSynchronize(s));

  /* Point to point on the stream: a ring exchange in a group (receive written first), then
   * outside one; each returns at once and the stream runs it in order. */
  enum { P2P = 1000 };
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  int* out = malloc(sizeof(int) * P2P);
  int* in = malloc(sizeof(int) * P2P);
  int* in2 = malloc(sizeof(int) * P2P);
  for (int i = 0; i < P2P; i++) {
    out[i] = rank * P2P + i;
    in[i] = in2[i] = -1;
  }
  if (rank == 0) sleep_ms(300);
  CHECK(bclGroupStart());
  CHECK(bclRecv(in, P2P, bclInt32, prev, comm, s));
  CHECK(bclSend(out, P2P, bclInt32, next, comm, s));
  CHECK(bclGroupEnd());
  CHECK(bclSend(out, P2P, bclInt32, prev, comm, s));
  CHECK(bclRecv(in2, P2P, bclInt32, next, comm, s));
  CHECK(bclEventRecord(all, s));
  if (rank == 1) {
    /* Rank 0, this rank's prev, is still asleep and has sent nothing: the receive into `in`
     * cannot have finished, yet every call above has returned. */
    bclResult_t q = bclEventQuery(all);
    EXPECT(q == bclInProgress, "rank %d: p2p on the stream while rank 0 sleeps = %d\n", rank, q);
  }
  CHECK(bclStreamSynchronize(s));
  for (int i = 0; i < P2P; i++) {
    EXPECT(in[i] == prev * P2P + i, "rank %d: in[%d] = %d from rank %d\n", rank, i, in[i], prev);
    EXPECT(in2[i] == next * P2P + i, "rank %d: in2[%d] = %d from rank %d\n", rank, i, in2[i],
           next);
  }
  free(out);
  free(in);
  free(in2);

  /* Bad use: checked at the call, nothing queued. */
  EXPECT(bclAllReduce(x, NULL, COUNT, bclFloat32, bclSum, comm, s) == bclInvalidArgument,
         "NULL recvbuff on a stream\n");
  EXPECT(bclAllReduce(x, x, COUNT, bclFloat32, bclSum, comm, (bclStream_t)0x1234) ==
             bclInvalidArgument,
         "a made-up stream\n");
  EXPECT(strstr(bclGetLastError(NULL), "not a host stream") != NULL, "%s\n",
         bclGetLastError(NULL));
  EXPECT(bclSend(x, 1, bclFloat32, (rank + 1) % n, comm, (bclStream_t)0x1234) ==
             bclInvalidArgument,
         "send on a made-up stream\n");
  EXPECT(bclEventRecord(all, NULL) == bclInvalidArgument, "record on NULL\n");
  EXPECT(bclStreamCreate(NULL) == bclInvalidArgument, "NULL out-parameter\n");
  CHECK(bclStreamSynchronize(s));

  CHECK(bclEventDestroy(first));
  CHECK(bclEventDestroy(all));
  CHECK(bclStreamDestroy(s));
  EXPECT(bclStreamQuery(s) == bclInvalidArgument, "a destroyed stream\n");
  CHECK(bclCommDestroy(comm));
  printf("rank %d OK\n", rank);
  free(x);
  free(gathered);
  return 0;
}
