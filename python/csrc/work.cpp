// Works of the "bcl" backend: an operation's completion (its BCL event), its future, its
// error, and the thread that finishes operations nobody waits on.
#include "process_group.hpp"

#include <c10/util/Exception.h>

namespace bcl_torch {

std::exception_ptr failure(bclResult_t code, const std::string& what) {
  const char* kind = bclGetErrorString(code);
  const char* text = bclGetLastError(nullptr);
  std::string msg = "bcl: " + what + ": " + (kind ? kind : "error") + ": " +
                    (text && *text ? text : "(no further text)");
  return std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, __LINE__}, msg));
}

void check(bclResult_t code, const std::string& what) {
  if (code != bclSuccess) std::rethrow_exception(failure(code, what));
}

c10::intrusive_ptr<c10::ivalue::Future> new_future() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

std::exception_ptr run_after(std::exception_ptr err, std::function<void()>& after) {
  if (err == nullptr && after) {
    try {
      after();
    } catch (...) {
      err = std::current_exception();
    }
  }
  after = nullptr;
  return err;
}

void complete(const c10::intrusive_ptr<c10::ivalue::Future>& future, std::exception_ptr err,
              const std::vector<at::Tensor>& result) {
  if (err != nullptr) {
    future->setError(err);
  } else {
    future->markCompleted(c10::IValue(result));
  }
}

Pending::Pending(std::string what, bclEvent_t event, std::vector<at::Tensor> keep,
                 std::function<void()> after, std::vector<at::Tensor> result)
    : what_(std::move(what)),
      event_(event),
      keep_(std::move(keep)),
      after_(std::move(after)),
      result_(std::move(result)),
      future_(new_future()) {}

Pending::Pending(std::vector<at::Tensor> result) : result_(std::move(result)), future_(new_future()) {
  claimed_ = true;
  done_.store(true, std::memory_order_release);
  complete(future_, nullptr, result_);
}

Pending::~Pending() {
  if (event_ != nullptr) bclEventDestroy(event_);
}

std::exception_ptr Pending::finish() {
  if (done()) return error_;
  // Outside the lock: several threads may wait on one event; each reads its own text.
  bclResult_t code = bclEventSynchronize(event_);
  std::exception_ptr err = code == bclSuccess ? nullptr : failure(code, what_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (claimed_) {
      finished_.wait(lock, [this] { return done(); });
      return error_;
    }
    claimed_ = true;
  }
  // Only the claiming thread gets here.
  error_ = run_after(err, after_);
  keep_.clear();
  {
    std::lock_guard<std::mutex> guard(mu_);
    done_.store(true, std::memory_order_release);
  }
  finished_.notify_all();
  // Done before the future completes: a callback that waits on this work returns at once.
  complete(future_, error_, result_);
  return error_;
}

WorkBCL::WorkBCL(std::shared_ptr<Pending> pending, int rank, c10d::OpType type)
    : c10d::Work(rank, type), pending_(std::move(pending)) {}

bool WorkBCL::isCompleted() { return pending_->done(); }

bool WorkBCL::isSuccess() const { return pending_->done() && pending_->error() == nullptr; }

std::exception_ptr WorkBCL::exception() const { return pending_->error(); }

std::vector<at::Tensor> WorkBCL::result() { return pending_->result(); }

// Waits on the caller's thread for the event itself, not for the completer to get to it,
// so a blocking call costs no extra hand-over. The group's timeout bounds each operation
// already (BCL's own, naming who was awaited); a shorter `timeout` here is not separately
// enforced.
bool WorkBCL::wait(std::chrono::milliseconds /*timeout*/) {
  if (std::exception_ptr err = pending_->finish()) std::rethrow_exception(err);
  return true;
}

void WorkBCL::synchronize() { wait(); }

c10::intrusive_ptr<c10::ivalue::Future> WorkBCL::getFuture() { return pending_->future(); }

Completer::Completer() : thread_([this] { loop(); }) {}

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> guard(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Completer::push(std::shared_ptr<Pending> pending) {
  {
    std::lock_guard<std::mutex> guard(mu_);
    queue_.push_back(std::move(pending));
  }
  cv_.notify_one();
}

void Completer::loop() {
  for (;;) {
    std::shared_ptr<Pending> next;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to finish
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    next->finish();
  }
}

}  // namespace bcl_torch
