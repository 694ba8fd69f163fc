/*
 * bcl.h: the C interface of BCL, a collective communication library for clusters whose
 * accelerators come from several vendors. Shaped like nccl.h: a NCCL user should find every
 * call where they expect it, under the `bcl` prefix.
 *
 * Conventions
 *  - C99. Every function returns a bclResult_t; output parameters come first.
 *  - Handles are opaque. A bclComm_t is a number BCL looks up, never a pointer it follows:
 *    a destroyed or invented handle gives bclInvalidArgument, not a crash.
 *  - On failure, bclGetLastError() returns a message naming the cause (rank, host, device,
 *    link and operation where they apply), valid until the next failing call on the thread.
 *  - Streams and buffers: with the cpu and sim backends, buffers are host memory, and a
 *    call with `stream` NULL completes before it returns; with a host stream
 *    (bclStreamCreate, "Host streams" below) a collective is queued and returns at once.
 *    With the cuda backend
 *    (config.device or BCL_DEVICE "cuda:N", a libbcl built with the `cuda` feature), buffers
 *    are device pointers of that GPU (checked: a host pointer is bclInvalidArgument) and
 *    `stream` a cudaStream_t (NULL: the legacy default stream): as in NCCL, a collective or
 *    barrier starts after the work already on the stream, the stream's later work waits for
 *    it, and the call returns at once (the stream copies the data through pinned host
 *    memory; BCL's progress thread makes no CUDA call, so blocking on the stream right away
 *    is fine). A failure poisons the communicator (bclCommGetAsyncError). The buffers must
 *    stay allocated until the stream has passed the call.
 *    bclSend/bclRecv of GPU memory are not implemented yet (bclInvalidArgument says so).
 *  - Thread safety: different communicators may be used from different threads at once;
 *    calls on one communicator from several threads run one after another, in lock order.
 *  - Errors of kind bclLinkError, bclMismatch, bclTimeout, bclDeviceError and
 *    bclInternalError poison the communicator: later calls on it return bclPoisoned. Destroy
 *    it (or abort it) and create a new one.
 *  - What the codes mean for every collective and send/recv below: bclInvalidArgument: a NULL
 *    or dead comm, a NULL buffer with a non-zero count, a count whose byte size overflows,
 *    a datatype/op/root/peer out of range, overlapping buffers that are not in place, a
 *    stream on a cpu or sim communicator that is not a host stream (nothing was sent or
 *    written); bclMismatch: a peer's message has another
 *    size (ranks passed different counts or datatypes); bclLinkError: a peer's connection
 *    broke (the message names it); bclTimeout: no progress within the operation timeout (the
 *    message names the ranks waited for); bclPoisoned: an earlier failure broke the
 *    communicator.
 */
#ifndef BCL_H_
#define BCL_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BCL_MAJOR 0
#define BCL_MINOR 1
#define BCL_PATCH 0
#define BCL_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))
#define BCL_VERSION_CODE BCL_VERSION(BCL_MAJOR, BCL_MINOR, BCL_PATCH)

/* Opaque communicator handle. */
typedef struct bclComm* bclComm_t;
/* Stream handle: NULL with the cpu and sim backends. */
typedef void* bclStream_t;
/* A point on a host stream (bclEventRecord). */
typedef void* bclEvent_t;

#define BCL_UNIQUE_ID_BYTES 128
/* Rendezvous id made by bclGetUniqueId on one rank and given to all: NUL-padded text
 * "bcl://IP:PORT/SECRET" (printable, so launchers may pass it in an environment variable). */
typedef struct {
  char internal[BCL_UNIQUE_ID_BYTES];
} bclUniqueId;

