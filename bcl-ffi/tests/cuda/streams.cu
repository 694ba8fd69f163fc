/* The C ABI on GPU ranks, as a CUDA program uses it (built with nvcc and run by
 * scripts/device-check.sh; needs a GPU). One process per rank, BCL_RANK, BCL_WORLD_SIZE,
 * BCL_UNIQUE_ID and BCL_DEVICE (cuda:0 or cpu) set. GPU ranks pass device pointers and a
 * cudaStream_t; cpu ranks host memory and NULL. Checks, on GPU ranks:
 *  - stream order before the call: the send buffer is written by a kernel that first spins
 *    for ~50 ms; a collective that read it early would sum stale values;
 *  - stream order after the call: a kernel enqueued after the allreduce doubles the result;
 *    had it run before the allreduce wrote it, the result would not be doubled;
 *  - the call returns without waiting for the stream (its spinning kernel is still running),
 *    and the caller may then block on the stream (a pageable copy back, or
 *    cudaStreamSynchronize with BCL_TEST_SYNC_FIRST);
 *  - in-place allreduce, allgather, barrier on the stream;
 *  - a host pointer given to a GPU communicator is bclInvalidArgument naming it. */
#include <bcl.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N (1 << 20)

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #x, cudaGetErrorString(e_));                  \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)
#define CHECK_BCL(x)                                                                           \
  do {                                                                                         \
    bclResult_t r_ = (x);                                                                      \
    if (r_ != bclSuccess) {                                                                    \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #x, bclGetLastError(comm));                   \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

__global__ void fill_late(float* p, int n, int rank, long long spin) {
  long long start = clock64();
  while (clock64() - start < spin) {
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = (float)(rank + i % 7);
}

__global__ void twice(float* p, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] *= 2.0f;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(void) {
  int rank = -1, nranks = 0;
  bclComm_t comm = NULL;
  if (bclCommInitFromEnv(&comm) != bclSuccess) {
    fprintf(stderr, "init: %s\n", bclGetLastError(NULL));
    return 1;
  }
  bclCommUserRank(comm, &rank);
  bclCommCount(comm, &nranks);
  const char* device = getenv("BCL_DEVICE");
  int gpu = device != NULL && strncmp(device, "cuda", 4) == 0;
  /* BCL_TEST_SYNC_FIRST: synchronize the stream before the pageable copy back;
   * BCL_TEST_VERBOSE: timestamps of each step on stderr. */
  int sync_first = getenv("BCL_TEST_SYNC_FIRST") != NULL;
  int verbose = getenv("BCL_TEST_VERBOSE") != NULL;
  float rank_sum = nranks * (nranks - 1) / 2.0f;
  float* host = (float*)malloc(sizeof(float) * N * nranks);
  int wrong = 0;
  if (gpu) {
    cudaStream_t s;
    float *send, *recv, *gathered;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc(&send, sizeof(float) * N));
    CHECK_CUDA(cudaMalloc(&recv, sizeof(float) * N));
    CHECK_CUDA(cudaMalloc(&gathered, sizeof(float) * N * nranks));
    CHECK_CUDA(cudaMemset(send, 0, sizeof(float) * N));
    CHECK_CUDA(cudaDeviceSynchronize());
    fill_late<<<264, 256, 0, s>>>(send, N, rank, 100000000LL); /* ~50 ms at 2 GHz */
    double t0 = now_ms();
    CHECK_BCL(bclAllReduce(send, recv, N, bclFloat32, bclSum, comm, s));
    double enqueue_ms = now_ms() - t0;
    /* The call must not have waited for the stream: the spinning kernel is still running. */
    cudaError_t busy = cudaStreamQuery(s);
    if (busy != cudaErrorNotReady) {
      fprintf(stderr, "rank %d: bclAllReduce waited for the stream (query: %s)\n", rank,
              cudaGetErrorString(busy));
      wrong++;
    }
    if (verbose) fprintf(stderr, "rank %d: +%.1f ms allreduce enqueued\n", rank, enqueue_ms);
    twice<<<264, 256, 0, s>>>(recv, N);
    if (verbose) fprintf(stderr, "rank %d: +%.1f ms enqueued twice\n", rank, now_ms() - t0);
    if (sync_first) {
      CHECK_CUDA(cudaStreamSynchronize(s));
      if (verbose) fprintf(stderr, "rank %d: +%.1f ms stream synchronized\n", rank, now_ms() - t0);
    }
    CHECK_CUDA(cudaMemcpyAsync(host, recv, sizeof(float) * N, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    if (verbose) fprintf(stderr, "rank %d: +%.1f ms copied back\n", rank, now_ms() - t0);
    for (int i = 0; i < N; i++)
      if (host[i] != 2.0f * (rank_sum + nranks * (float)(i % 7))) wrong++;
    printf("rank %d (gpu): allreduce returned after %.3f ms, stream done after %.1f ms, %d wrong\n",
           rank, enqueue_ms, now_ms() - t0, wrong);
    /* In place on the stream, then allgather and barrier. */
    CHECK_BCL(bclAllReduce(recv, recv, N, bclFloat32, bclSum, comm, s));
    CHECK_BCL(bclAllGather(send, gathered, N, bclFloat32, comm, s));
    CHECK_BCL(bclBarrier(comm, s));
    CHECK_CUDA(cudaMemcpyAsync(host, recv, sizeof(float) * N, cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    for (int i = 0; i < N; i++)
      if (host[i] != 2.0f * nranks * (rank_sum + nranks * (float)(i % 7))) wrong++;
    CHECK_CUDA(cudaMemcpy(host, gathered, sizeof(float) * N * nranks, cudaMemcpyDeviceToHost));
    for (int r = 0; r < nranks; r++)
      for (int i = 0; i < N; i++)
        if (host[(size_t)r * N + i] != (float)(r + i % 7)) wrong++;
    /* A host pointer on a GPU communicator. */
    float on_host[4] = {0};
    bclResult_t bad = bclAllReduce(on_host, on_host, 4, bclFloat32, bclSum, comm, s);
    const char* why = bclGetLastError(comm);
    if (bad != bclInvalidArgument || strstr(why, "not memory of this device") == NULL) {
      fprintf(stderr, "rank %d: host pointer accepted or unclear: %d %s\n", rank, bad, why);
      wrong++;
    } else {
      printf("rank %d (gpu): a host pointer is refused: %s\n", rank, why);
    }
    bclResult_t async_error = bclSuccess;
    bclCommGetAsyncError(comm, &async_error);
    if (async_error != bclSuccess) {
      fprintf(stderr, "rank %d: async error %d\n", rank, async_error);
      wrong++;
    }
    cudaFree(send);
    cudaFree(recv);
    cudaFree(gathered);
    cudaStreamDestroy(s);
  } else {
    float* send = (float*)malloc(sizeof(float) * N);
    float* recv = (float*)malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) send[i] = (float)(rank + i % 7);
    CHECK_BCL(bclAllReduce(send, recv, N, bclFloat32, bclSum, comm, NULL));
    for (int i = 0; i < N; i++) {
      if (recv[i] != rank_sum + nranks * (float)(i % 7)) wrong++;
      recv[i] *= 2.0f; /* as the GPU ranks' kernel does */
    }
    CHECK_BCL(bclAllReduce(recv, recv, N, bclFloat32, bclSum, comm, NULL));
    CHECK_BCL(bclAllGather(send, host, N, bclFloat32, comm, NULL));
    CHECK_BCL(bclBarrier(comm, NULL));
    for (int i = 0; i < N; i++)
      if (recv[i] != 2.0f * nranks * (rank_sum + nranks * (float)(i % 7))) wrong++;
    for (int r = 0; r < nranks; r++)
      for (int i = 0; i < N; i++)
        if (host[(size_t)r * N + i] != (float)(r + i % 7)) wrong++;
    printf("rank %d (cpu): %d wrong\n", rank, wrong);
    free(send);
    free(recv);
  }
  free(host);
  bclCommDestroy(comm);
  return wrong == 0 ? 0 : 2;
}
