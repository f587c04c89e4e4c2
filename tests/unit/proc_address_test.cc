// Tests of cuGetProcAddress resolution (client/proc_address.h) over the generated table,
// of the weak "not supported yet" stubs, and of the traced wrappers that report driver
// calls to a hook (client/driver_trace.h).
//
// Owns: these tests only. Must not touch the library's state beyond what a driver caller
// could (lookups, calling stubs); it links the objects of `flyt_driver_api` directly.
//
// CMake (tests/unit/CMakeLists.txt), after src/client/driver_api.cmake has been included:
//   add_executable(proc_address_test proc_address_test.cc)
//   target_link_libraries(proc_address_test PRIVATE flyt_driver_api <common/log.h impl>
//                         GTest::gtest_main ${CMAKE_DL_LIBS})
//   set_target_properties(proc_address_test PROPERTIES ENABLE_EXPORTS ON)  # for dlsym()
//   gtest_discover_tests(proc_address_test)
#include "client/proc_address.h"

#include <cupti_driver_cbid.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/driver_trace.h"
#include "driver_impl_names.h"  // as client/client.h: these define flyt_impl_<name>

// A real entry point: a strong definition must win over the generated weak stub.
extern "C" __attribute__((visibility("default"))) CUresult CUDAAPI cuInit(unsigned int flags) {
  return flags == 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;  // marker value
}

// The context a traced call reports.
extern "C" __attribute__((visibility("default"))) CUresult CUDAAPI cuCtxGetCurrent(CUcontext* c) {
  *c = reinterpret_cast<CUcontext>(0x1234);
  return CUDA_SUCCESS;
}

