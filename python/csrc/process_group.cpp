// The collectives of the "bcl" backend: torch's tensors and options turned into BCL calls.
// Every operation is built as a Step (the BCL calls to make, the tensors they need alive,
// what to copy back afterwards) and handed to `run`, so coalesced forms are the plain ones
// merged into one Work.
#include "process_group.hpp"
#include "tensors.hpp"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>
#include <numeric>

namespace bcl_torch {

namespace {

// BCL's op for torch's on `t`. PREMUL_SUM arrives here as SUM (its factor is applied first,
// by `premultiplied`); on bool, sum is or and product is and, as Gloo and NCCL take them.
bclRedOp_t op_of(const c10d::ReduceOp& op, const at::Tensor& t) {
  bool boolean = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::PREMUL_SUM: return boolean ? bclMax : bclSum;
    case c10d::ReduceOp::PRODUCT: return boolean ? bclMin : bclProd;
    case c10d::ReduceOp::MIN: return bclMin;
    case c10d::ReduceOp::MAX: return bclMax;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK_VALUE(!boolean, "bcl: AVG of bool tensors has no meaning");
      return bclAvg;
    default:
      TORCH_CHECK_VALUE(false, "bcl: reduce op ", static_cast<int>(op.op_),
                        " is not supported (SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM are)");
  }
}

// For PREMUL_SUM (torch.distributed._make_nccl_premul_sum): `t` times the op's factor, a
// new tensor; otherwise undefined.
at::Tensor premultiplied(const c10d::ReduceOp& op, const at::Tensor& t) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return at::Tensor();
  auto* factor = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK_VALUE(factor != nullptr, "bcl: PREMUL_SUM without its factor");
  if (factor->tensor_factor.defined()) return t.mul(factor->tensor_factor.to(t.device()));
  return t.mul(factor->double_factor);
}

void same(const at::Tensor& big, const at::Tensor& small, int64_t elems, const char* what) {
  TORCH_CHECK_VALUE(big.numel() == elems && big.scalar_type() == small.scalar_type(), "bcl: ",
                    what, ": expected a tensor of ", elems, " x ", small.scalar_type(), ", got ",
                    big.numel(), " x ", big.scalar_type());
}

// Copies of `parts` laid end to end in one new tensor (their flattened contents).
at::Tensor packed(const std::vector<at::Tensor>& parts) {
  std::vector<at::Tensor> flat;
  flat.reserve(parts.size());
  for (const auto& p : parts) flat.push_back(p.reshape({-1}));
  return at::cat(flat);
}

// Copies consecutive pieces of `staged` into `outs` (each its own size and shape).
std::function<void()> unpack(at::Tensor staged, std::vector<at::Tensor> outs) {
  return [staged, outs]() mutable {
    int64_t at = 0;
    for (auto& o : outs) {
      o.copy_(staged.narrow(0, at, o.numel()).view_as(o));
      at += o.numel();
    }
  };
}

size_t sync_bytes_setting() {
  const char* v = std::getenv("BCL_TORCH_SYNC_BYTES");
  if (v == nullptr || *v == '\0') return 64 << 10;
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(v, &end, 10);
  TORCH_CHECK_VALUE(errno == 0 && end != v && *end == '\0' && *v != '-',
                    "bcl: BCL_TORCH_SYNC_BYTES=", v,
                    " is not a byte count (a whole number, 0 to queue every call)");
  return static_cast<size_t>(n);
}

}  // namespace

