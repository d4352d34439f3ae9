// The CUDA kernels that ship, executed on the CPU (csrc/testing/cuda/kernels_on_host.h) through
// the real CudaReducer and launch sizing, checked bit for bit against the CPU reducer: every
// dtype x op (AVG, bitwise and bool included), float32 on both 16-bit wires, the conversions,
// counts from 0 to past two full grid strides plus primes, NaN/Inf/-0 and random payloads, every
// operand offset independently by 0-15 bytes and the outputs aliased to the inputs as the ring
// aliases them. tests/test_kernels_on_host.py builds it twice: with AddressSanitizer and
// UndefinedBehaviorSanitizer, and with RC_WATCH_ACCESSES (the kernels compiled with
// -fsanitize=kernel-address, whose every load and store lands in the hooks below), which checks
// that every output byte is written exactly once and that nothing outside the operands is touched.
//
// Usage: sweep --sms N --resident R --nccl-sms K [--seed S] [--large-ops all|first]
// (K: SMs left to NCCL, the nccl_sms option; the test passes its default from ringcomm.options)
// Prints one summary line; exits 1 after listing the first failures.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_reducer.h"
#include "cuda/cuda_reducer.h"
#include "ringcomm/op_math.h"

namespace {

using namespace ringcomm;

struct Options {
  int sms = 1;
  int resident = 3;
  int ncclSms = -1;  // --nccl-sms, required
  uint64_t seed = 1;
  bool largeForEveryOp = true;  // the counts past two grid strides for every op, or the first
};

int failures = 0;
void fail(const std::string& text) {
  if (++failures <= 12) std::fprintf(stderr, "FAIL %s\n", text.c_str());
}

// -- operands -------------------------------------------------------------------------------------
// An operand sits `offset` bytes into an allocation of exactly offset + bytes, so AddressSanitizer
// sees any access past its end.
struct Buffer {
  std::unique_ptr<unsigned char[]> memory;
  size_t offset = 0, bytes = 0;
  unsigned char* data() const { return memory.get() + offset; }
  size_t total() const { return offset + bytes; }
};

Buffer makeBuffer(size_t offset, size_t bytes, std::mt19937_64& rng) {
  Buffer b;
  b.offset = offset;
  b.bytes = bytes;
  b.memory.reset(new unsigned char[offset + bytes]);
  for (size_t i = 0; i < offset + bytes; ++i) b.memory[i] = static_cast<unsigned char>(rng());
  return b;
}

Buffer copyOf(const Buffer& from) {
  Buffer b;
  b.offset = from.offset;
  b.bytes = from.bytes;
  b.memory.reset(new unsigned char[from.total()]);
  std::memcpy(b.memory.get(), from.memory.get(), from.total());
  return b;
}

// Values worth reducing: for floating types a mix of ordinary numbers, +-0, +-Inf, NaNs with
// payloads (quiet and signalling, both signs), subnormals and raw bit patterns.
template <typename Bits>
Bits floatBits(std::mt19937_64& rng, int mantissaBits, int exponentBits) {
  const int width = static_cast<int>(sizeof(Bits) * 8);
  const Bits sign = static_cast<Bits>(Bits(rng() & 1) << (width - 1));
  const Bits expMax = static_cast<Bits>((Bits(1) << exponentBits) - 1);
  const Bits mantMask = static_cast<Bits>((Bits(1) << mantissaBits) - 1);
  const Bits mant = static_cast<Bits>(rng()) & mantMask;
  const Bits bias = static_cast<Bits>(expMax >> 1);
  auto make = [&](Bits e, Bits m) { return static_cast<Bits>(sign | Bits(e << mantissaBits) | m); };
  switch (rng() % 16) {
    case 0: return make(0, 0);                          // +-0
    case 1: return make(expMax, 0);                     // +-Inf
    case 2: return make(expMax, mant | Bits(1));        // NaN with a payload
    case 3: return make(0, mant);                       // subnormal
    case 4: return static_cast<Bits>(rng());            // any bits
    default: {                                          // an ordinary number near 1
      const Bits e = static_cast<Bits>(bias - 8 + rng() % 17);
      return make(e, mant);
    }
  }
}

void fillValues(Buffer& b, DataType type, std::mt19937_64& rng) {
  const size_t n = b.bytes / dataTypeSize(type);
  unsigned char* p = b.data();
  for (size_t i = 0; i < n; ++i) {
    switch (type) {
      case DataType::Float32: {
        const uint32_t v = floatBits<uint32_t>(rng, 23, 8);
        std::memcpy(p + 4 * i, &v, 4);
        break;
      }
      case DataType::Float64: {
        const uint64_t v = floatBits<uint64_t>(rng, 52, 11);
        std::memcpy(p + 8 * i, &v, 8);
        break;
      }
      case DataType::Float16: {
        const uint16_t v = floatBits<uint16_t>(rng, 10, 5);
        std::memcpy(p + 2 * i, &v, 2);
        break;
      }
      case DataType::BFloat16: {
        const uint16_t v = floatBits<uint16_t>(rng, 7, 8);
        std::memcpy(p + 2 * i, &v, 2);
        break;
      }
      case DataType::Bool: p[i] = static_cast<unsigned char>(rng() & 1); break;
      default:  // integers: any bits
        for (size_t k = 0; k < dataTypeSize(type); ++k)
          p[i * dataTypeSize(type) + k] = static_cast<unsigned char>(rng());
    }
  }
}

// -- watching the kernels' memory accesses (RC_WATCH_ACCESSES) ------------------------------------
struct Watched {
  uintptr_t begin = 0, end = 0;  // the operand
  uintptr_t allocation = 0;      // its allocation starts here (the offset bytes before begin)
  bool written = false;          // an output: count the stores to each byte
  bool read = false;             // an input
  std::vector<uint32_t> stores;
  std::string name;
};
std::vector<Watched> watched;
std::string watchProblem;

void watch(const std::string& name, const Buffer& b, bool read, bool written) {
  for (Watched& w : watched)
    if (w.begin == reinterpret_cast<uintptr_t>(b.data())) {  // an alias: one operand, two roles
      w.read |= read;
      w.written |= written;
      w.name += "=" + name;
      return;
    }
  Watched w;
  w.begin = reinterpret_cast<uintptr_t>(b.data());
  w.end = w.begin + b.bytes;
  w.allocation = reinterpret_cast<uintptr_t>(b.memory.get());
  w.read = read;
  w.written = written;
  w.stores.assign(b.bytes, 0);
  w.name = name;
  watched.push_back(std::move(w));
}

[[maybe_unused]] void onAccess(uintptr_t address, size_t size, bool store) {
  if (!hostkern::inKernel() || !watchProblem.empty()) return;
  const uintptr_t end = address + size;
  for (Watched& w : watched) {
    if (address >= w.begin && end <= w.end) {
      if (store && !w.written) watchProblem = "a store into input " + w.name;
      if (!store && !w.read) watchProblem = "a load from output-only " + w.name;
      if (store)
        for (uintptr_t a = address; a < end; ++a) ++w.stores[a - w.begin];
      return;
    }
  }
  // The bytes before an operand in its allocation (its offset): AddressSanitizer cannot see an
  // access there, this can. Past the end, it can.
  for (const Watched& w : watched)
    if (end > w.allocation && address < w.begin)
      watchProblem = std::string(store ? "a store" : "a load") + " of " + std::to_string(size) +
                     " bytes " + std::to_string(w.begin - address) + " bytes before " + w.name;
}

// Every output byte written exactly once, and no stray access.
[[maybe_unused]] std::string watchVerdict() {
  if (!watchProblem.empty()) return watchProblem;
  for (const Watched& w : watched) {
    if (!w.written) continue;
    for (size_t i = 0; i < w.stores.size(); ++i)
      if (w.stores[i] != 1)
        return "byte " + std::to_string(i) + " of " + w.name + " written " +
               std::to_string(w.stores[i]) + " times";
  }
  return {};
}

}  // namespace

