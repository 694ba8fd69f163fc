// What the "bcl" backend's operations share: the Step an operation is built as, and how a
// torch tensor becomes a BCL buffer.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <functional>
#include <vector>

#include "bcl.h"

namespace bcl_torch {

// One BCL call of an operation: given the communicator of the operation's device and the
// stream to queue on (the host stream, torch's current CUDA stream, or null to run at once).
using Launch = std::function<bclResult_t(bclComm_t, bclStream_t)>;

// What one operation is made of: the BCL calls, the tensors they use, what to copy back once
// they are done, and the device its tensors live on.
struct Step {
  std::vector<Launch> launches;
  std::vector<at::Tensor> keep;
  std::vector<std::function<void()>> after;
  size_t bytes = 0;
  // Every tensor of one operation lives here (cpu until one says otherwise).
  c10::Device device{c10::kCPU};
  bool placed = false;
  // Set on a GPU operation that BCL's C ABI has for host memory only (per-rank counts,
  // send and receive): its launches take host copies and run on the cpu communicator, on the
  // caller's thread, and `after` copies the results back in the caller's stream order.
  bool via_host = false;

  // `t`, checked: dense, on cpu or cuda, on the same device as the operation's other tensors.
  const at::Tensor& on(const at::Tensor& t) {
    TORCH_CHECK_VALUE(t.layout() == at::kStrided, "bcl: only dense tensors are supported");
    TORCH_CHECK_VALUE(t.device().is_cpu() || t.device().is_cuda(), "bcl: tensors on ",
                      t.device(), " are not supported (cpu and cuda are)");
    place(t.device());
    return t;
  }
  void place(c10::Device d) {
    if (!placed) {
      device = d;
      placed = true;
    }
    TORCH_CHECK_VALUE(d == device, "bcl: one operation's tensors are on ", device, " and on ", d);
  }
  bool on_gpu() const { return device.is_cuda(); }

  void merge(Step&& other) {
    if (other.placed) place(other.device);
    // A launch given the GPU communicator host memory, or the host one GPU memory, would
    // be refused at best: the parts of one Work go one way.
    TORCH_CHECK(launches.empty() || other.launches.empty() || via_host == other.via_host,
                "bcl: internal: one operation's parts would go through host memory and not");
    via_host = via_host || other.via_host;
    for (auto& l : other.launches) launches.push_back(std::move(l));
    for (auto& t : other.keep) keep.push_back(std::move(t));
    for (auto& a : other.after) after.push_back(std::move(a));
    bytes += other.bytes;
  }
  std::function<void()> afterwards() {
    if (after.empty()) return nullptr;
    return [after = std::move(after)] {
      for (const auto& a : after) a();
    };
  }
};

inline bclDataType_t dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kChar: return bclInt8;
    case at::kByte: return bclUint8;
    case at::kBool: return bclUint8;
    case at::kInt: return bclInt32;
    case at::kUInt32: return bclUint32;
    case at::kLong: return bclInt64;
    case at::kUInt64: return bclUint64;
    case at::kHalf: return bclFloat16;
    case at::kFloat: return bclFloat32;
    case at::kDouble: return bclFloat64;
    case at::kBFloat16: return bclBfloat16;
    default:
      TORCH_CHECK_TYPE(false, "bcl: tensors of ", t.scalar_type(), " are not supported");
  }
}


// `t` where BCL reads it for a call made on host memory (`Step::via_host`): itself on the
// cpu, else a host copy (made now, in the caller's stream order).
inline at::Tensor host_input(const at::Tensor& t) {
  return t.is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous();
}

inline size_t bytes_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }
inline void* ptr(const at::Tensor& t) { return t.numel() ? t.data_ptr() : nullptr; }
inline size_t count(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }

// A contiguous view of `t`, or a copy and the step that brings results back into `t`.
inline at::Tensor flat_into(const at::Tensor& t, Step& step) {
  if (t.is_contiguous()) return t;
  at::Tensor c = t.contiguous();
  step.after.push_back([t, c]() mutable { t.copy_(c); });
  step.keep.push_back(t);
  return c;
}

// Where a call on host memory (`Step::via_host`) writes `t`'s result: `t` itself, or its
// contiguous copy, on the cpu; else a host tensor that `step` copies into `t` afterwards.
inline at::Tensor host_output(const at::Tensor& t, Step& step) {
  if (t.is_cpu()) return flat_into(t, step);
  at::Tensor h = at::empty(t.sizes(), t.options().device(at::kCPU));
  step.after.push_back([t, h]() mutable { t.copy_(h); });
  step.keep.push_back(t);
  return h;
}

}  // namespace bcl_torch