ProcessGroupBCL::ProcessGroupBCL(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                 int size, std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), origin_("store"), sync_bytes_(sync_bytes_setting()) {
  bclUniqueId uid{};
  const std::string key = "bcl/unique_id";
  if (rank == 0) {
    check(bclGetUniqueId(&uid), "init: bclGetUniqueId");
    const auto* b = reinterpret_cast<const uint8_t*>(uid.internal);
    store->set(key, std::vector<uint8_t>(b, b + sizeof(uid.internal)));
  } else {
    std::vector<uint8_t> data = store->get(key);
    TORCH_CHECK(data.size() == sizeof(uid.internal), "bcl: init: the unique id in the store has ",
                data.size(), " bytes, not ", sizeof(uid.internal));
    std::copy(data.begin(), data.end(), reinterpret_cast<uint8_t*>(uid.internal));
  }
  bclConfig_t config = BCL_CONFIG_INITIALIZER;
  if (timeout.count() > 0) timeout_s_ = timeout.count() / 1000.0;
  config.timeoutSeconds = config.initTimeoutSeconds = timeout_s_;
  check(bclCommInitRankConfig(&comm_, size, uid, rank, &config), "init");
  start();
}

ProcessGroupBCL::ProcessGroupBCL(const c10::intrusive_ptr<ProcessGroupBCL>& parent,
                                 const std::vector<int64_t>& members, int rank, int tag)
    : c10d::Backend(rank, static_cast<int>(members.size())),
      origin_("group"),
      timeout_s_(parent->timeout_s_),
      sync_bytes_(parent->sync_bytes_) {
  TORCH_CHECK_VALUE(parent->comm_ != nullptr, "bcl: new_group from a group already shut down");
  std::vector<int> ranks(members.begin(), members.end());
  check(bclCommCreateGroup(parent->comm_, ranks.data(), static_cast<int>(ranks.size()), tag,
                           &comm_, nullptr),
        "new_group: bclCommCreateGroup");
  int mine = -1;
  check(bclCommUserRank(comm_, &mine), "new_group");
  TORCH_CHECK(mine == rank, "bcl: new_group: torch ranks this process ", rank,
              " in the group, BCL ", mine);
  start();
}

void ProcessGroupBCL::start() {
  if (bclResult_t r = bclStreamCreate(&stream_); r != bclSuccess) {
    std::exception_ptr err = failure(r, "init: bclStreamCreate");
    bclCommDestroy(comm_);
    comm_ = nullptr;
    std::rethrow_exception(err);
  }
  completer_ = std::make_unique<Completer>();
}

ProcessGroupBCL::~ProcessGroupBCL() { shutdown(); }

void ProcessGroupBCL::shutdown() {
  if (comm_ == nullptr) return;
  recvs_->cancel_all("the group was shut down before this receive was waited on");
  bclStreamSynchronize(stream_);
  completer_.reset();  // finishes what was queued, then joins
  bclStreamDestroy(stream_);
  bclCommDestroy(comm_);
  stream_ = nullptr;
  comm_ = nullptr;
  std::lock_guard<std::mutex> guard(gpu_mu_);
  if (gpu_comm_ != nullptr) {
    // Its operations are on the GPU's streams: let them pass before the communicator goes.
    bclCommFinalize(gpu_comm_);
    bclCommDestroy(gpu_comm_);
    gpu_comm_ = nullptr;
  }
}

