// What the "bcl" backend's operations share: the Step an operation is built as, and how a
// torch tensor becomes a BCL buffer.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <functional>
#include <vector>

#include "bcl.h"

namespace bcl_torch {

using Launch = std::function<bclResult_t(bclStream_t)>;

// What one operation is made of: the BCL calls (each given the stream to queue on, or null
// to run at once), the tensors they use, what to copy back once they are done.
struct Step {
  std::vector<Launch> launches;
  std::vector<at::Tensor> keep;
  std::vector<std::function<void()>> after;
  size_t bytes = 0;

  void merge(Step&& other) {
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


inline void host_only(const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), "bcl: only cpu tensors are supported here, got one on ",
                    t.device());
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "bcl: only dense tensors are supported");
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

}  // namespace bcl_torch