/* One code per kind of failure (one to one with the library's error variants). */
typedef enum {
  bclSuccess = 0,
  bclInvalidArgument = 1,   /* the caller passed something wrong; nothing was done */
  bclBootstrapTimeout = 2,  /* some ranks never arrived; the message lists them */
  bclBootstrapError = 3,    /* rendezvous store unreachable or handshake refused */
  bclLinkError = 4,         /* a link to a peer failed (peer died, network error) */
  bclMismatch = 5,          /* ranks disagree on an operation (count or datatype) */
  bclTimeout = 6,           /* an operation timed out; the message names who was awaited */
  bclDeviceError = 7,       /* the device refused an operation */
  bclPoisoned = 8,          /* the communicator is unusable after an earlier error */
  bclUnavailable = 9,       /* a backend or transport is not available */
  bclInternalError = 10,    /* a BCL bug (a caught panic included) */
  bclRemoteError = 11,      /* another rank died, hung, lost its link or aborted: the message
                               (bclGetLastError) is the verdict naming it and the cause */
  bclExcluded = 12,         /* the other survivors of a shrink left this rank out */
  bclInProgress = 13,       /* not an error: a host stream's or event's operations are still
                               running (bclStreamQuery, bclEventQuery) */
  bclNumResults = 14
} bclResult_t;

/* Element types: NCCL's names and numbers. */
typedef enum {
  bclInt8 = 0, bclChar = 0,
  bclUint8 = 1,
  bclInt32 = 2, bclInt = 2,
  bclUint32 = 3,
  bclInt64 = 4,
  bclUint64 = 5,
  bclFloat16 = 6, bclHalf = 6,
  bclFloat32 = 7, bclFloat = 7,
  bclFloat64 = 8, bclDouble = 8,
  bclBfloat16 = 9,
  bclNumTypes = 10
} bclDataType_t;

/* Reductions: NCCL's names and numbers. fp16/bf16 compute each step in fp32 and round back;
 * integer sums and products wrap; avg is a sum divided once by the number of ranks. */
typedef enum {
  bclSum = 0,
  bclProd = 1,
  bclMax = 2,
  bclMin = 3,
  bclAvg = 4,
  bclNumOps = 5
} bclRedOp_t;

#define BCL_CONFIG_MAGIC 0xBC1C0F16u
/* Communicator settings. Always start from BCL_CONFIG_INITIALIZER; zero/NULL fields keep the
 * default (and BCL_* environment variables still apply first). */
typedef struct {
  size_t size;                /* sizeof(bclConfig_t) */
  unsigned int magic;         /* BCL_CONFIG_MAGIC */
  unsigned int version;       /* BCL_VERSION_CODE */
  const char* device;         /* "cpu" (default), "sim", "sim:copy=GBPS:reduce=GBPS", "cuda:N" */
  const char* transport;      /* "auto" (default: shared memory to ranks on this host, tcp to
                                 the others), "tcp" or "shm" (every rank on this host) */
  int socketsPerPeer;         /* TCP connections per peer; 0: default (2) */
  double initTimeoutSeconds;  /* how long init waits for every rank; 0: default (60) */
  double timeoutSeconds;      /* how long one collective may take; 0: default (300) */
} bclConfig_t;
#define BCL_CONFIG_INITIALIZER \
  { sizeof(bclConfig_t), BCL_CONFIG_MAGIC, BCL_VERSION_CODE, NULL, NULL, 0, 0.0, 0.0 }

/* bclGetVersion: *version = BCL_VERSION_CODE of the library (compare with the header's).
 * version: must not be NULL (bclInvalidArgument). */
bclResult_t bclGetVersion(int* version);

/* bclGetUniqueId: a fresh id on the calling rank (normally rank 0), listening address from
 * BCL_BIND_IP (default 127.0.0.1) on a free port. Give the same id to every rank.
 * uniqueId: must not be NULL. */
bclResult_t bclGetUniqueId(bclUniqueId* uniqueId);

/* bclCommInitRank: join the communicator `commId` as `rank` of `nranks`; blocks until every
 * rank has joined or the init timeout (BCL_INIT_TIMEOUT_S, default 60 s) passes, then fails
 * with bclBootstrapTimeout naming the missing ranks. Rank 0 serves the rendezvous.
 * comm: must not be NULL; receives the handle. Thread safety: one call per rank. */
bclResult_t bclCommInitRank(bclComm_t* comm, int nranks, bclUniqueId commId, int rank);

