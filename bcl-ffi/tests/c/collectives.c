/* One rank of a multi-process run (BCL_RANK, BCL_WORLD_SIZE, BCL_UNIQUE_ID in the
 * environment): allreduce, allgather, reduce-scatter, broadcast, gather, scatter, alltoallv, allgatherv, reducescatterv and a grouped
 * ring exchange, every value checked. Exit 0 and "rank R OK" on success. */
#include <bcl.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

int main(void) {
  bclComm_t comm;
  int rank, n, version;
  CHECK(bclGetVersion(&version));
  EXPECT(version == BCL_VERSION_CODE, "library %d, header %d\n", version, BCL_VERSION_CODE);
  CHECK(bclCommInitFromEnv(&comm));
  CHECK(bclCommUserRank(comm, &rank));
  CHECK(bclCommCount(comm, &n));

  enum { COUNT = 100003 };
  float* a = malloc(sizeof(float) * COUNT);
  float* b = malloc(sizeof(float) * COUNT);
  for (int i = 0; i < COUNT; i++) a[i] = (float)(rank + i % 7);
  CHECK(bclAllReduce(a, b, COUNT, bclFloat32, bclSum, comm, NULL));
  CHECK(bclAllReduce(a, a, COUNT, bclFloat32, bclMax, comm, NULL)); /* in place */
  for (int i = 0; i < COUNT; i++) {
    float sum = (float)(n * (i % 7) + n * (n - 1) / 2), max = (float)(n - 1 + i % 7);
    EXPECT(b[i] == sum, "allreduce sum [%d] = %f, want %f\n", i, b[i], sum);
    EXPECT(a[i] == max, "allreduce max [%d] = %f, want %f\n", i, a[i], max);
  }

  int mine[3] = {rank, rank * 10, rank * 100};
  int* all = malloc(sizeof(int) * 3 * n);
  CHECK(bclAllGather(mine, all, 3, bclInt32, comm, NULL));
  for (int r = 0; r < n; r++)
    EXPECT(all[3 * r + 1] == r * 10, "allgather block %d = %d\n", r, all[3 * r + 1]);
  all[3 * rank] = -rank; /* in place: my block already sits at rank*count */
  CHECK(bclAllGather(all + 3 * rank, all, 3, bclInt32, comm, NULL));
  EXPECT(all[0] == 0 && all[3 * (n - 1)] == -(n - 1), "in-place allgather\n");

  double* full = malloc(sizeof(double) * 2 * n);
  double part[2];
  for (int i = 0; i < 2 * n; i++) full[i] = i + rank;
  CHECK(bclReduceScatter(full, part, 2, bclFloat64, bclSum, comm, NULL));
  for (int i = 0; i < 2; i++) {
    double want = n * (2.0 * rank + i) + n * (n - 1) / 2.0;
    EXPECT(part[i] == want, "reducescatter [%d] = %f, want %f\n", i, part[i], want);
  }

  long long v[4] = {rank, rank, rank, rank};
  CHECK(bclBroadcast(v, v, 4, bclInt64, n - 1, comm, NULL));
  EXPECT(v[3] == n - 1, "broadcast = %lld\n", v[3]);

  /* Gather to the last rank, out of place (NULL recvbuff elsewhere) and in place. */
  int root = n - 1, send2[2] = {rank, -rank};
  int* gathered = malloc(sizeof(int) * 2 * n);
  for (int i = 0; i < 2 * n; i++) gathered[i] = 12345;
  CHECK(bclGather(send2, rank == root ? gathered : NULL, 2, bclInt32, root, comm, NULL));
  if (rank == root)
    for (int r = 0; r < n; r++)
      EXPECT(gathered[2 * r] == r && gathered[2 * r + 1] == -r, "gather block %d = %d %d\n", r,
             gathered[2 * r], gathered[2 * r + 1]);
  if (rank == root) {
    gathered[2 * root] = 777; /* in place: the root's block already sits at root*count */
    CHECK(bclGather(gathered + 2 * root, gathered, 2, bclInt32, root, comm, NULL));
    EXPECT(gathered[2 * root] == 777 && gathered[0] == 0, "in-place gather\n");
  } else {
    CHECK(bclGather(send2, NULL, 2, bclInt32, root, comm, NULL));
  }

  /* Scatter from rank 0: rank r gets block r; in place on the root. */
  float* blocks = malloc(sizeof(float) * 3 * n);
  float got[3] = {-1, -1, -1};
  for (int i = 0; i < 3 * n; i++) blocks[i] = (float)(i * 2);
  CHECK(bclScatter(rank == 0 ? blocks : NULL, got, 3, bclFloat32, 0, comm, NULL));
  for (int i = 0; i < 3; i++)
    EXPECT(got[i] == (float)((3 * rank + i) * 2), "scatter [%d] = %f\n", i, got[i]);
  if (rank == 0)
    CHECK(bclScatter(blocks, blocks, 3, bclFloat32, 0, comm, NULL));
  else
    CHECK(bclScatter(NULL, got, 3, bclFloat32, 0, comm, NULL));
  EXPECT(rank != 0 || blocks[0] == 0.0f, "in-place scatter kept the root's block\n");
  free(gathered);
  free(blocks);

  /* All-to-all with per-pair counts: rank i sends (i + j) % 3 ints to rank j (some none). */
  size_t scounts[64], rcounts[64];
  size_t stotal = 0, rtotal = 0;
  for (int j = 0; j < n; j++) {
    scounts[j] = (size_t)((rank + j) % 3);
    rcounts[j] = (size_t)((j + rank) % 3);
    stotal += scounts[j];
    rtotal += rcounts[j];
  }
  int* vs = malloc(sizeof(int) * (stotal + 1));
  int* vr = malloc(sizeof(int) * (rtotal + 1));
  for (size_t at = 0, j = 0; j < (size_t)n; j++)
    for (size_t k = 0; k < scounts[j]; k++) vs[at++] = rank * 1000 + (int)j * 10 + (int)k;
  CHECK(bclAllToAllv(vs, scounts, vr, rcounts, bclInt32, comm, NULL));
  for (size_t at = 0, i = 0; i < (size_t)n; i++)
    for (size_t k = 0; k < rcounts[i]; k++, at++)
      EXPECT(vr[at] == (int)i * 1000 + rank * 10 + (int)k, "alltoallv from %zu [%zu] = %d\n", i, k,
             vr[at]);
  EXPECT(bclAllToAllv(vs, NULL, vr, rcounts, bclInt32, comm, NULL) == bclInvalidArgument,
         "NULL sendcounts\n");
  /* All-gather and reduce-scatter with rank r's block of r % 3 elements. */
  size_t vblocks[64], btotal = 0;
  for (int r = 0; r < n; r++) btotal += (vblocks[r] = (size_t)(r % 3));
  double mineg[3] = {rank + 0.5, rank + 0.25, rank + 0.125};
  double* ag = malloc(sizeof(double) * (btotal + 1));
  CHECK(bclAllGatherv(mineg, ag, vblocks, bclFloat64, comm, NULL));
  for (size_t at = 0, r = 0; r < (size_t)n; r++)
    for (size_t k = 0; k < vblocks[r]; k++, at++)
      EXPECT(ag[at] == mineg[k] - rank + (double)r, "allgatherv from %zu [%zu] = %f\n", r, k, ag[at]);
  double* rsin = malloc(sizeof(double) * (btotal + 1));
  for (size_t at = 0, r = 0; r < (size_t)n; r++)
    for (size_t k = 0; k < vblocks[r]; k++) rsin[at++] = (double)(rank + 10 * (int)k);
  double rsout[3] = {-1, -1, -1};
  CHECK(bclReduceScatterv(rsin, rsout, vblocks, bclFloat64, bclSum, comm, NULL));
  for (size_t k = 0; k < vblocks[rank]; k++) {
    double want = n * (n - 1) / 2.0 + n * 10.0 * (double)k;
    EXPECT(rsout[k] == want, "reducescatterv [%zu] = %f, want %f\n", k, rsout[k], want);
  }
  free(ag);
  free(rsin);
  free(vs);
  free(vr);

  /* Ring exchange in a group: everyone receives from the left before anyone's send would
   * otherwise be matched, which only completes because the group runs them together. */
  unsigned char out = (unsigned char)rank, in = 255;
  CHECK(bclGroupStart());
  CHECK(bclRecv(&in, 1, bclUint8, (rank + n - 1) % n, comm, NULL));
  CHECK(bclSend(&out, 1, bclUint8, (rank + 1) % n, comm, NULL));
  CHECK(bclGroupEnd());
  EXPECT(in == (unsigned char)((rank + n - 1) % n), "ring exchange got %d\n", in);

  char report[4096];
  size_t needed = 0;
  CHECK(bclCommHealthReport(comm, report, sizeof report, &needed));
  EXPECT(needed > 10 && report[0] == '{', "health report %s\n", report);

  CHECK(bclBarrier(comm, NULL));
  CHECK(bclCommFinalize(comm));
  CHECK(bclCommDestroy(comm));
  printf("rank %d OK\n", rank);
  free(a); free(b); free(all); free(full);
  return 0;
}
