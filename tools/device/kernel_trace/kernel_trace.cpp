// A kernel timeline for the device machine, which has no nsys: a CUPTI injection library. With
// CUDA_INJECTION64_PATH=<path>/libossrt_ktrace.so in its environment, a CUDA process (ossrt, a test)
// loads this library when the driver initializes and calls InitializeInjection(); CUPTI's concurrent-
// kernel activity then records every kernel's GPU start and end, kernels of CUDA graphs included and
// programmatic dependent launch's overlap intact (this kind does not serialize kernels, unlike
// CUPTI_ACTIVITY_KIND_KERNEL). Records are appended as CSV to $OSSRT_KTRACE_OUT (default
// ./ktrace.csv) as CUPTI hands over its buffers, and the rest at exit:
//   start_ns,end_ns,stream,graph,grid,block,name
// (GPU timestamps in ns; graph 0 = launched outside a graph; grid "x.y.z"; name demangled).
// tools/device/ktrace_summary.py turns it into what each kernel adds to a decode step.
// Build (CPU machine): tools/device/kernel_trace/build.sh.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

constexpr size_t kBufferBytes = 8u << 20;  // ~40,000 kernel records a buffer

std::mutex g_mutex;
FILE* g_out = nullptr;

std::string readable_name(const char* mangled) {
  if (!mangled) return "?";
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  for (const char* noise : {"ossrt::cuda::", "(anonymous namespace)::"})
    for (size_t at; (at = name.find(noise)) != std::string::npos;) name.erase(at, std::strlen(noise));
  for (char& ch : name)
    if (ch == '"') ch = '\'';  // CSV: the name is quoted
  return name;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::fprintf(g_out, "%llu,%llu,%u,%u,%d.%d.%d,%d,\"%s\"\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end), k->streamId, k->graphId, k->gridX, k->gridY, k->gridZ,
                 k->blockX, readable_name(k->name).c_str());
  }
  if (g_out) std::fflush(g_out);
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("OSSRT_KTRACE_OUT");
  g_out = std::fopen(path ? path : "ktrace.csv", "w");
  if (!g_out) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path ? path : "ktrace.csv");
    return 0;
  }
  std::fprintf(g_out, "start_ns,end_ns,stream,graph,grid,block,name\n");
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity\n");
    return 0;
  }
  std::atexit(flush_at_exit);
  return 1;
}