#ifdef RC_WATCH_ACCESSES
// The hooks -fsanitize=kernel-address calls (with asan-instrumentation-with-call-threshold=0)
// at every load and store of the kernels' translation units.
extern "C" {
#define RC_HOOK(size)                                                                     \
  void __asan_load##size##_noabort(uintptr_t a) { onAccess(a, size, false); }             \
  void __asan_store##size##_noabort(uintptr_t a) { onAccess(a, size, true); }
RC_HOOK(1)
RC_HOOK(2)
RC_HOOK(4)
RC_HOOK(8)
RC_HOOK(16)
#undef RC_HOOK
void __asan_loadN_noabort(uintptr_t a, size_t n) { onAccess(a, n, false); }
void __asan_storeN_noabort(uintptr_t a, size_t n) { onAccess(a, n, true); }
void __asan_handle_no_return() {}
}
#endif

namespace {

// -- one case -------------------------------------------------------------------------------------
// Where an output points: nowhere, its own buffer, or the input of its type (a: out0, b: out1).
enum class Out { None, Own, Input };
constexpr Out kOuts[] = {Out::None, Out::Own, Out::Input};

struct Case {
  bool convert = false;  // else reduce
  DataType type = DataType::Float32;
  DataType wire = DataType::Float32;  // != type: float32 data on a 16-bit wire
  RedOp op = RedOp::Sum;
  int divisor = 1;
  bool finalize = false;
  bool srcIsWire = false;  // convert
  size_t n = 0;
  Out out0 = Out::Own, out1 = Out::Own;

