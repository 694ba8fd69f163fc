// The torch.distributed backend "bcl": a c10d::Backend over BCL's C ABI (bcl.h), as
// torch-ccl and torch_ucc plug into torch. Collectives on host tensors are queued on the
// group's BCL host stream and return a Work at once, so DDP's gradient buckets are reduced
// while the backward pass goes on; small ones run on the caller's thread (see `run`).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/Event.h>

#include "bcl.h"
#include "tensors.hpp"

namespace bcl_torch {

// The exception of a failed BCL call on this thread: BCL's own text (rank, host, device,
// cause) after what the backend was doing. A DistBackendError in Python, as NCCL's are.
std::exception_ptr failure(bclResult_t code, const std::string& what);
// Throws failure(code, what) unless code is bclSuccess.
void check(bclResult_t code, const std::string& what);

// A future for a Work's result (a list of tensors), as torch's own backends make them, on
// the GPUs the result lives on (its completion is then ordered on their current streams).
c10::intrusive_ptr<c10::ivalue::Future> new_future(const std::vector<at::Tensor>& result);
// Run `after` (an operation's copies back) unless the operation failed with `err`, and
// drop it; the operation's error (the copy's, if that failed), or null.
std::exception_ptr run_after(std::exception_ptr err, std::function<void()>& after);
// Settle `future` with `result` or `err`. This runs its callbacks (DDP's hooks) on this
// thread, so no lock of the operation may be held: a callback may wait on the work again.
void complete(const c10::intrusive_ptr<c10::ivalue::Future>& future, std::exception_ptr err,
              const std::vector<at::Tensor>& result);

// One operation queued on the host stream: the event recorded after it, the tensors it
// uses (kept alive until it is done), what to do once it is done (copy results into
// non-contiguous outputs), and the future DDP's communication hooks chain on.
class Pending {
 public:
  Pending(std::string what, bclEvent_t event, std::vector<at::Tensor> keep,
          std::function<void()> after, std::vector<at::Tensor> result);
  // Already done (a call that ran on the caller's thread).
  explicit Pending(std::vector<at::Tensor> result);
  ~Pending();

  // Wait for the operation (any thread, any number of times): its error, or null.
  std::exception_ptr finish();
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Its error once done (written before `done_`), else null.
  std::exception_ptr error() const { return done() ? error_ : nullptr; }
  const std::vector<at::Tensor>& result() const { return result_; }
  const c10::intrusive_ptr<c10::ivalue::Future>& future() const { return future_; }

 private:
  std::string what_;
  bclEvent_t event_ = nullptr;
  std::vector<at::Tensor> keep_;
  std::function<void()> after_;
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  // One thread finishes the operation (`claimed_`); others wait for it on `finished_`.
  std::mutex mu_;
  std::condition_variable finished_;
  bool claimed_ = false;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

class WorkBCL : public c10d::Work {
 public:
  WorkBCL(std::shared_ptr<Pending> pending, int rank, c10d::OpType type);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::shared_ptr<Pending> pending_;
};

// A collective on a GPU: queued on torch's current stream, done when the stream passes the
// event recorded after it. As NCCL's works: `wait` makes the caller's current stream wait
// for it (the host does not block), `synchronize` blocks the host; the future is completed
// at once, stream-ordered (torch's Future records its own events). A failure poisons the
// GPU communicator: `wait` and `isCompleted` then raise or report the error that poisoned
// it, and the next call on the group raises at once.
class WorkGpu : public c10d::Work {
 public:
  WorkGpu(c10::Event event, c10::Device device, bclComm_t comm, std::string what,
          std::vector<at::Tensor> result, int rank, c10d::OpType type);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return result_; }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::exception_ptr failed() const;  // the GPU communicator's failure, or null
  c10::Event event_;
  c10::Device device_;
  bclComm_t comm_;
  std::string what_;
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A receive issued by irecv, run when its Work is waited on: BCL's sends never wait for the
// receiver, so a receive can wait for its data at the moment the caller needs it, and the
// caller's later sends (irecv, then send: a pipeline's exchange) are not held up behind it,
// as they would be on the host stream. Receives run in the order they were issued, so each
// matches the peer's sends in order, as torch promises.
class DeferredRecv {
 public:
  DeferredRecv(std::string what, std::function<bclResult_t()> call, std::function<void()> after,
               std::vector<at::Tensor> result);
  void run();  // the receive and its copy back (once); then `complete` its future
  bool done() const { return done_.load(std::memory_order_acquire); }
  std::exception_ptr error() const { return error_; }  // read after done()
  void cancel(const std::string& why);
  const std::vector<at::Tensor>& result() const { return result_; }
  const c10::intrusive_ptr<c10::ivalue::Future>& future() const { return future_; }