namespace flyt::client {
namespace {

// Log to stderr at warn level, whatever the environment says (read lazily by common/log).
class LogEnvironment : public testing::Environment {
 public:
  void SetUp() override {
    unsetenv("FLYT_LOG_FILE");
    setenv("FLYT_LOG", "warn", 1);
  }
};
const testing::Environment* const kLogEnv = testing::AddGlobalTestEnvironment(new LogEnvironment);

void* Exported(const char* symbol) { return dlsym(RTLD_DEFAULT, symbol); }

struct Result {
  CUresult rc;
  void* pfn;
  CUdriverProcAddressQueryResult found;
};

Result Lookup(const char* symbol, int version, unsigned long long flags) {
  Result r{CUDA_ERROR_UNKNOWN, reinterpret_cast<void*>(1),
           static_cast<CUdriverProcAddressQueryResult>(-1)};
  r.rc = LookupDriverProc(symbol, version, flags, &r.pfn, &r.found);
  return r;
}

// Expects `symbol`@`version` with `flags` to resolve to the exported function `expected`.
void ExpectResolves(const char* symbol, int version, unsigned long long flags,
                    const char* expected) {
  SCOPED_TRACE(std::string(symbol) + "@" + std::to_string(version) +
               " flags=" + std::to_string(flags));
  void* want = Exported(expected);
  ASSERT_NE(want, nullptr) << expected << " is not exported";
  Result r = Lookup(symbol, version, flags);
  EXPECT_EQ(r.rc, CUDA_SUCCESS);
  EXPECT_EQ(r.found, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(r.pfn, want);
  Dl_info info;
  ASSERT_NE(dladdr(r.pfn, &info), 0);
  EXPECT_STREQ(info.dli_sname, expected);
}

int CountOccurrences(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + 1)) {
    ++n;
  }
  return n;
}

TEST(ProcAddressTable, IsSortedCompleteAndExported) {
  ASSERT_GT(kDriverProcTableSize, 600u);
  for (std::size_t i = 0; i < kDriverProcTableSize; ++i) {
    const DriverProcEntry& e = kDriverProcTable[i];
    SCOPED_TRACE(e.symbol);
    ASSERT_NE(e.fn, nullptr);
    EXPECT_EQ(e.fn, Exported(e.symbol));  // the table and dlsym agree
    if (i == 0) continue;
    const DriverProcEntry& p = kDriverProcTable[i - 1];
    int c = std::strcmp(p.base, e.base);
    ASSERT_LE(c, 0);
    if (c == 0) {
      ASSERT_TRUE(p.per_thread < e.per_thread ||
                  (p.per_thread == e.per_thread && p.version < e.version));
      EXPECT_NE(p.fn, e.fn);  // every ABI is its own function
    }
  }
}

TEST(ProcAddress, PicksHighestAbiNotAboveVersion) {
  ExpectResolves("cuMemAlloc", 2000, 0, "cuMemAlloc");
  ExpectResolves("cuMemAlloc", 3010, 0, "cuMemAlloc");
  ExpectResolves("cuMemAlloc", 3020, 0, "cuMemAlloc_v2");
  ExpectResolves("cuMemAlloc", 13000, 0, "cuMemAlloc_v2");
  ExpectResolves("cuCtxGetDevice", 2000, 0, "cuCtxGetDevice");
  ExpectResolves("cuCtxGetDevice", 12090, 0, "cuCtxGetDevice");
  ExpectResolves("cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2");
  ExpectResolves("cuGetProcAddress", 11030, 0, "cuGetProcAddress");
  ExpectResolves("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2");
  ExpectResolves("cuCtxCreate", 11040, 0, "cuCtxCreate_v3");
  ExpectResolves("cuCtxCreate", 13000, 0, "cuCtxCreate_v4");
  // cuda.h #defines cuGraphInstantiate to cuGraphInstantiateWithFlags; the driver does not.
  ExpectResolves("cuGraphInstantiate", 13000, 0, "cuGraphInstantiate_v2");
}

TEST(ProcAddress, PerThreadVariantsAreDistinctFromLegacy) {
  ExpectResolves("cuMemcpyHtoD", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                 "cuMemcpyHtoD_v2_ptds");
  ExpectResolves("cuMemcpyHtoD", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemcpyHtoD_v2");
  ExpectResolves("cuMemcpyAsync", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                 "cuMemcpyAsync_ptsz");
  ExpectResolves("cuMemcpyAsync", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemcpyAsync");
  ExpectResolves("cuStreamGetCaptureInfo", 11030, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                 "cuStreamGetCaptureInfo_v2_ptsz");
  ExpectResolves("cuLaunchKernel", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                 "cuLaunchKernel_ptsz");
  // Both bits: per-thread wins (as the driver does).
  ExpectResolves("cuMemcpyAsync", 13000, 3, "cuMemcpyAsync_ptsz");
  // DEFAULT behaves like LEGACY_STREAM.
  ExpectResolves("cuMemcpyAsync", 13000, CU_GET_PROC_ADDRESS_DEFAULT, "cuMemcpyAsync");
  ExpectResolves("cuLaunchKernel", 13000, CU_GET_PROC_ADDRESS_DEFAULT, "cuLaunchKernel");
  // Names without per-thread ABIs answer the same with either flag.
  ExpectResolves("cuMemAlloc", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                 "cuMemAlloc_v2");

  EXPECT_NE(Lookup("cuMemcpyAsync", 13000, 2).pfn, Lookup("cuMemcpyAsync", 13000, 1).pfn);
  EXPECT_NE(Lookup("cuMemcpyHtoD", 13000, 2).pfn, Lookup("cuMemcpyHtoD", 13000, 0).pfn);
}

TEST(ProcAddress, PerThreadNeverFallsBackToLegacy) {
  // cuMemcpyHtoD has legacy ABIs from 2000 but per-thread ones only from 7000.
  Result r = Lookup("cuMemcpyHtoD", 6050, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  EXPECT_EQ(r.rc, CUDA_SUCCESS);
  EXPECT_EQ(r.found, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(r.pfn, nullptr);
}

TEST(ProcAddress, UnknownAndSuffixedNamesAreNotFound) {
  for (const char* name : {"cuNoSuchFunction", "", "cuMemAlloc_v2", "cuMemcpyAsync_ptsz",
                           "cuMemcpyHtoD_v2_ptds", "cuGetProcAddress_v2", "cumemalloc"}) {
    SCOPED_TRACE(name);
    for (unsigned long long flags : {0ull, 1ull, 2ull}) {
      Result r = Lookup(name, 13000, flags);
      EXPECT_EQ(r.rc, CUDA_SUCCESS);
      EXPECT_EQ(r.found, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
      EXPECT_EQ(r.pfn, nullptr);
    }
  }
}

TEST(ProcAddress, VersionBelowFirstAbiIsNotSufficient) {
  for (int version : {0, 999, 1000}) {
    Result r = Lookup("cuMemAlloc", version, 0);
    EXPECT_EQ(r.rc, CUDA_SUCCESS);
    EXPECT_EQ(r.found, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    EXPECT_EQ(r.pfn, nullptr);
  }
  Result r = Lookup("cuGetProcAddress", 11020, 0);  // introduced in 11.3
  EXPECT_EQ(r.found, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(r.pfn, nullptr);
}

TEST(ProcAddress, NegativeVersionMeansNewest) {
  ExpectResolves("cuMemAlloc", -1, 0, "cuMemAlloc_v2");
  ExpectResolves("cuMemcpyHtoD", -1, 2, "cuMemcpyHtoD_v2_ptds");
}

TEST(ProcAddress, InvalidArgumentsLeaveOutputsAlone) {
  void* pfn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult found = static_cast<CUdriverProcAddressQueryResult>(7);
  for (unsigned long long flags : {4ull, 8ull, 1ull << 32}) {
    EXPECT_EQ(LookupDriverProc("cuMemAlloc", 13000, flags, &pfn, &found), CUDA_ERROR_INVALID_VALUE);
  }
  EXPECT_EQ(LookupDriverProc("cuMemAlloc", 13010, 0, &pfn, &found, 13000),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(LookupDriverProc(nullptr, 13000, 0, &pfn, &found), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(pfn, reinterpret_cast<void*>(1));
  EXPECT_EQ(found, static_cast<CUdriverProcAddressQueryResult>(7));
  EXPECT_EQ(LookupDriverProc("cuMemAlloc", 13000, 0, nullptr, &found), CUDA_ERROR_INVALID_VALUE);
  // Without a driver version (0) any version is accepted; `found` is optional.
  EXPECT_EQ(LookupDriverProc("cuMemAlloc", 99999, 0, &pfn, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(pfn, Exported("cuMemAlloc_v2"));
  EXPECT_EQ(LookupDriverProc("cuMemAlloc", 13000, 0, &pfn, nullptr, 13000), CUDA_SUCCESS);
}

TEST(ProcAddress, StrongDefinitionReplacesStub) {
  Result r = Lookup("cuInit", 13000, 0);
  ASSERT_EQ(r.found, CU_GET_PROC_ADDRESS_SUCCESS);
  // The exported wrapper, which calls the definition above.
  EXPECT_EQ(r.pfn, Exported("cuInit"));
  EXPECT_NE(r.pfn, reinterpret_cast<void*>(&cuInit));
  testing::internal::CaptureStderr();
  EXPECT_EQ(reinterpret_cast<CUresult (*)(unsigned int)>(r.pfn)(0), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(ProcAddress, StubReturnsNotSupportedAndLogsOnce) {
  Result r = Lookup("cuMemAlloc", 13000, 0);
  ASSERT_EQ(r.found, CU_GET_PROC_ADDRESS_SUCCESS);
  auto stub = reinterpret_cast<int (*)(void)>(r.pfn);
  testing::internal::CaptureStderr();
  EXPECT_EQ(stub(), 801);
  EXPECT_EQ(stub(), CUDA_ERROR_NOT_SUPPORTED);
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(CountOccurrences(log, "cuMemAlloc_v2 is not supported by Flyt yet"), 1) << log;
}

TEST(ProcAddress, StubLogsOnceAcrossThreads) {
  auto stub = reinterpret_cast<int (*)(void)>(Exported("cuMemcpyAsync_ptsz"));
  ASSERT_NE(stub, nullptr);
  testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  std::vector<int> results(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&results, stub, t] {
      for (int i = 0; i < 100; ++i) results[t] |= stub();
    });
  }
  for (std::thread& t : threads) t.join();
  std::string log = testing::internal::GetCapturedStderr();
  for (int rc : results) EXPECT_EQ(rc, 801);
  EXPECT_EQ(CountOccurrences(log, "cuMemcpyAsync_ptsz is not supported by Flyt yet"), 1) << log;
  EXPECT_EQ(ReportUnsupported("cuMemcpyAsync_ptsz"), 801);  // still answers after logging
}

// What a driver-API hook saw of one report.
struct Report {
  uint32_t cbid, site, correlation_id;
  std::string name;
  unsigned flags = 0;  // cuInit's Flags, from its params
  int result = -1;     // at exit
  CUcontext context = nullptr;
  uint64_t correlation_data = 0;
};
std::vector<Report>* g_reports = nullptr;

void Hook(profiler::DriverCallRecord* rec) {
  Report r{rec->cbid, rec->site, rec->correlation_id, rec->function_name};
  if (rec->params != nullptr) r.flags = *static_cast<const unsigned*>(rec->params);
  if (rec->return_value != nullptr) r.result = *rec->return_value;
  r.context = rec->context;
  r.correlation_data = rec->correlation_data;
  if (rec->site == 0) {  // the hook's own fields and correlation data last to the exit
    rec->correlation_id = 77;
    rec->correlation_data = 0xC0DE;
  }
  g_reports->push_back(r);
}

TEST(DriverTrace, WrapperReportsEnterAndExitWhileHookIsSet) {
  std::vector<Report> reports;
  g_reports = &reports;
  auto init = reinterpret_cast<CUresult (*)(unsigned int)>(Exported("cuInit"));
  ASSERT_NE(init, nullptr);
  EXPECT_EQ(init(0), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_TRUE(reports.empty());  // no hook: nothing reported
  SetDriverApiHook(Hook);
  EXPECT_EQ(init(0), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(init(3), CUDA_SUCCESS);
  SetDriverApiHook(nullptr);
  EXPECT_EQ(init(0), CUDA_ERROR_INVALID_DEVICE);
  ASSERT_EQ(reports.size(), 4u);
  for (size_t i = 0; i < reports.size(); ++i) {
    const Report& r = reports[i];
    EXPECT_EQ(r.cbid, static_cast<uint32_t>(CUPTI_DRIVER_TRACE_CBID_cuInit));
    EXPECT_EQ(r.name, "cuInit");
    EXPECT_EQ(r.site, i % 2);
    EXPECT_EQ(r.flags, i < 2 ? 0u : 3u);
    EXPECT_EQ(r.context, reinterpret_cast<CUcontext>(0x1234));
  }
  EXPECT_EQ(reports[0].result, CUDA_SUCCESS);  // not the call's yet at enter
  EXPECT_EQ(reports[1].result, CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(reports[3].result, CUDA_SUCCESS);
  EXPECT_EQ(reports[1].correlation_id, 77u);
  EXPECT_EQ(reports[1].correlation_data, 0xC0DEu);
  EXPECT_EQ(reports[2].correlation_data, 0u);  // a new call starts clean
}

TEST(DriverTrace, FlytsOwnCallsAreNotReported) {
  // The client's own calls use the implementation's name: not the wrapper.
  std::vector<Report> reports;
  g_reports = &reports;
  SetDriverApiHook(Hook);
  EXPECT_EQ(cuInit(0), CUDA_ERROR_INVALID_DEVICE);
  SetDriverApiHook(nullptr);
  EXPECT_TRUE(reports.empty());
}

}  // namespace
}  // namespace flyt::client