  std::string describe() const {
    auto outName = [](Out o) { return o == Out::None ? "null" : o == Out::Own ? "own" : "input"; };
    std::string s = convert ? "convert" : std::string("reduce ") + redOpName(op);
    s += std::string(" ") + dataTypeName(type);
    if (wire != type) s += std::string(" on ") + dataTypeName(wire);
    if (convert) s += srcIsWire ? " from wire" : " to wire";
    if (op == RedOp::Avg) s += " /" + std::to_string(divisor) + (finalize ? " final" : "");
    return s + " n=" + std::to_string(n) + " out0=" + outName(out0) + " out1=" + outName(out1);
  }
};

bool isNaN(const unsigned char* p, DataType type) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, dataTypeSize(type));
  switch (type) {
    case DataType::Float32: return (bits & 0x7fffffffu) > 0x7f800000u;
    case DataType::Float64: return (bits & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case DataType::Float16: return (bits & 0x7fffu) > 0x7c00u;
    case DataType::BFloat16: return (bits & 0x7fffu) > 0x7f80u;
    default: return false;
  }
}

std::string hex(const unsigned char* p, size_t size) {  // the element's value, most significant first
  static const char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (size_t k = size; k-- > 0;) s += {digits[p[k] >> 4], digits[p[k] & 15]};
  return s;
}

size_t randomOffset(std::mt19937_64& rng, size_t element) {
  return (rng() % 16) / element * element;  // 0-15 bytes, element-aligned as device buffers are
}