void ProcessGroupBCL::abort() {
  if (comm_ != nullptr) bclCommAbort(comm_);
  std::lock_guard<std::mutex> guard(gpu_mu_);
  if (gpu_comm_ != nullptr) bclCommAbort(gpu_comm_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::done(c10d::OpType type,
                                                     std::vector<at::Tensor> result) {
  return c10::make_intrusive<WorkBCL>(std::make_shared<Pending>(std::move(result)), rank_, type);
}

// Queued on the host stream with one event after it, or, when it moves at most
// BCL_TORCH_SYNC_BYTES (64 KiB by default), at once on this thread, where the hand-over to
// the progress thread would cost more than there is to overlap. Order is kept either way: a
// blocking call waits for what was queued on the communicator before it.
c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::run(c10d::OpType type, const std::string& what,
                                                    Step&& step, std::vector<at::Tensor> result) {
  TORCH_CHECK_VALUE(comm_ != nullptr, "bcl: ", what, ": the group was shut down");
  if (step.on_gpu() && !step.via_host) return run_on_gpu(type, what, std::move(step), result);
  // A GPU operation through host copies runs here too: its copies back must be in the
  // caller's stream order.
  if (step.bytes <= sync_bytes_ || step.via_host) {
    for (auto& l : step.launches) check(l(comm_, nullptr), what);
    if (auto after = step.afterwards()) after();
    return done(type, std::move(result));
  }
  auto give_up = [&](std::exception_ptr err) {
    // Calls queued before the failing one still use the step's tensors: wait for them
    // before those are freed.
    bclStreamSynchronize(stream_);
    std::rethrow_exception(err);
  };
  for (auto& l : step.launches) {
    if (bclResult_t r = l(comm_, stream_); r != bclSuccess) give_up(failure(r, what));
  }
  bclEvent_t event = nullptr;
  if (bclResult_t r = bclEventCreate(&event); r != bclSuccess) {
    give_up(failure(r, what + ": bclEventCreate"));
  }
  if (bclResult_t r = bclEventRecord(event, stream_); r != bclSuccess) {
    bclEventDestroy(event);
    give_up(failure(r, what + ": bclEventRecord"));
  }
  auto pending = std::make_shared<Pending>(what, event, std::move(step.keep), step.afterwards(),
                                           std::move(result));
  completer_->push(pending);
  return c10::make_intrusive<WorkBCL>(std::move(pending), rank_, type);
}


bclComm_t ProcessGroupBCL::gpu_comm(c10::Device device) {
  std::lock_guard<std::mutex> guard(gpu_mu_);
  if (gpu_comm_ != nullptr) {
    TORCH_CHECK_VALUE(device == gpu_device_, "bcl: this group runs on ", gpu_device_,
                      "; a tensor on ", device, " (one GPU per rank and group, as with NCCL)");
    return gpu_comm_;
  }
  const std::string spec = "cuda:" + std::to_string(device.index());
  bclUniqueId uid{};
  if (rank_ == 0) check(bclGetUniqueId(&uid), "init of the communicator on " + spec);
  check(bclBroadcast(uid.internal, uid.internal, sizeof(uid.internal), bclUint8, 0, comm_, nullptr),
        "init of the communicator on " + spec + ": rank 0's unique id");
  bclConfig_t config = BCL_CONFIG_INITIALIZER;
  config.device = spec.c_str();
  config.timeoutSeconds = config.initTimeoutSeconds = timeout_s_;
  check(bclCommInitRankConfig(&gpu_comm_, size_, uid, rank_, &config),
        "init of the communicator on " + spec);
  gpu_device_ = device;
  return gpu_comm_;
}

// Each launch takes the stream's handle (a cudaStream_t; null is the legacy default stream,
// as in BCL's C ABI); copies into non-contiguous outputs follow on the same stream. The
// tensors are marked as used by that stream, so the caching allocator does not hand their
// memory out again before the stream has passed the call, whoever drops them first.
c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::run_on_gpu(c10d::OpType type,
                                                           const std::string& what, Step&& step,
                                                           std::vector<at::Tensor> result) {
  bclComm_t comm = gpu_comm(step.device);
  c10::impl::VirtualGuardImpl impl(step.device.type());
  c10::Stream stream = impl.getStream(step.device);
  void* handle = stream.native_handle();
  for (auto& l : step.launches) check(l(comm, handle), what);
  if (auto after = step.afterwards()) after();
  for (auto& t : step.keep) {
    if (t.is_cuda()) t.record_stream(stream);
  }
  c10::Event event(step.device.type());
  event.record(stream);
  return c10::make_intrusive<WorkGpu>(std::move(event), step.device, comm, what,
                                      std::move(result), rank_, type);
}

// ------------------------------------------------------------------ reductions

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  Step step;
  for (const auto& t : tensors) {
    step.on(t);
    bclDataType_t dt = dtype_of(t);
    bclRedOp_t op = op_of(opts.reduceOp, t);
    at::Tensor buf;
    if (at::Tensor scaled = premultiplied(opts.reduceOp, t); scaled.defined()) {
      buf = scaled.contiguous();
      step.after.push_back([t, buf]() mutable { t.copy_(buf); });
      step.keep.push_back(t);
    } else {
      buf = flat_into(t, step);
    }
    step.keep.push_back(buf);
    step.bytes += bytes_of(buf);
    step.launches.push_back([buf, dt, op](bclComm_t comm, bclStream_t s) {
      return bclAllReduce(ptr(buf), ptr(buf), count(buf), dt, op, comm, s);
    });
  }
  return run(c10d::OpType::ALLREDUCE, "all_reduce", std::move(step), tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  c10d::AllreduceOptions one;
  one.reduceOp = opts.reduceOp;
  one.timeout = opts.timeout;
  return allreduce(tensors, one);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "bcl: reduce takes one tensor, got ", tensors.size());
  const at::Tensor& t = tensors[0];
  Step step;
  step.on(t);
  bclDataType_t dt = dtype_of(t);
  bclRedOp_t op = op_of(opts.reduceOp, t);
  int root = static_cast<int>(opts.rootRank);
  at::Tensor buf;
  if (at::Tensor scaled = premultiplied(opts.reduceOp, t); scaled.defined()) {
    buf = scaled.contiguous();
    if (rank_ == root) step.after.push_back([t, buf]() mutable { t.copy_(buf); });
  } else if (t.is_contiguous()) {
    buf = t;
  } else {
    buf = t.contiguous();
    if (rank_ == root) step.after.push_back([t, buf]() mutable { t.copy_(buf); });
  }
  step.keep = {t, buf};
  step.bytes = bytes_of(buf);
  step.launches.push_back([buf, dt, op, root](bclComm_t comm, bclStream_t s) {
    return bclReduce(ptr(buf), ptr(buf), count(buf), dt, op, root, comm, s);
  });
  return run(c10d::OpType::REDUCE, "reduce", std::move(step), tensors);
}

namespace {
Step reduce_scatter_step(int size, const at::Tensor& output,
                         const at::Tensor& input, const c10d::ReduceOp& rop) {
  Step step;
  step.on(output);
  step.on(input);
  same(input, output, size * output.numel(), "reduce_scatter_tensor");
  at::Tensor out = flat_into(output, step);
  at::Tensor scaled = premultiplied(rop, input);
  at::Tensor in = scaled.defined() ? scaled.contiguous() : input.contiguous();
  bclDataType_t dt = dtype_of(output);
  bclRedOp_t op = op_of(rop, output);
  step.keep.insert(step.keep.end(), {output, out, in});
  step.bytes = bytes_of(in);
  step.launches.push_back([in, out, dt, op](bclComm_t comm, bclStream_t s) {
    return bclReduceScatter(ptr(in), ptr(out), count(out), dt, op, comm, s);
  });
  return step;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::reduce_scatter_single(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  Step step = reduce_scatter_step(size_, output, input, opts.reduceOp);
  return run(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", std::move(step), {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::reduce_scatter_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "bcl: reduce_scatter_tensor_coalesced: ",
                    outputs.size(), " outputs for ", inputs.size(), " inputs");
  Step step;
  for (size_t i = 0; i < outputs.size(); ++i) {
    step.merge(reduce_scatter_step(size_, outputs[i], inputs[i], opts.reduceOp));
  }
  return run(c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", std::move(step), outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1,
                    "bcl: reduce_scatter takes one output and one list of inputs");
  at::Tensor& output = outputs[0];
  std::vector<at::Tensor>& ins = inputs[0];
  TORCH_CHECK_VALUE(static_cast<int>(ins.size()) == size_, "bcl: reduce_scatter: ", ins.size(),
                    " inputs for ", size_, " ranks");
  bool even = std::all_of(ins.begin(), ins.end(),
                          [&](const at::Tensor& i) { return i.numel() == output.numel(); });
  if (even) {
    Step placed;
    for (const auto& i : ins) placed.on(i);
    at::Tensor staged = packed(ins);
    Step step = reduce_scatter_step(size_, output, staged, opts.reduceOp);
    return run(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", std::move(step), outputs);
  }
  // Uneven: input p goes to rank p, whatever its size (bclReduceScatterv; through host
  // memory on a GPU).
  Step step;
  step.on(output);
  for (const auto& i : ins) step.on(i);
  step.via_host = step.on_gpu();
  TORCH_CHECK_VALUE(ins[rank_].numel() == output.numel(), "bcl: reduce_scatter: input ", rank_,
                    " holds ", ins[rank_].numel(), " elements, this rank's output ",
                    output.numel());
  auto counts = std::make_shared<std::vector<size_t>>();
  for (const auto& i : ins) counts->push_back(count(i));
  at::Tensor scaled = premultiplied(opts.reduceOp, packed(ins));
  at::Tensor in = host_input(scaled.defined() ? scaled : packed(ins));
  at::Tensor out = host_output(output, step);
  bclDataType_t dt = dtype_of(output);
  bclRedOp_t op = op_of(opts.reduceOp, output);
  step.keep.insert(step.keep.end(), {in, out, output});
  step.bytes = bytes_of(in);
  step.launches.push_back([in, out, counts, dt, op](bclComm_t comm, bclStream_t s) {
    return bclReduceScatterv(ptr(in), ptr(out), counts->data(), dt, op, comm, s);
  });
  return run(c10d::OpType::REDUCE_SCATTER, "reduce_scatter (uneven)", std::move(step), outputs);
}

// ------------------------------------------------------------------ data movement

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  Step step;
  int root = static_cast<int>(opts.rootRank);
  for (const auto& t : tensors) {
    step.on(t);
    at::Tensor buf = flat_into(t, step);
    bclDataType_t dt = dtype_of(t);
    step.keep.push_back(buf);
    step.bytes += bytes_of(buf);
    step.launches.push_back([buf, dt, root](bclComm_t comm, bclStream_t s) {
      return bclBroadcast(ptr(buf), ptr(buf), count(buf), dt, root, comm, s);
    });
  }
  return run(c10d::OpType::BROADCAST, "broadcast", std::move(step), tensors);
}

namespace {
Step all_gather_step(int size, const at::Tensor& output,
                     const at::Tensor& input) {
  Step step;
  step.on(output);
  step.on(input);
  same(output, input, size * input.numel(), "all_gather_into_tensor");
  at::Tensor out = flat_into(output, step);
  at::Tensor in = input.contiguous();
  bclDataType_t dt = dtype_of(input);
  step.keep.insert(step.keep.end(), {output, out, in});
  step.bytes = bytes_of(out);
  step.launches.push_back([in, out, dt](bclComm_t comm, bclStream_t s) {
    return bclAllGather(ptr(in), ptr(out), count(in), dt, comm, s);
  });
  return step;
}

// Whether the outputs of an all_gather into a list differ in size (bclAllGatherv).
bool uneven_list(const std::vector<at::Tensor>& outs) {
  return std::any_of(outs.begin(), outs.end(),
                     [&](const at::Tensor& o) { return o.numel() != outs[0].numel(); });
}

// all_gather into a list: output p holds rank p's input (bclAllGatherv when sizes differ).
// On a GPU an uneven one goes through host memory, as do all when `through_host`.
Step all_gather_list_step(int size, int rank, const std::vector<at::Tensor>& outs,
                          const at::Tensor& input, bool through_host) {
  Step step;
  step.on(input);
  TORCH_CHECK_VALUE(static_cast<int>(outs.size()) == size, "bcl: all_gather: ", outs.size(),
                    " outputs for ", size, " ranks");
  for (const auto& o : outs) {
    step.on(o);
    TORCH_CHECK_VALUE(o.scalar_type() == input.scalar_type(), "bcl: all_gather: an output of ",
                      o.scalar_type(), " for an input of ", input.scalar_type());
  }
  at::Tensor in = input.contiguous();
  TORCH_CHECK_VALUE(outs[rank].numel() == in.numel(), "bcl: all_gather: output ", rank,
                    " holds ", outs[rank].numel(), " elements, this rank's input ", in.numel());
  int64_t total = 0;
  auto counts = std::make_shared<std::vector<size_t>>();
  for (const auto& o : outs) {
    counts->push_back(count(o));
    total += o.numel();
  }
  bool even = std::all_of(counts->begin(), counts->end(),
                          [&](size_t c) { return c == count(in); });
  // Uneven on a GPU: through host memory (BCL's bclAllGatherv takes host memory only).
  step.via_host = (through_host || !even) && step.on_gpu();
  if (step.via_host) in = host_input(in);
  at::Tensor staged = at::empty({total}, in.options());
  bclDataType_t dt = dtype_of(input);
  step.keep.insert(step.keep.end(), {in, staged});
  step.keep.insert(step.keep.end(), outs.begin(), outs.end());
  step.after.push_back(unpack(staged, outs));
  step.bytes = bytes_of(staged);
  if (even) {
    step.launches.push_back([in, staged, dt](bclComm_t comm, bclStream_t s) {
      return bclAllGather(ptr(in), ptr(staged), count(in), dt, comm, s);
    });
  } else {
    step.launches.push_back([in, staged, counts, dt](bclComm_t comm, bclStream_t s) {
      return bclAllGatherv(ptr(in), ptr(staged), counts->data(), dt, comm, s);
    });
  }
  return step;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::all_gather_single(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions&) {
  Step step = all_gather_step(size_, output, input);
  return run(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", std::move(step), {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::all_gather_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "bcl: all_gather_into_tensor_coalesced: ",
                    outputs.size(), " outputs for ", inputs.size(), " inputs");
  Step step;
  for (size_t i = 0; i < outputs.size(); ++i) {
    step.merge(all_gather_step(size_, outputs[i], inputs[i]));
  }
  return run(c10d::OpType::COALESCED, "all_gather_into_tensor_coalesced", std::move(step), outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1,
                    "bcl: all_gather takes one list of outputs and one input");
  Step step = all_gather_list_step(size_, rank_, outputs[0], inputs[0], false);
  return run(c10d::OpType::ALLGATHER, "all_gather", std::move(step), outputs[0]);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "bcl: all_gather_coalesced: ",
                    outputs.size(), " output lists for ", inputs.size(), " inputs");
  // One Work: if one of them must go through host memory on a GPU, all of them do.
  bool through_host = std::any_of(outputs.begin(), outputs.end(),
                                  [](const auto& outs) { return uneven_list(outs); });
  Step step;
  std::vector<at::Tensor> result;
  for (size_t i = 0; i < inputs.size(); ++i) {
    step.merge(all_gather_list_step(size_, rank_, outputs[i], inputs[i], through_host));
    result.insert(result.end(), outputs[i].begin(), outputs[i].end());
  }
  return run(c10d::OpType::ALLGATHER_COALESCED, "all_gather_coalesced", std::move(step), result);
}

namespace {
// gather's step: `input` to `root`, which receives every rank's in rank order into `output`
// (undefined on the other ranks).
Step gather_step(int size, int rank, int root, const at::Tensor& input,
                 const at::Tensor& output, const char* what) {
  Step step;
  step.on(input);
  at::Tensor in = input.contiguous();
  bclDataType_t dt = dtype_of(in);
  step.keep.push_back(in);
  step.bytes = bytes_of(in) * (rank == root ? size : 1);
  at::Tensor out;
  if (rank == root) {
    step.on(output);
    same(output, in, size * in.numel(), what);
    out = flat_into(output, step);
    step.keep.push_back(out);
  }
  step.launches.push_back([in, out, dt, root](bclComm_t comm, bclStream_t s) {
    return bclGather(ptr(in), out.defined() ? ptr(out) : nullptr, count(in), dt, root, comm, s);
  });
  return step;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1, "bcl: gather takes one input");
  int root = static_cast<int>(opts.rootRank);
  if (rank_ != root) {
    Step step = gather_step(size_, rank_, root, inputs[0], at::Tensor(), "gather");
    return run(c10d::OpType::GATHER, "gather", std::move(step), {});
  }
  TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                    "bcl: gather: the root needs one list of ", size_, " outputs");
  Step placed;
  placed.on(inputs[0]);
  for (const auto& o : outputs[0]) {
    placed.on(o);
    same(o, inputs[0], inputs[0].numel(), "gather");
  }
  // Into one staged tensor, then out to the list.
  at::Tensor staged = at::empty({size_ * inputs[0].numel()}, inputs[0].options());
  Step step = gather_step(size_, rank_, root, inputs[0], staged, "gather");
  step.after.push_back(unpack(staged, outputs[0]));
  return run(c10d::OpType::GATHER, "gather", std::move(step), outputs[0]);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::gather_single(at::Tensor& output,
                                                              at::Tensor& input,
                                                              const c10d::GatherOptions& opts) {
  int root = static_cast<int>(opts.rootRank);
  Step step = gather_step(size_, rank_, root, input,
                          rank_ == root ? output : at::Tensor(), "gather_into_tensor");
  return run(c10d::OpType::GATHER, "gather_into_tensor", std::move(step),
             rank_ == root ? std::vector<at::Tensor>{output} : std::vector<at::Tensor>{});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1, "bcl: scatter takes one output");
  int root = static_cast<int>(opts.rootRank);
  at::Tensor& output = outputs[0];
  Step step;
  step.on(output);
  at::Tensor out = flat_into(output, step);
  bclDataType_t dt = dtype_of(output);
  step.keep.insert(step.keep.end(), {output, out});
  step.bytes = bytes_of(out) * (rank_ == root ? size_ : 1);
  at::Tensor in;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                      "bcl: scatter: the root needs one list of ", size_, " inputs");
    for (const auto& i : inputs[0]) {
      step.on(i);
      same(i, output, output.numel(), "scatter");
    }
    in = packed(inputs[0]);
    step.keep.push_back(in);
  }
  step.launches.push_back([in, out, dt, root](bclComm_t comm, bclStream_t s) {
    return bclScatter(in.defined() ? ptr(in) : nullptr, ptr(out), count(out), dt, root, comm, s);
  });
  return run(c10d::OpType::SCATTER, "scatter", std::move(step), outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::alltoallv(Step&& step, at::Tensor in,
                                                          std::vector<size_t> in_counts,
                                                          at::Tensor out,
                                                          std::vector<size_t> out_counts,
                                                          std::vector<at::Tensor> result) {
  auto sc = std::make_shared<std::vector<size_t>>(std::move(in_counts));
  auto rc = std::make_shared<std::vector<size_t>>(std::move(out_counts));
  bclDataType_t dt = dtype_of(in);
  step.keep.insert(step.keep.end(), {in, out});
  step.bytes = std::max(bytes_of(in), bytes_of(out));
  step.launches.push_back([in, out, sc, rc, dt](bclComm_t comm, bclStream_t s) {
    return bclAllToAllv(ptr(in), sc->data(), ptr(out), rc->data(), dt, comm, s);
  });
  return run(c10d::OpType::ALLTOALL_BASE, "all_to_all_single (uneven)", std::move(step), result);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::all_to_all_single(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions&) {
  Step step;
  step.on(output);
  step.on(input);
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "bcl: all_to_all_single of ",
                    input.scalar_type(), " into ", output.scalar_type());
  auto uneven = [](const std::vector<int64_t>& s) {
    return !s.empty() && std::any_of(s.begin(), s.end(), [&](int64_t v) { return v != s[0]; });
  };
  if (!uneven(outputSplitSizes) && !uneven(inputSplitSizes)) {
    at::Tensor out = flat_into(output, step);
    at::Tensor in = input.contiguous();
    TORCH_CHECK_VALUE(in.numel() == out.numel() && in.numel() % size_ == 0,
                      "bcl: all_to_all_single needs input and output of ", size_,
                      " equal blocks; got ", in.numel(), " and ", out.numel(), " elements");
    bclDataType_t dt = dtype_of(in);
    size_t n = count(in) / size_;
    step.keep.insert(step.keep.end(), {output, out, in});
    step.bytes = bytes_of(in);
    step.launches.push_back([in, out, n, dt](bclComm_t comm, bclStream_t s) {
      return bclAllToAll(ptr(in), ptr(out), n, dt, comm, s);
    });
    return run(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", std::move(step), {output});
  }
  // Uneven splits count rows along dim 0, as torch does.
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits) {
    int64_t row = t.dim() > 1 && t.size(0) ? t.numel() / t.size(0) : 1;
    std::vector<size_t> c;
    for (int r = 0; r < size_; ++r) {
      int64_t rows = splits.empty() ? (t.dim() ? t.size(0) : t.numel()) / size_ : splits[r];
      TORCH_CHECK_VALUE(rows >= 0, "bcl: all_to_all_single: a negative split size");
      c.push_back(static_cast<size_t>(rows * row));
    }
    return c;
  };
  TORCH_CHECK_VALUE((inputSplitSizes.empty() || static_cast<int>(inputSplitSizes.size()) == size_) &&
                        (outputSplitSizes.empty() ||
                         static_cast<int>(outputSplitSizes.size()) == size_),
                    "bcl: all_to_all_single: split sizes need one entry per rank (", size_, ")");
  std::vector<size_t> ins = counts(input, inputSplitSizes), outs = counts(output, outputSplitSizes);
  size_t in_total = std::accumulate(ins.begin(), ins.end(), size_t{0});
  size_t out_total = std::accumulate(outs.begin(), outs.end(), size_t{0});
  TORCH_CHECK_VALUE(in_total == count(input) && out_total == count(output),
                    "bcl: all_to_all_single: split sizes ", inputSplitSizes, " / ",
                    outputSplitSizes, " do not cover the tensors (", input.numel(), " and ",
                    output.numel(), " elements)");
  // bclAllToAllv takes host memory only: on a GPU, through host copies.
  step.via_host = step.on_gpu();
  at::Tensor in = step.via_host ? host_input(input) : input.contiguous();
  at::Tensor out = step.via_host ? host_output(output, step) : flat_into(output, step);
  return alltoallv(std::move(step), in, ins, out, outs, {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions&) {
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == size_ &&
                        static_cast<int>(inputs.size()) == size_,
                    "bcl: all_to_all takes ", size_, " inputs and outputs");
  Step step;
  for (const auto& t : outputs) step.on(t);
  for (const auto& t : inputs) {
    step.on(t);
    TORCH_CHECK_VALUE(t.scalar_type() == outputs[0].scalar_type(), "bcl: all_to_all of ",
                      t.scalar_type(), " into ", outputs[0].scalar_type());
  }
  // Blocks of any sizes: bclAllToAllv, which takes host memory only (on a GPU, host copies).
  step.via_host = step.on_gpu();
  at::Tensor in = host_input(packed(inputs));
  std::vector<size_t> ins, outs;
  int64_t total = 0;
  for (const auto& t : inputs) ins.push_back(count(t));
  for (const auto& t : outputs) {
    outs.push_back(count(t));
    total += t.numel();
  }
  at::Tensor staged = at::empty({total}, in.options());
  step.after.push_back(unpack(staged, outputs));
  step.keep.insert(step.keep.end(), outputs.begin(), outputs.end());
  return alltoallv(std::move(step), in, ins, staged, outs, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupBCL::barrier(const c10d::BarrierOptions&) {
  Step step;
  step.launches.push_back([](bclComm_t comm, bclStream_t s) { return bclBarrier(comm, s); });
  return run(c10d::OpType::BARRIER, "barrier", std::move(step), {});
}

}  // namespace bcl_torch
