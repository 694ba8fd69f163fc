// Point to point in the "bcl" backend. Sends go on the group's host stream like its
// collectives (isend returns at once, behind the work queued before it; BCL's sends never
// wait for the receiver); receives run when their Work is waited on (DeferredRecv): on the
// one in-order stream, a receive queued before the send its peer waits for would deadlock
// both. Between startCoalescing and endCoalescing (batch_isend_irecv) both are one BCL group,
// run together at its end, so exchanges in any order cannot deadlock.
#include <c10/util/Exception.h>

#include "process_group.hpp"
#include "tensors.hpp"

namespace bcl_torch {

DeferredRecv::DeferredRecv(std::string what, std::function<bclResult_t()> call,
                           std::function<void()> after, std::vector<at::Tensor> result)
    : what_(std::move(what)),
      call_(std::move(call)),
      after_(std::move(after)),
      result_(std::move(result)),
      future_(new_future(result_)) {}

void DeferredRecv::run() {
  if (done()) return;
  bclResult_t code = call_();
  error_ = run_after(code == bclSuccess ? nullptr : failure(code, what_), after_);
  call_ = nullptr;
  done_.store(true, std::memory_order_release);
}

void DeferredRecv::cancel(const std::string& why) {
  if (done()) return;
  error_ = std::make_exception_ptr(
      c10::DistBackendError({__func__, __FILE__, __LINE__}, "bcl: " + what_ + ": " + why));
  call_ = nullptr;
  after_ = nullptr;
  done_.store(true, std::memory_order_release);
}

void RecvQueue::push(std::shared_ptr<DeferredRecv> recv) {
  std::lock_guard<std::mutex> guard(mu_);
  queue_.push_back(std::move(recv));
}

void RecvQueue::run_through(const DeferredRecv* upto) {
  std::vector<std::shared_ptr<DeferredRecv>> ran;
  {
    std::lock_guard<std::mutex> guard(mu_);
    // Receives run under this lock: one found done here has left the queue for good.
    if (upto != nullptr && upto->done()) return;
    while (!queue_.empty()) {
      std::shared_ptr<DeferredRecv> next = queue_.front();
      queue_.pop_front();
      next->run();
      ran.push_back(next);
      if (next.get() == upto) break;
    }
  }
  // Their futures' callbacks run without the queue's lock: one may wait on a receive.
  for (const auto& r : ran) complete(r->future(), r->error(), r->result());
}

void RecvQueue::cancel_all(const std::string& why) {
  std::vector<std::shared_ptr<DeferredRecv>> cancelled;
  {
    std::lock_guard<std::mutex> guard(mu_);
    for (auto& r : queue_) r->cancel(why);
    cancelled.assign(queue_.begin(), queue_.end());
    queue_.clear();
  }
  for (const auto& r : cancelled) complete(r->future(), r->error(), r->result());
}

WorkRecv::WorkRecv(std::shared_ptr<RecvQueue> queue, std::shared_ptr<DeferredRecv> recv, int rank)
    : c10d::Work(rank, c10d::OpType::RECV), queue_(std::move(queue)), recv_(std::move(recv)) {}

bool WorkRecv::wait(std::chrono::milliseconds /*timeout: BCL's own bounds the receive*/) {
  queue_->run_through(recv_.get());
  if (std::exception_ptr err = recv_->error()) std::rethrow_exception(err);
  return true;
}

void ProcessGroupBCL::drain() { check(bclStreamSynchronize(stream_), "waiting for queued work"); }

void ProcessGroupBCL::startCoalescing() {
  drain();
  // Receives issued before the batch match the peers' sends before the batch's.
  recvs_->run_through(nullptr);
  check(bclGroupStart(), "batch_isend_irecv: bclGroupStart");
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::endCoalescing() {
  coalescing_ = false;
  auto after = std::move(coalesced_after_);
  auto keep = std::move(coalesced_keep_);
  coalesced_after_.clear();
  coalesced_keep_.clear();
  check(bclGroupEnd(), "batch_isend_irecv");
  for (const auto& a : after) a();
  return done(c10d::OpType::COALESCED, {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int) {
  const std::string what = "send to rank " + std::to_string(dst);
  if (coalescing_) {
    for (const auto& t : tensors) {
      Step placed;
      placed.on(t);
      at::Tensor c = host_input(t);
      coalesced_keep_.push_back(c);  // sent at the group's end
      check(bclSend(ptr(c), count(c), dtype_of(t), dst, comm_, nullptr), what);
    }
    return done(c10d::OpType::SEND, tensors);
  }
  Step step;
  for (const auto& t : tensors) {
    step.on(t);
    // BCL sends host memory only: a GPU tensor goes through a host copy, made now.
    step.via_host = step.on_gpu();
    bclDataType_t dt = dtype_of(t);
    at::Tensor c = host_input(t);
    step.keep.push_back(c);
    step.bytes += bytes_of(c);
    step.launches.push_back([c, dt, dst](bclComm_t comm, bclStream_t s) {
      return bclSend(ptr(c), count(c), dt, dst, comm, s);
    });
  }
  return run(c10d::OpType::SEND, what, std::move(step), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int) {
  Step placed;
  for (const auto& t : tensors) {
    placed.on(t);
    dtype_of(t);
  }
  const std::string what = "recv from rank " + std::to_string(src);
  if (coalescing_) {
    for (const auto& t : tensors) {
      Step step;
      at::Tensor c = host_output(t, step);
      check(bclRecv(ptr(c), count(c), dtype_of(t), src, comm_, nullptr), what);
      coalesced_keep_.push_back(c);
      if (auto back = step.afterwards()) coalesced_after_.push_back(std::move(back));
    }
    return done(c10d::OpType::RECV, tensors);
  }
  Step step;
  std::vector<at::Tensor> bufs;
  // Into host memory (BCL receives there only); a GPU tensor gets it once the receive is
  // waited on, in the waiting thread's stream order.
  for (const auto& t : tensors) bufs.push_back(host_output(t, step));
  std::vector<at::Tensor> ts = tensors;
  bclComm_t comm = comm_;
  // A blocking call: BCL runs it after the collectives queued on the communicator before it.
  auto call = [comm, bufs, ts, src]() {
    for (size_t i = 0; i < bufs.size(); ++i) {
      bclResult_t r = bclRecv(ptr(bufs[i]), count(bufs[i]), dtype_of(ts[i]), src, comm, nullptr);
      if (r != bclSuccess) return r;
    }
    return bclSuccess;
  };
  auto recv = std::make_shared<DeferredRecv>(what, call, step.afterwards(), tensors);
  recvs_->push(recv);
  return c10::make_intrusive<WorkRecv>(recvs_, std::move(recv), rank_);
}

}  // namespace bcl_torch