// Runs the case through the kernels (CudaReducer built for the host) and the CPU reducer on
// identical copies of the same operands; compares every byte of every allocation.
void runCase(const Case& c, const Options& o, std::mt19937_64& rng) {
  const size_t typeSize = dataTypeSize(c.type), wireSize = dataTypeSize(c.wire);
  // Roles: a in `type`, b in `wire` (reduce); src in one of them (convert).
  const bool aUsed = !c.convert || !c.srcIsWire;
  const bool bUsed = !c.convert || c.srcIsWire;
  std::vector<Buffer> kernel;  // a, b, out0, out1
  kernel.push_back(aUsed ? makeBuffer(randomOffset(rng, typeSize), c.n * typeSize, rng) : Buffer{});
  kernel.push_back(bUsed ? makeBuffer(randomOffset(rng, wireSize), c.n * wireSize, rng) : Buffer{});
  if (aUsed) fillValues(kernel[0], c.type, rng);
  if (bUsed) fillValues(kernel[1], c.wire, rng);
  kernel.push_back(c.out0 == Out::Own ? makeBuffer(randomOffset(rng, typeSize), c.n * typeSize, rng)
                                      : Buffer{});
  kernel.push_back(c.out1 == Out::Own ? makeBuffer(randomOffset(rng, wireSize), c.n * wireSize, rng)
                                      : Buffer{});
  std::vector<Buffer> reference;
  for (const Buffer& b : kernel) reference.push_back(b.memory ? copyOf(b) : Buffer{});

  auto pointers = [&](std::vector<Buffer>& bufs) {
    void* a = bufs[0].memory ? bufs[0].data() : nullptr;
    void* b = bufs[1].memory ? bufs[1].data() : nullptr;
    void* out0 = c.out0 == Out::Own ? bufs[2].data() : c.out0 == Out::Input ? a : nullptr;
    void* out1 = c.out1 == Out::Own ? bufs[3].data() : c.out1 == Out::Input ? b : nullptr;
    return std::vector<void*>{a, b, out0, out1};
  };
  const std::vector<void*> k = pointers(kernel), r = pointers(reference);
  const ReduceSpec spec{c.type, c.op, c.divisor, c.wire};

  watched.clear();
  watchProblem.clear();
  // A conversion's output at its source's own address already holds the result: never written.
  if (aUsed) watch("a", kernel[0], true, !c.convert && c.out0 == Out::Input);
  if (bUsed) watch("b", kernel[1], true, !c.convert && c.out1 == Out::Input);
  if (c.out0 == Out::Own) watch("out0", kernel[2], false, true);
  if (c.out1 == Out::Own) watch("out1", kernel[3], false, true);

  CudaReducer gpu(0, nullptr, o.ncclSms);
  CpuReducer cpu;
  try {
    if (c.convert) {
      const void* src = c.srcIsWire ? k[1] : k[0];
      gpu.convert(k[2], k[3], src, c.srcIsWire, c.n, spec);
      cpu.convert(r[2], r[3], c.srcIsWire ? r[1] : r[0], c.srcIsWire, c.n, spec);
    } else {
      gpu.reduce(k[2], k[3], k[0], k[1], c.n, spec, c.finalize);
      cpu.reduce(r[2], r[3], r[0], r[1], c.n, spec, c.finalize);
    }
  } catch (const std::exception& e) {
    fail(c.describe() + ": raised " + e.what());
    return;
  }
#ifdef RC_WATCH_ACCESSES
  // An output that is also an input is read and written in place: once each.
  if (std::string verdict = watchVerdict(); !verdict.empty())
    fail(c.describe() + ": " + verdict);
#endif
  const char* names[] = {"a", "b", "out0", "out1"};
  for (size_t i = 0; i < kernel.size(); ++i) {
    if (!kernel[i].memory) continue;
    const Buffer &got = kernel[i], &want = reference[i];
    if (std::memcmp(got.memory.get(), want.memory.get(), got.offset) != 0) {
      fail(c.describe() + ": the kernel wrote before " + names[i]);
      return;
    }
    const DataType type = i % 2 == 0 ? c.type : c.wire;
    // Arithmetic on NaN gives some NaN: which one is the hardware's choice (x86 keeps an
    // operand's payload, a GPU writes the canonical NaN), so a NaN result matches any NaN.
    // Conversions move NaNs bit for bit.
    const bool anyNaN = !c.convert && isFloatingPoint(type);
    const size_t size = dataTypeSize(type);
    for (size_t e = 0; e < got.bytes / size; ++e) {
      const unsigned char* g = got.data() + e * size;
      const unsigned char* w = want.data() + e * size;
      if (std::memcmp(g, w, size) == 0 || (anyNaN && isNaN(g, type) && isNaN(w, type))) continue;
      fail(c.describe() + ": " + names[i] + "[" + std::to_string(e) + "] is " + hex(g, size) +
           ", the CPU reducer's " + hex(w, size) + " (offset " + std::to_string(got.offset) + ")");
      return;
    }
  }
}

// -- the sweep ------------------------------------------------------------------------------------
// Awkward small counts, then around one and past two grid strides (all of them when `every`,
// else the two that matter most: a big grid's strides are millions of elements).
std::vector<size_t> counts(size_t gridStride, bool every) {
  std::vector<size_t> n = {0, 1, 2, 3, 5, 7, 8, 9, 13, 15, 16, 17, 31, 32, 33, 63, 64, 65,
                           127, 129, 255, 257, 509, 1021, 4093};
  if (every)
    n.insert(n.end(), {gridStride - 1, gridStride, gridStride + 1, 2 * gridStride + 7,
                       2 * gridStride + 31});
  else
    n.insert(n.end(), {gridStride - 1, 2 * gridStride + 7});
  return n;
}

