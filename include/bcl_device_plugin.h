/*
 * bcl_device_plugin.h: how a vendor brings its accelerator to BCL without editing BCL.
 *
 * A plugin is a shared object that exports one symbol, `bclDevicePlugin_v1`, a table of the
 * functions below (as NCCL's net plugins export `ncclNetPlugin_vN`). BCL loads the file named
 * by BCL_DEVICE_PLUGIN=/path/libvendor.so at run time; a device spec "plugin:N" (from Rust,
 * bclConfig_t.device, BCL_DEVICE, or `bcl-bench --devices`) puts a rank on the plugin's
 * device N. Ranks on plugin devices join rings with ranks on any other backend.
 *
 * The model (it is that of BCL's Rust `Accelerator` trait, which maps onto CUDA's):
 *  - Memory. `memAlloc` returns a handle (bclDevMem_t) that BCL never dereferences; every
 *    access names the handle, a byte offset and a length. 0 is never a valid handle. BCL
 *    checks offsets against the allocation's length before it calls; a plugin may check again.
 *  - Ordering: streams and tickets. Every data operation names a stream (0: the device's
 *    default stream) and runs after the earlier operations on that stream. `eventRecord`
 *    returns a ticket that marks the current end of a stream; `eventQuery` says, without
 *    blocking, whether the stream has got there; `streamSynchronize` blocks until a stream's
 *    work is done. A plugin whose operations complete before they return (like the sample
 *    plugin) answers every query "done". Tickets need no destruction: a plugin may forget a
 *    ticket once it has reported it done, or once later work on its stream is done. Streams
 *    made by `streamCreate` live until `finalize`.
 *  - Host memory. In copyToDevice and reduceFromHost, `src` may be reused by BCL as soon as
 *    the call returns (copy or stage what is needed before returning). In copyToHost, `dst`
 *    must hold the data when the call returns (a plugin whose streams run ahead waits for
 *    the copy's turn on the stream): BCL never lets a plugin write host memory after a call.
 *  - Reductions. `dst = dst (op) src`, element-wise, for BCL's dtypes and ops with bcl.h's
 *    numbering (bclDataType_t, bclRedOp_t) and semantics: integers wrap; fp16 and bf16 compute
 *    each step in fp32 and round back to nearest even; min/max on floats are IEEE
 *    minNum/maxNum (a NaN loses against a number). `op` is never bclAvg: BCL sums, then calls
 *    `divide` once with the number of ranks (integers truncate toward zero; the divisor may
 *    exceed the type's range). Results must match BCL's cpu backend bit for bit (BCL's tests
 *    check every dtype and op against an independent reference).
 *  - Errors. Every entry returns a bclDevResult_t; on failure `lastError` returns a text for
 *    the calling thread that BCL puts into its own error, together with the plugin's file, the
 *    entry and its arguments. No entry may block for ever or abort the process.
 *  - Threads. BCL calls a device from the caller's thread and from the communicator's progress
 *    thread, at once: every entry must be thread-safe.
 *  - Life cycle. `init` is called once, when the library is loaded, before anything else;
 *    `finalize` once, after the last device of the plugin is closed, before BCL unloads it.
 *    `devices` must report at least one device.
 *
 * Versioning: the symbol name carries the table's version; `version` inside the table must be
 * BCL_DEVICE_PLUGIN_VERSION of the header the plugin was built with. A table of another
 * version, a missing symbol, a NULL `name` or NULL entry are refused when the plugin is
 * loaded, with an error naming the file and the entry; nothing of the plugin is called then.
 */
#ifndef BCL_DEVICE_PLUGIN_H_
#define BCL_DEVICE_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#include "bcl.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BCL_DEVICE_PLUGIN_VERSION 1
#define BCL_DEVICE_PLUGIN_SYMBOL "bclDevicePlugin_v1"