/* bclCommInitRankConfig: as bclCommInitRank, with settings. config may be NULL (defaults);
 * otherwise it must come from BCL_CONFIG_INITIALIZER (size, magic and version are checked). */
bclResult_t bclCommInitRankConfig(bclComm_t* comm, int nranks, bclUniqueId commId, int rank,
                                  const bclConfig_t* config);

/* bclCommInitFromEnv: rank and size from the launcher (BCL_RANK or RANK, OMPI_COMM_WORLD_RANK,
 * PMI_RANK, SLURM_PROCID; BCL_WORLD_SIZE or WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE,
 * SLURM_NTASKS) and the id from BCL_UNIQUE_ID (the text of a bclUniqueId).
 * comm: must not be NULL. */
bclResult_t bclCommInitFromEnv(bclComm_t* comm);

/* bclCommFinalize: completes outstanding operations (with NULL streams there are none left
 * when a call returns). The handle stays valid until bclCommDestroy. */
bclResult_t bclCommFinalize(bclComm_t comm);

/* bclCommDestroy: frees the communicator; its handle becomes invalid (using it again gives
 * bclInvalidArgument). Queued sends are flushed for up to 2 s. */
bclResult_t bclCommDestroy(bclComm_t comm);

/* bclCommAbort: fails every operation in flight on this communicator, here and on every other
 * rank (they get bclRemoteError with a verdict naming this rank), then frees it without waiting
 * for peers. May be called from another thread while a collective runs on `comm`. */
bclResult_t bclCommAbort(bclComm_t comm);

/* ---- Communicator life cycle: split, revoke, shrink, grow (NCCL's shapes) ----
 * Each new communicator is independent of its parent: its own sequence numbers, health
 * channel, flight recorder and connections, and a secret derived from the parent's and its
 * exact membership, so no message of the parent (or of a rank left out) can reach it. It keeps
 * the parent's settings and device: `config` must be NULL in this version (bclInvalidArgument
 * otherwise). The parent stays valid (poisoned, if it was) until bclCommDestroy.
 * Thread safety: a call on `comm` must not run concurrently with another call on `comm`,
 * except bclCommRevoke and bclCommAbort, which may be called from any thread at any time. */

#define BCL_SPLIT_NOCOLOR (-1)

/* bclCommSplit: collective over every rank of `comm`. Ranks passing the same color (>= 0)
 * form a communicator ranked by `key`, then by their rank in `comm`. A rank passing
 * BCL_SPLIT_NOCOLOR takes part in no new communicator: its *newcomm is set to NULL. No
 * rendezvous store is used (the exchange runs over `comm`). newcomm: must not be NULL. */
bclResult_t bclCommSplit(bclComm_t comm, int color, int key, bclComm_t* newcomm,
                         bclConfig_t* config);

/* bclCommCreateGroup: a communicator of the `nranks` ranks of `comm` listed in `ranks`, called
 * by those ranks alone (MPI_Comm_create_group); the others need not call. Each member's new
 * rank is its index in the list. Members pass the same list and tag (>= 0) and make groups of
 * one membership in the same order. No rendezvous store is used: the members exchange over
 * `comm`'s point-to-point links, so no bclSend/bclRecv between them may be outstanding on
 * `comm` meanwhile. A rank not in the list, a rank listed twice or out of range:
 * bclInvalidArgument. newcomm: must not be NULL. */
bclResult_t bclCommCreateGroup(bclComm_t comm, const int* ranks, int nranks, int tag,
                               bclComm_t* newcomm, bclConfig_t* config);

/* bclCommRevoke: not collective. Every operation in flight on `comm`, on every rank, fails
 * promptly with bclRemoteError and a message naming the rank that revoked it; later
 * operations are refused. The communicator can still be shrunk or destroyed. Unlike
 * bclCommAbort it blames no rank and keeps the handle valid. flags: must be 0. */
bclResult_t bclCommRevoke(bclComm_t comm, int flags);

#define BCL_SHRINK_DEFAULT 0 /* no operation may be outstanding on this rank */
#define BCL_SHRINK_ABORT 1   /* revoke first, so outstanding operations fail, and wait for them */
#define BCL_SHRINK_FAILED 2  /* exclude the ranks found dead or unresponsive (list: NULL, 0) */

