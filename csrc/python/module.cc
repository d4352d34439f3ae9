// The pybind11 module ringcomm._C: thin. Python passes raw addresses and enum values; every
// argument check that needs no tensor knowledge happens in C++ and surfaces as an exception.
// Each area's bindings are in bind_*.cc beside it (CUDA's in cuda/); this file makes the module
// and its errors.
#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "python/bindings.h"
#include "python/signal_check.h"
#include "ringcomm/error.h"

namespace py = pybind11;
using namespace ringcomm;

namespace {

void registerErrors(py::module_& m) {
  auto base = py::register_exception<Error>(m, "RingcommError", PyExc_RuntimeError);
  py::register_exception<TimeoutError>(m, "CommTimeoutError", base.ptr());
  py::register_exception<MismatchError>(m, "MismatchError", base.ptr());
  py::register_exception<PeerError>(m, "PeerError", base.ptr());
  // A wait ended by a signal's handler (Ctrl-C): Python gets what the handler raised
  // (KeyboardInterrupt, SystemExit), noted with where the wait was. Registered after the
  // translators above, so it is tried first.
  python::installSignalCheck();
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      std::rethrow_exception(thrown);
    } catch (const InterruptedError& e) {
      const std::string what = std::string("ringcomm: ") + e.what();
      if (!python::restoreHandlerException(what.c_str()))
        PyErr_SetString(PyExc_KeyboardInterrupt, what.c_str());
    }
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringcomm's C++ core: ring schedules, executor, CPU and CUDA backends";
  registerErrors(m);
  python::bindTables(m);
  python::bindPlans(m);
  python::bindRequest(m);
  python::bindTransports(m);
  python::bindCommunicator(m);
  python::bindTcp(m);
  python::bindRouterGate(m);
#ifdef RINGCOMM_WITH_CUDA
  python::bindCuda(m);
#endif
}
