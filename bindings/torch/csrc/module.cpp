/*
 * braid_torch._C: the constructor torch.distributed calls for backend
 * "braid" (braid_torch/__init__.py registers it), and the backend's Python
 * type, a c10d Backend.
 */
#include <pybind11/chrono.h>
#include <torch/python.h>

#include "braid_backend.hpp"

namespace py = pybind11;

static c10::intrusive_ptr<c10d::Backend> create_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const std::chrono::duration<double>& timeout) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  py::gil_scoped_release nogil; /* init waits for the other ranks */
  return c10::make_intrusive<braid_torch::BraidBackend>(store, rank, size, ms);
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch.distributed backend over Braid";
  py::class_<braid_torch::BraidBackend, c10d::Backend,
             c10::intrusive_ptr<braid_torch::BraidBackend>>(m, "BraidBackend")
      .def("perform_nocolor_split",
           [](braid_torch::BraidBackend& b, py::object) {
             /* a rank outside every new group still takes part in the split */
             py::gil_scoped_release nogil;
             b.splitRanks({}, std::chrono::milliseconds(-1), nullptr);
           })
      .def("nccl_version", [](braid_torch::BraidBackend&) {
        int v = 0;
        ncclGetVersion(&v);
        return v;
      });
  m.def("create_backend", &create_backend, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"));
  m.def("version", []() {
    int v = 0;
    ncclGetVersion(&v);
    return v;
  });
}