 private:
  std::string what_;
  std::function<bclResult_t()> call_;
  std::function<void()> after_;
  std::vector<at::Tensor> result_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
};

class RecvQueue {
 public:
  void push(std::shared_ptr<DeferredRecv> recv);
  // Run the receives issued up to and including `upto` (all of them: null), in order.
  void run_through(const DeferredRecv* upto);
  void cancel_all(const std::string& why);

 private:
  std::mutex mu_;
  std::deque<std::shared_ptr<DeferredRecv>> queue_;
};

class WorkRecv : public c10d::Work {
 public:
  WorkRecv(std::shared_ptr<RecvQueue> queue, std::shared_ptr<DeferredRecv> recv, int rank);
  bool isCompleted() override { return recv_->done(); }
  bool isSuccess() const override { return recv_->done() && recv_->error() == nullptr; }
  std::exception_ptr exception() const override {
    return recv_->done() ? recv_->error() : nullptr;
  }
  std::vector<at::Tensor> result() override { return recv_->result(); }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override { wait(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return recv_->future(); }

 private:
  std::shared_ptr<RecvQueue> queue_;
  std::shared_ptr<DeferredRecv> recv_;
};

// Finishes queued operations in order on its own thread, so their futures complete (and
// DDP's hooks run) without anyone waiting on them.
class Completer {
 public:
  Completer();
  ~Completer();
  void push(std::shared_ptr<Pending> pending);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class ProcessGroupBCL : public c10d::Backend {
 public:
  // A member of a new communicator: rank 0 makes its unique id and hands it to the others
  // through `store` (torch's, already prefixed per group). A positive `timeout` bounds init
  // and every collective, as the group's timeout does for Gloo.
  ProcessGroupBCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout);
  // A member of a group of `parent`'s ranks `members` (torch's new_group, which calls its
  // backend on the members only), made by them alone from the parent's communicator
  // (bclCommCreateGroup): no store rendezvous, no new connections to set up through it. It
  // has the parent's settings. `tag` is the same on every member (from torch's group name).
  ProcessGroupBCL(const c10::intrusive_ptr<ProcessGroupBCL>& parent,
                  const std::vector<int64_t>& members, int rank, int tag);
  ~ProcessGroupBCL() override;

  const std::string getBackendName() const override { return "bcl"; }
  // How this group's communicator was made: "store" (a unique id through torch's store) or
  // "group" (bclCommCreateGroup from the world's).
  const std::string& origin() const { return origin_; }
  bool supportsCoalescing() const override { return true; }
  void shutdown() override;
  void abort() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather_single(at::Tensor& output, at::Tensor& input,
                                               const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<int64_t>& outputSplitSizes,
                                                   std::vector<int64_t>& inputSplitSizes,
                                                   const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

 private:
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, const std::string& what, Step&& step,
                                     std::vector<at::Tensor> result);
  void start();  // the host stream and completer of a new communicator
  // A work that completed before it was returned.
  c10::intrusive_ptr<c10d::Work> done(c10d::OpType type, std::vector<at::Tensor> result);
  void drain();  // wait for everything queued (before a batch of sends and receives)
  c10::intrusive_ptr<c10d::Work> alltoallv(Step&& step, at::Tensor in,
                                           std::vector<size_t> in_counts, at::Tensor out,
                                           std::vector<size_t> out_counts,
                                           std::vector<at::Tensor> result);
  // A GPU operation, queued on torch's current stream of its device (NCCL's semantics).
  c10::intrusive_ptr<c10d::Work> run_on_gpu(c10d::OpType type, const std::string& what,
                                            Step&& step, std::vector<at::Tensor> result);
  // The communicator of this group's GPU `device`, made at its first GPU collective: every
  // member gets there in the same order (torch's rule for collectives), so rank 0's unique id
  // reaches the others over the host communicator.
  bclComm_t gpu_comm(c10::Device device);

  std::string origin_;
  bclComm_t comm_ = nullptr;
  // The group's timeout in seconds (0: BCL's default), for the GPU communicator too.
  double timeout_s_ = 0;
  std::mutex gpu_mu_;
  bclComm_t gpu_comm_ = nullptr;
  c10::Device gpu_device_{c10::kCUDA, 0};
  bclStream_t stream_ = nullptr;
  size_t sync_bytes_;
  // Between startCoalescing and endCoalescing (batch_isend_irecv): sends and receives are
  // one BCL group, and these run after its end (copies into non-contiguous outputs).
  bool coalescing_ = false;
  std::vector<std::function<void()>> coalesced_after_;
  std::vector<at::Tensor> coalesced_keep_;
  std::unique_ptr<Completer> completer_;
  std::shared_ptr<RecvQueue> recvs_ = std::make_shared<RecvQueue>();
};

}  // namespace bcl_torch