// Elements one pass of the grid covers: blocks x threads x elements per vector x unroll (the
// largest of the kernels'), from the same sizing rule the launch uses.
size_t gridStrideElements(const Options& o, size_t elementSize) {
  const int usable = std::max(o.sms - o.ncclSms, 1);
  const size_t blocks = static_cast<size_t>(usable) * o.resident;
  return blocks * 256 * (16 / elementSize) * 4;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--sms") o.sms = std::stoi(value);
    else if (key == "--resident") o.resident = std::stoi(value);
    else if (key == "--seed") o.seed = std::stoull(value);
    else if (key == "--nccl-sms") o.ncclSms = std::stoi(value);
    else if (key == "--large-ops") o.largeForEveryOp = value == "all";
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  if (o.ncclSms < 0) {
    std::fprintf(stderr, "--nccl-sms is required\n");
    return 2;
  }
  hostkern::deviceProperties() = {o.sms, o.resident};
  hostkern::setShuffleSeed(o.seed);
  std::mt19937_64 rng(o.seed);

  size_t cases = 0, elements = 0;
  auto run = [&](const Case& c) {
    runCase(c, o, rng);
    ++cases;
    elements += c.n;
  };
  // Every output pattern at small counts; at large ones one pattern per case, in turn.
  auto forCounts = [&](Case c, size_t elementSize, bool large) {
    int turn = 0;
    for (size_t n : counts(gridStrideElements(o, elementSize), o.largeForEveryOp)) {
      const bool small = n < 4096;
      if (!small && !large) continue;
      c.n = n;
      for (Out out0 : kOuts)
        for (Out out1 : kOuts) {
          if (out0 == Out::None && out1 == Out::None) continue;
          if (c.convert && ((c.srcIsWire && out0 == Out::Input) ||
                            (!c.srcIsWire && out1 == Out::Input)))
            continue;  // an output aliases the source only in the source's own type
          if (!small && turn++ % 8 != 0) continue;
          c.out0 = out0;
          c.out1 = out1;
          run(c);
        }
    }
  };

  for (const DataTypeInfo& t : kDataTypes) {
    bool firstOp = true;
    for (const RedOpInfo& op : kRedOps) {
      if (!opSupported(op.op, t.type)) continue;
      Case c;
      c.type = c.wire = t.type;
      c.op = op.op;
      const bool large = o.largeForEveryOp || firstOp;
      firstOp = false;
      if (op.op == RedOp::Avg) {
        for (int divisor : {3, 8})
          for (bool finalize : {false, true}) {
            c.divisor = divisor;
            c.finalize = finalize;
            forCounts(c, t.size, large);
          }
      } else {
        forCounts(c, t.size, large);
      }
    }
  }
  for (DataType wire : {DataType::BFloat16, DataType::Float16}) {
    for (RedOp op : {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::Avg}) {
      Case c;
      c.type = DataType::Float32;
      c.wire = wire;
      c.op = op;
      c.divisor = 3;
      c.finalize = op == RedOp::Avg;
      forCounts(c, 2, o.largeForEveryOp || op == RedOp::Sum);
    }
    for (bool srcIsWire : {false, true}) {
      Case c;
      c.convert = true;
      c.type = DataType::Float32;
      c.wire = wire;
      c.srcIsWire = srcIsWire;
      forCounts(c, 2, true);
    }
  }

  const hostkern::GridStats grids = hostkern::gridStats();
  std::printf("sms=%d resident=%d nccl_sms=%d seed=%llu: %zu cases, %zu elements, %llu launches, "
              "largest grid %u blocks, %llu threads run, %d failed\n",
              o.sms, o.resident, o.ncclSms, static_cast<unsigned long long>(o.seed), cases,
              elements, static_cast<unsigned long long>(grids.launches), grids.maxBlocks,
              static_cast<unsigned long long>(grids.threadsRun), failures);
  return failures == 0 ? 0 : 1;
}
