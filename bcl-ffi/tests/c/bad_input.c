/* Every kind of bad input gives its code and a message naming the cause; nothing crashes and
 * nothing is written. Runs as a single rank. */
#include <bcl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;
#define EXPECT_CODE(call, code, word)                                                   \
  do {                                                                                  \
    bclResult_t r_ = (call);                                                            \
    const char* m_ = bclGetLastError(NULL);                                             \
    if (r_ != (code) || strstr(m_, (word)) == NULL) {                                   \
      fprintf(stderr, "%s: got %d (%s), want %d with '%s'\n", #call, r_, m_, code, word); \
      failures++;                                                                       \
    }                                                                                   \
  } while (0)

int main(void) {
  bclUniqueId id;
  bclComm_t comm, dead;
  float buf[4] = {1, 2, 3, 4}, out[4] = {0, 0, 0, 0};
  bclConfig_t config = BCL_CONFIG_INITIALIZER;
  config.initTimeoutSeconds = 5;

  EXPECT_CODE(bclGetVersion(NULL), bclInvalidArgument, "version is NULL");
  EXPECT_CODE(bclGetUniqueId(NULL), bclInvalidArgument, "uniqueId is NULL");
  if (bclGetUniqueId(&id) != bclSuccess) return 3;

  bclUniqueId bad;
  memset(&bad, 0, sizeof bad);
  strcpy(bad.internal, "not an id");
  EXPECT_CODE(bclCommInitRank(&comm, 1, bad, 0), bclInvalidArgument, "bad unique id");
  EXPECT_CODE(bclCommInitRank(&comm, 1, id, 3), bclInvalidArgument, "rank 3");
  EXPECT_CODE(bclCommInitRank(&comm, -2, id, 0), bclInvalidArgument, "nranks -2");
  EXPECT_CODE(bclCommInitRank(NULL, 1, id, 0), bclInvalidArgument, "comm is NULL");
  bclConfig_t wrong = config;
  wrong.magic = 7;
  EXPECT_CODE(bclCommInitRankConfig(&comm, 1, id, 0, &wrong), bclInvalidArgument, "BCL_CONFIG_INITIALIZER");
  wrong = config;
  wrong.device = "tpu:0";
  EXPECT_CODE(bclCommInitRankConfig(&comm, 1, id, 0, &wrong), bclInvalidArgument, "tpu");
  /* Numeric settings out of range: an error naming the field, never a crash or a panic. */
  const double bad_seconds[] = {1e300, -1.0, NAN, INFINITY, -INFINITY, 1e-9};
  for (size_t i = 0; i < sizeof bad_seconds / sizeof bad_seconds[0]; i++) {
    wrong = config;
    wrong.timeoutSeconds = bad_seconds[i];
    EXPECT_CODE(bclCommInitRankConfig(&comm, 1, id, 0, &wrong), bclInvalidArgument, "config.timeoutSeconds");
    wrong = config;
    wrong.initTimeoutSeconds = bad_seconds[i];
    EXPECT_CODE(bclCommInitRankConfig(&comm, 1, id, 0, &wrong), bclInvalidArgument, "config.initTimeoutSeconds");
  }
  wrong = config;
  wrong.socketsPerPeer = -3;
  EXPECT_CODE(bclCommInitRankConfig(&comm, 1, id, 0, &wrong), bclInvalidArgument, "config.socketsPerPeer='-3' is negative");
  wrong = config;
  wrong.socketsPerPeer = 1000;
  EXPECT_CODE(bclCommInitRankConfig(&comm, 1, id, 0, &wrong), bclInvalidArgument, "from 1 to 64");
  if (bclCommInitRankConfig(&comm, 1, id, 0, &config) != bclSuccess) {
    fprintf(stderr, "init: %s\n", bclGetLastError(NULL));
    return 3;
  }

  EXPECT_CODE(bclAllReduce(buf, out, 4, bclFloat32, bclSum, NULL, NULL), bclInvalidArgument, "comm is NULL");
  EXPECT_CODE(bclAllReduce(NULL, out, 4, bclFloat32, bclSum, comm, NULL), bclInvalidArgument, "sendbuff is NULL");
  EXPECT_CODE(bclAllReduce(buf, NULL, 4, bclFloat32, bclSum, comm, NULL), bclInvalidArgument, "recvbuff is NULL");
  EXPECT_CODE(bclAllReduce(buf, out, (size_t)-1, bclFloat32, bclSum, comm, NULL), bclInvalidArgument, "too large");
  EXPECT_CODE(bclAllReduce(buf, out, SIZE_MAX / 2, bclFloat64, bclSum, comm, NULL), bclInvalidArgument, "too large");
  EXPECT_CODE(bclAllReduce(buf, out, 4, (bclDataType_t)42, bclSum, comm, NULL), bclInvalidArgument, "datatype 42");
  EXPECT_CODE(bclAllReduce(buf, out, 4, bclFloat32, (bclRedOp_t)-1, comm, NULL), bclInvalidArgument, "op -1");
  EXPECT_CODE(bclAllReduce(buf, buf + 1, 3, bclFloat32, bclSum, comm, NULL), bclInvalidArgument, "overlap");
  EXPECT_CODE(bclAllReduce(buf, out, 4, bclFloat32, bclSum, comm, (bclStream_t)buf), bclInvalidArgument, "not a host stream");
  EXPECT_CODE(bclStreamQuery((bclStream_t)buf), bclInvalidArgument, "not a host stream");
  EXPECT_CODE(bclEventQuery((bclEvent_t)buf), bclInvalidArgument, "not an event");
  EXPECT_CODE(bclEventCreate(NULL), bclInvalidArgument, "event is NULL");
  EXPECT_CODE(bclBroadcast(buf, out, 4, bclFloat32, 5, comm, NULL), bclInvalidArgument, "rank 5 does not exist");
  EXPECT_CODE(bclSend(buf, 4, bclFloat32, 0, comm, NULL), bclInvalidArgument, "cannot address itself");
  EXPECT_CODE(bclRecv(out, 4, bclFloat32, -1, comm, NULL), bclInvalidArgument, "peer -1");
  EXPECT_CODE(bclGroupEnd(), bclInvalidArgument, "without bclGroupStart");
  EXPECT_CODE(bclCommHealthReport(comm, NULL, 0, NULL), bclInvalidArgument, "too small");
  for (int i = 0; i < 4; i++)
    if (out[i] != 0) { fprintf(stderr, "a refused call wrote recvbuff\n"); failures++; }

  /* The communicator still works after all that. */
  if (bclAllReduce(buf, out, 4, bclFloat32, bclSum, comm, NULL) != bclSuccess || out[3] != 4) {
    fprintf(stderr, "allreduce after bad input: %s\n", bclGetLastError(NULL));
    failures++;
  }
  bclResult_t async;
  if (bclCommGetAsyncError(comm, &async) != bclSuccess || async != bclSuccess) failures++;

  /* Destroyed and aborted handles are refused, not followed. */
  dead = comm;
  if (bclCommDestroy(comm) != bclSuccess) failures++;
  EXPECT_CODE(bclAllReduce(buf, out, 4, bclFloat32, bclSum, dead, NULL), bclInvalidArgument, "not a live communicator");
  EXPECT_CODE(bclCommDestroy(dead), bclInvalidArgument, "not a live communicator");
  EXPECT_CODE(bclCommCount((bclComm_t)(uintptr_t)0x1234560, &failures), bclInvalidArgument, "not a live communicator");
  if (bclGetUniqueId(&id) != bclSuccess || bclCommInitRankConfig(&comm, 1, id, 0, &config) != bclSuccess) return 3;
  if (bclCommAbort(comm) != bclSuccess) failures++;
  EXPECT_CODE(bclBarrier(comm, NULL), bclInvalidArgument, "not a live communicator");

  for (int c = 0; c <= bclNumResults; c++)
    if (bclGetErrorString((bclResult_t)c) == NULL) failures++;
  if (failures == 0) printf("bad input OK\n");
  return failures == 0 ? 0 : 1;
}