/* bclCommShrink: called by the survivors only (every rank of `comm` not excluded). They form
 * a communicator renumbered densely in the order of their ranks in `comm`. Works on a
 * poisoned or revoked communicator; needs the health channel (not BCL_HEALTH=off).
 * excludeRanksList / excludeRanksCount: the ranks to leave out; every survivor must pass the
 * same list (different lists: bclInvalidArgument naming both). With BCL_SHRINK_FAILED they must
 * be NULL and 0: the survivors agree on the ranks the health layer found dead or unresponsive,
 * plus any found gone during the shrink, so no two survivors end up in communicators of
 * different membership, even when another rank dies meanwhile. A rank the others excluded
 * gets bclExcluded. Bounded by the init timeout (BCL_INIT_TIMEOUT_S); never hangs on a dead
 * or stopped rank. flags: BCL_SHRINK_DEFAULT or BCL_SHRINK_ABORT, optionally | BCL_SHRINK_FAILED.
 * newcomm: must not be NULL. */
bclResult_t bclCommShrink(bclComm_t comm, const int* excludeRanksList, int excludeRanksCount,
                          bclComm_t* newcomm, bclConfig_t* config, int flags);

/* bclCommGetUniqueId: an id for growing `comm`, made by the rank that will be the grow's root
 * (any one existing rank), to be handed to the new processes out of band. uniqueId: must not
 * be NULL. */
bclResult_t bclCommGetUniqueId(bclComm_t comm, bclUniqueId* uniqueId);

/* bclCommGrow: grow to nRanks (> the current size). Existing ranks pass their `comm` and rank
 * -1 and keep their ranks; exactly one of them (the root) passes the id it made with
 * bclCommGetUniqueId, the others NULL. New ranks pass comm NULL, the id, and their new rank
 * (from the current size up to nRanks - 1). Collective over the existing ranks, together with
 * the new ones. A size that differs between ranks is bclInvalidArgument naming both. newcomm:
 * must not be NULL. */
bclResult_t bclCommGrow(bclComm_t comm, int nRanks, const bclUniqueId* uniqueId, int rank,
                        bclComm_t* newcomm, bclConfig_t* config);

/* bclCommGetAsyncError: *asyncError = bclPoisoned if an earlier failure broke the
 * communicator, else bclSuccess. asyncError: must not be NULL. */
bclResult_t bclCommGetAsyncError(bclComm_t comm, bclResult_t* asyncError);

/* bclCommCount / bclCommUserRank: number of ranks / this rank. Output must not be NULL. */
bclResult_t bclCommCount(const bclComm_t comm, int* count);
bclResult_t bclCommUserRank(const bclComm_t comm, int* rank);

/* bclCommHealthReport: a JSON object describing the communicator (rank, world, ring order,
 * every peer's host, pid and device, the verdict or first fault if any, the last operation
 * started and completed, and the flight recorder: the last operations with signature, state,
 * times and bytes per peer) written NUL-terminated into buffer. *needed (if not NULL) receives
 * the size required; a NULL or too small buffer gives bclInvalidArgument and writes nothing. */
bclResult_t bclCommHealthReport(bclComm_t comm, char* buffer, size_t size, size_t* needed);

/* bclAllReduce: recvbuff[i] = op over all ranks of sendbuff[i], i < count.
 * In place when sendbuff == recvbuff. Buffers: count elements each; NULL only if count is 0.
 * sendbuff and recvbuff must not otherwise overlap. */
bclResult_t bclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                         bclDataType_t datatype, bclRedOp_t op, bclComm_t comm,
                         bclStream_t stream);

/* bclAllGather: recvbuff[r*sendcount + i] = sendbuff of rank r [i].
 * recvbuff holds nranks*sendcount elements. In place when
 * sendbuff == recvbuff + rank*sendcount (elements). */
bclResult_t bclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                         bclDataType_t datatype, bclComm_t comm, bclStream_t stream);

