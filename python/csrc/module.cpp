// The Python module bcl._C: the "bcl" backend's class, which bcl/torch.py registers with
// torch.distributed. Its base is torch's own Backend, bound by torch's module.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/python.h>

#include "process_group.hpp"

PYBIND11_MODULE(_C, m) {
  m.doc() = "The torch.distributed backend \"bcl\" over libbcl (import bcl.torch to register it)";
  py::object backend = py::module_::import("torch._C._distributed_c10d").attr("Backend");
  (void)backend;  // torch's Backend must be bound before a class derives from it
  py::class_<bcl_torch::ProcessGroupBCL, c10d::Backend,
             c10::intrusive_ptr<bcl_torch::ProcessGroupBCL>>(m, "ProcessGroupBCL")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int,
                    std::chrono::milliseconds>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def(py::init<const c10::intrusive_ptr<bcl_torch::ProcessGroupBCL>&,
                    const std::vector<int64_t>&, int, int>(),
           py::arg("parent"), py::arg("members"), py::arg("rank"), py::arg("tag"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("origin", &bcl_torch::ProcessGroupBCL::origin);
}