typedef enum {
  bclDevSuccess = 0,
  bclDevInvalidArgument = 1, /* a handle, range, type or value the plugin does not accept */
  bclDevOutOfMemory = 2,     /* memAlloc cannot allocate */
  bclDevInternalError = 3    /* the driver or the hardware failed */
} bclDevResult_t;

typedef uint64_t bclDevMem_t;    /* device memory: a handle, never dereferenced by BCL; 0 is none */
typedef uint64_t bclDevStream_t; /* 0: the device's default stream */
typedef uint64_t bclDevTicket_t; /* a point on a stream, from eventRecord */

typedef struct {
  char model[128];   /* e.g. "Vendor X1, 64 GiB": shown in BCL's messages and health report */
  double copyGbps;   /* host<->device copy bandwidth in GB/s; 0: unknown */
  double reduceGbps; /* reduce throughput in GB/s of destination bytes; 0: unknown */
} bclDeviceProperties_v1_t;

typedef struct {
  /* A short name ("vendorx"): the vendor of the plugin's devices in BCL's messages. */
  const char* name;
  /* BCL_DEVICE_PLUGIN_VERSION. */
  int version;

  bclDevResult_t (*init)(void);
  bclDevResult_t (*finalize)(void);
  /* *count: the number of devices on this host (at least 1). */
  bclDevResult_t (*devices)(int* count);
  bclDevResult_t (*getProperties)(int device, bclDeviceProperties_v1_t* props);

  /* *mem: a new allocation of `bytes` bytes (contents unspecified); bytes may be 0. */
  bclDevResult_t (*memAlloc)(int device, size_t bytes, bclDevMem_t* mem);
  bclDevResult_t (*memFree)(int device, bclDevMem_t mem);

  bclDevResult_t (*copyToDevice)(int device, bclDevMem_t dst, size_t dstOffset, const void* src,
                                 size_t bytes, bclDevStream_t stream);
  bclDevResult_t (*copyToHost)(int device, void* dst, bclDevMem_t src, size_t srcOffset,
                               size_t bytes, bclDevStream_t stream);
  /* The ranges do not overlap (they may lie in one allocation). */
  bclDevResult_t (*copyOnDevice)(int device, bclDevMem_t dst, size_t dstOffset, bclDevMem_t src,
                                 size_t srcOffset, size_t bytes, bclDevStream_t stream);
  /* dst = dst (op) src; `bytes` is a whole number of elements. */
  bclDevResult_t (*reduceFromHost)(int device, bclDevMem_t dst, size_t dstOffset,
                                   const void* src, size_t bytes, bclDataType_t dtype,
                                   bclRedOp_t op, bclDevStream_t stream);
  bclDevResult_t (*reduceOnDevice)(int device, bclDevMem_t dst, size_t dstOffset, bclDevMem_t src,
                                   size_t srcOffset, size_t bytes, bclDataType_t dtype,
                                   bclRedOp_t op, bclDevStream_t stream);
  /* dst = dst / divisor, element-wise: the end of bclAvg. */
  bclDevResult_t (*divide)(int device, bclDevMem_t dst, size_t dstOffset, size_t bytes,
                           bclDataType_t dtype, size_t divisor, bclDevStream_t stream);

  bclDevResult_t (*streamCreate)(int device, bclDevStream_t* stream);
  bclDevResult_t (*streamSynchronize)(int device, bclDevStream_t stream);
  bclDevResult_t (*eventRecord)(int device, bclDevStream_t stream, bclDevTicket_t* ticket);
  /* *done: 1 once the stream has reached the ticket, else 0. Never blocks. */
  bclDevResult_t (*eventQuery)(int device, bclDevTicket_t ticket, int* done);

  /* The calling thread's last failure, as text (never NULL; "" if none). */
  const char* (*lastError)(void);
} bclDevicePlugin_v1_t;

#ifdef __cplusplus
}
#endif

#endif /* BCL_DEVICE_PLUGIN_H_ */