/* bclReduceScatter: recvbuff[i] = op over ranks of sendbuff[rank*recvcount + i].
 * sendbuff holds nranks*recvcount elements. In place when
 * recvbuff == sendbuff + rank*recvcount (elements). */
bclResult_t bclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                             bclDataType_t datatype, bclRedOp_t op, bclComm_t comm,
                             bclStream_t stream);

/* bclBroadcast: recvbuff on every rank = sendbuff of root (count elements). sendbuff is read
 * on the root only and may be NULL elsewhere. In place when sendbuff == recvbuff. */
bclResult_t bclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                         bclDataType_t datatype, int root, bclComm_t comm, bclStream_t stream);

/* bclReduce: recvbuff on root = op over ranks of sendbuff. recvbuff is written on the root
 * only and may be NULL elsewhere. In place when sendbuff == recvbuff on the root. */
bclResult_t bclReduce(const void* sendbuff, void* recvbuff, size_t count,
                      bclDataType_t datatype, bclRedOp_t op, int root, bclComm_t comm,
                      bclStream_t stream);

/* bclAllToAll: block j (count elements) of sendbuff goes to rank j; block j of recvbuff comes
 * from rank j. Both hold nranks*count elements. In place when sendbuff == recvbuff. */
bclResult_t bclAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                        bclDataType_t datatype, bclComm_t comm, bclStream_t stream);

/* bclAllToAllv: all-to-all with a count per pair (MPI_Alltoallv without displacements):
 * sendbuff holds the blocks for ranks 0, 1, ... packed in rank order, sendcounts[j] elements
 * for rank j; recvbuff the blocks from them, recvcounts[j] from rank j. Both count arrays
 * hold nranks entries and must not be NULL. Rank j's recvcounts[me] must equal this rank's
 * sendcounts[j]: a difference is bclMismatch on rank j. sendcounts[me] == recvcounts[me].
 * No in-place form (overlapping buffers are bclInvalidArgument). On a host stream it returns
 * at once, the count arrays copied. Host memory only for now (a cuda communicator gives
 * bclInvalidArgument). */
bclResult_t bclAllToAllv(const void* sendbuff, const size_t* sendcounts, void* recvbuff,
                         const size_t* recvcounts, bclDataType_t datatype, bclComm_t comm,
                         bclStream_t stream);

/* bclAllGatherv: all-gather with a count per rank (MPI_Allgatherv without displacements):
 * rank r contributes recvcounts[r] elements (this rank's sendbuff holds recvcounts[me]);
 * recvbuff gets them all, packed in rank order. recvcounts holds nranks entries, the same on
 * every rank, and must not be NULL. No in-place form. Host memory; host streams as above. */
bclResult_t bclAllGatherv(const void* sendbuff, void* recvbuff, const size_t* recvcounts,
                          bclDataType_t datatype, bclComm_t comm, bclStream_t stream);

/* bclReduceScatterv: reduce-scatter with a count per rank (MPI_Reduce_scatter): sendbuff
 * holds a block for each rank packed in rank order (recvcounts[r] elements for rank r);
 * recvbuff (recvcounts[me] elements) gets op over ranks of this rank's block. recvcounts
 * holds nranks entries, the same on every rank, and must not be NULL. No in-place form. */
bclResult_t bclReduceScatterv(const void* sendbuff, void* recvbuff, const size_t* recvcounts,
                              bclDataType_t datatype, bclRedOp_t op, bclComm_t comm,
                              bclStream_t stream);

/* bclGather: recvbuff on root [r*sendcount + i] = sendbuff of rank r [i]; recvbuff holds
 * nranks*sendcount elements, is written on the root only and may be NULL elsewhere. In place
 * when, on the root, sendbuff == recvbuff + root*sendcount (elements). Direct: each rank
 * sends to the root. */
bclResult_t bclGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                      bclDataType_t datatype, int root, bclComm_t comm, bclStream_t stream);

/* bclScatter: recvbuff[i] on rank r = sendbuff of root [r*recvcount + i]; sendbuff holds
 * nranks*recvcount elements, is read on the root only and may be NULL elsewhere. In place
 * when, on the root, recvbuff == sendbuff + root*recvcount (elements). */
