// Works of the "bcl" backend: an operation's completion (its BCL event), its future, its
// error, and the thread that finishes operations nobody waits on.
#include "process_group.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>

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

c10::intrusive_ptr<c10::ivalue::Future> new_future(const std::vector<at::Tensor>& result) {
  std::vector<c10::Device> gpus;
  for (const auto& t : result) {
    if (t.is_cuda() && std::find(gpus.begin(), gpus.end(), t.device()) == gpus.end()) {
      gpus.push_back(t.device());
    }
  }
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                  std::move(gpus));
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
      future_(new_future(result_)) {}

Pending::Pending(std::vector<at::Tensor> result)
    : result_(std::move(result)), future_(new_future(result_)) {
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

namespace {
// The text of the string field `key` of a JSON object (its escapes taken as they are), or
// empty if it has none (null, or absent).
std::string string_field(const std::string& json, const std::string& key) {
  const std::string start = "\"" + key + "\":\"";
  size_t at = json.find(start);
  if (at == std::string::npos) return "";
  std::string text;
  for (size_t i = at + start.size(); i < json.size() && json[i] != '"'; ++i) {
    if (json[i] == '\\' && i + 1 < json.size()) ++i;
    text.push_back(json[i]);
  }
  return text;
}

// Why a communicator failed, from its health report: the error that poisoned it (rank,
// host, device, cause), else its verdict line.
std::string failure_of(bclComm_t comm) {
  size_t needed = 0;
  bclCommHealthReport(comm, nullptr, 0, &needed);
  std::string report(needed, '\0');
  if (needed == 0 || bclCommHealthReport(comm, report.data(), report.size(), nullptr) != bclSuccess) {
    return "(no health report)";
  }
  for (const char* key : {"async_error", "verdict"}) {
    if (std::string text = string_field(report, key); !text.empty()) return text;
  }
  return "(its health report names no cause)";
}
}  // namespace

WorkGpu::WorkGpu(c10::Event event, c10::Device device, bclComm_t comm, std::string what,
                 std::vector<at::Tensor> result, int rank, c10d::OpType type)
    : c10d::Work(rank, type),
      event_(std::move(event)),
      device_(device),
      comm_(comm),
      what_(std::move(what)),
      result_(std::move(result)),
      future_(new_future(result_)) {
  // Completed now, in stream order: the future records its own event on the current stream,
  // and whoever waits on it waits on that stream (NCCL's works do the same).
  future_->markCompleted(c10::IValue(result_));
}

std::exception_ptr WorkGpu::failed() const {
  bclResult_t state = bclSuccess;
  if (bclCommGetAsyncError(comm_, &state) == bclSuccess && state == bclSuccess) return nullptr;
  return std::make_exception_ptr(c10::DistBackendError(
      {__func__, __FILE__, __LINE__}, "bcl: " + what_ + " on " + device_.str() +
                                          ": the GPU communicator failed: " + failure_of(comm_)));
}

bool WorkGpu::isCompleted() { return failed() != nullptr || event_.query(); }

bool WorkGpu::isSuccess() const { return failed() == nullptr && event_.query(); }

std::exception_ptr WorkGpu::exception() const { return failed(); }

bool WorkGpu::wait(std::chrono::milliseconds /*timeout: BCL's own bounds the operation*/) {
  c10::impl::VirtualGuardImpl impl(device_.type());
  event_.block(impl.getStream(device_));
  if (std::exception_ptr err = failed()) std::rethrow_exception(err);
  return true;
}

void WorkGpu::synchronize() {
  event_.synchronize();
  if (std::exception_ptr err = failed()) std::rethrow_exception(err);
}

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
