// The Python class of the dSB request service, written once for every backend: the CPU module
// binds Service<CpuWorkers> (service.cpp), the CUDA module Service<GpuWorkers>
// (ext/cuda/ising/service_bind.cpp). A backend is constructed from (mode, parameter, collectors)
// and has prepare(Model&) (called on every model load), workers() (the threads that run
// requests), stop() (after the front end stopped), add_stats(map) (its own counters) and info()
// (a description).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "cuscikit/numpy_out.hpp"
#include "server.hpp"

namespace csk::dsb::service {

template <class Backend>
struct Service {
  Server server;
  Backend backend;
  Service(const std::string& host, int udp_port, int tcp_port, std::size_t depth,
          const std::string& mode, int param, int receivers, int collectors, double spin_us,
          bool offload, bool pin, bool trace, double slow_us, int share, bool isolate, int rx_batch)
      : server(host, udp_port, tcp_port, depth, receivers), backend(mode, param, collectors) {
    if (!(spin_us >= 0.0 && spin_us <= 1e6))
      throw std::invalid_argument("spin_us must be in [0, 1e6]");
    if (!(slow_us > 0.0 && slow_us <= 1e7))
      throw std::invalid_argument("slow_us must be in (0, 1e7]");
    server.set_spin(std::int64_t(spin_us * 1000.0));
    server.set_offload(offload);
    server.set_pin(pin);
    server.set_trace(trace, slow_us);
    server.set_share(share);
    server.set_isolate(isolate);
    server.set_rx_batch(rx_batch);
    server.set_prepare([this](Model& m) { backend.prepare(m); });
  }
  ~Service() { stop(); }
  void start() { server.start(backend.workers()); }
  void stop() {
    server.stop();
    backend.stop();
  }
};

template <class Backend>
void bind_service(nanobind::module_& m, const char* doc) {
  namespace nb = nanobind;
  using namespace nb::literals;
  using S = Service<Backend>;
  nb::class_<S>(m, "Server", doc)
      .def(nb::init<const std::string&, int, int, std::size_t, const std::string&, int, int, int,
                    double, bool, bool, bool, double, int, bool, int>(),
           "host"_a, "udp_port"_a, "tcp_port"_a, "depth"_a, "mode"_a, "param"_a, "receivers"_a,
           "collectors"_a, "spin_us"_a, "offload"_a = false, "pin"_a = false, "trace"_a = false,
           "slow_us"_a = 200.0, "share"_a = 0, "isolate"_a = false, "rx_batch"_a = 64)
      .def("start", &S::start)
      .def("stop", &S::stop, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("udp_port", [](S& s) { return s.server.udp_port(); })
      .def_prop_ro("tcp_port", [](S& s) { return s.server.tcp_port(); })
      .def_prop_ro("info", [](S& s) { return s.backend.info(); })
      .def(
          "load_model",
          [](S& s, std::uint32_t id, int kind, int n, csk::HostVector<std::uint32_t> plus,
             csk::HostVector<std::uint32_t> minus, csk::HostVector<std::int32_t> degree,
             csk::HostVector<std::int8_t> j8, csk::HostVector<std::int32_t> h,
             std::int64_t jnorm2) {
            const std::size_t W = std::size_t(n + 31) / 32, rows = std::size_t(n) * W;
            csk::need(h.shape(0), std::size_t(n), "h");
            if (kind == kBinary || kind == kTernary) csk::need(plus.shape(0), rows, "plus");
            if (kind == kTernary) {
              csk::need(minus.shape(0), rows, "minus");
              csk::need(degree.shape(0), std::size_t(n), "degree");
            }
            if (kind == kInt8) csk::need(j8.shape(0), rows * 32, "j8");
            s.server.load_model(id, model_from_arrays(kind, n, plus.data(), minus.data(),
                                                      degree.data(), j8.data(), h.data(), jnorm2));
          },
          "model_id"_a, "kind"_a, "n"_a, "plus"_a, "minus"_a, "degree"_a, "j8"_a, "h"_a, "jnorm2"_a)
      .def("stats", [](S& s) {
        auto st = s.server.stats();
        s.backend.add_stats(st);
        return st;
      });
}

}  // namespace csk::dsb::service