bclResult_t bclScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                       bclDataType_t datatype, int root, bclComm_t comm, bclStream_t stream);

/* bclSend / bclRecv: point to point; the peer calls the other with the same count and type.
 * With stream NULL: outside a group each call completes before it returns; inside
 * bclGroupStart/bclGroupEnd the buffers must stay valid until bclGroupEnd returns. On a host
 * stream the call is queued in order with the stream's other operations and returns at once
 * (in a group, at bclGroupEnd: its sends queued before its receives); the buffer is the
 * stream's until it has passed the call. A send completes once BCL holds its bytes, so a
 * send queued before the matching receive's predecessor cannot deadlock. */
bclResult_t bclSend(const void* sendbuff, size_t count, bclDataType_t datatype, int peer,
                    bclComm_t comm, bclStream_t stream);
bclResult_t bclRecv(void* recvbuff, size_t count, bclDataType_t datatype, int peer,
                    bclComm_t comm, bclStream_t stream);

/* bclBarrier: returns once every rank has entered it. */
bclResult_t bclBarrier(bclComm_t comm, bclStream_t stream);

/* bclGroupStart / bclGroupEnd: bclSend and bclRecv calls between them (on this thread) run
 * together at the outermost bclGroupEnd, so exchanges in any order cannot deadlock.
 * Collectives inside a group run at once. Groups nest. */
bclResult_t bclGroupStart(void);
bclResult_t bclGroupEnd(void);

/* Host streams: calls that return at once on host memory.
 * On a communicator whose buffers are host memory (cpu, sim, device plugins), a collective
 * called with stream == NULL completes before it returns. Called with a host stream from
 * bclStreamCreate, it is checked (a bad argument is still an error at once), queued on the
 * communicator's progress thread, and the call returns: compute meanwhile. The buffers are
 * the operation's until it has finished: do not read, write or free them before
 * bclStreamSynchronize, bclStreamQuery or bclEventQuery/bclEventSynchronize on an event
 * recorded after the call says so. A stream runs its operations in call order, each after
 * the previous one has finished (also across communicators); blocking calls (stream NULL)
 * on a communicator wait for the operations queued on it first. The first failure of a
 * stream's operations is returned by the next bclStreamQuery/bclStreamSynchronize (and
 * bclEventQuery/Synchronize of events recorded after it) with its text in bclGetLastError;
 * bclStreamSynchronize clears it. Collectives only: bclSend/bclRecv take stream NULL.
 * Thread safety: any thread may use a stream or event; calls on one stream from several
 * threads are queued in the order they take its lock.
 *   bclStreamCreate: a new host stream. bclStreamQuery: bclSuccess when every operation has
 *   finished, bclInProgress while some run, or the first error. bclStreamSynchronize: wait
 *   for all of them (each bounded by its communicator's timeout), then as Query, clearing the
 *   error. bclStreamDestroy: synchronize, then free the handle.
 *   bclEventRecord: mark the stream's position now; bclEventQuery / bclEventSynchronize:
 *   whether (or wait until) every operation queued before the record has finished; an event
 *   never recorded is complete. */
bclResult_t bclStreamCreate(bclStream_t* stream);
bclResult_t bclStreamQuery(bclStream_t stream);
bclResult_t bclStreamSynchronize(bclStream_t stream);
bclResult_t bclStreamDestroy(bclStream_t stream);
bclResult_t bclEventCreate(bclEvent_t* event);
bclResult_t bclEventRecord(bclEvent_t event, bclStream_t stream);
bclResult_t bclEventQuery(bclEvent_t event);
bclResult_t bclEventSynchronize(bclEvent_t event);
bclResult_t bclEventDestroy(bclEvent_t event);

/* bclGetErrorString: fixed text of a result code (never NULL). */
const char* bclGetErrorString(bclResult_t result);

/* bclGetLastError: the calling thread's last failure message, naming its cause ("" if none).
 * comm may be NULL. */
const char* bclGetLastError(bclComm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* BCL_H_ */
