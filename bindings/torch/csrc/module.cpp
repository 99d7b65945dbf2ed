/*
 * braid_torch._C: the constructor torch.distributed calls for backend
 * "braid" (braid_torch/__init__.py registers it), and the backend's Python
 * type, a c10d Backend.
 */
#include <pybind11/chrono.h>
#include <torch/python.h>

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include "braid_backend.hpp"

namespace py = pybind11;

/* braid::all_reduce_(tensor, op, group_name): the group's all_reduce of a
 * CPU tensor in place, done when it returns, with no Work (the kind of op
 * CPU inference stacks call per layer; BraidBackend::allReduceNow). */
static at::Tensor& all_reduce_op(at::Tensor& t, c10::string_view op, c10::string_view group) {
  using R = c10d::ReduceOp;
  static const std::pair<const char*, R::RedOpType> ops[] = {
      {"sum", R::SUM}, {"avg", R::AVG}, {"product", R::PRODUCT}, {"min", R::MIN}, {"max", R::MAX}};
  const R::RedOpType* kind = nullptr;
  for (auto& o : ops)
    if (op == o.first) kind = &o.second;
  TORCH_CHECK(kind, "braid: all_reduce_: op \"", op, "\" is none of sum, avg, product, min, max");
  auto pg = c10d::resolve_process_group(std::string(group));
  auto* b = dynamic_cast<braid_torch::BraidBackend*>(pg->getBackend(c10::DeviceType::CPU).get());
  TORCH_CHECK(b, "braid: all_reduce_: group ", group, "'s CPU backend is not braid");
  b->allReduceNow(t, R(*kind)); /* torch's dispatcher released the GIL */
  return t;
}

TORCH_LIBRARY(braid, m) {
  m.def("all_reduce_(Tensor(a!) tensor, str op, str group) -> Tensor(a!)");
}
TORCH_LIBRARY_IMPL(braid, CPU, m) {
  m.impl("all_reduce_", all_reduce_op);
}

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
      .def("status", &braid_torch::BraidBackend::status, py::arg("format") = "text",
           py::call_guard<py::gil_scoped_release>())
      .def("recorder", &braid_torch::BraidBackend::recorder,
           py::call_guard<py::gil_scoped_release>())
      .def("_library_loop", &braid_torch::BraidBackend::libraryLoop, py::arg("tensor"),
           py::arg("iters"), py::call_guard<py::gil_scoped_release>())
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
