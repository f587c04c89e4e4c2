// cupti_callbacks: CUPTI's callback API and API activity records as tools use them
// (NVIDIA's callback_timestamp and activity_trace_async samples, Kineto's runtime
// rows): a subscriber on the runtime and driver API domains, enter and exit of
// each call with its name, parameters, return value and correlation data, and
// RUNTIME/DRIVER activity records whose correlation ids match the GPU work's.
// Natively with NVIDIA's libcupti (E2E_CUPTI=path); through Flyt, `flyt run`
// preloads Flyt's. Prints key=value lines the e2e test and the GPU comparison check.
// `cupti_callbacks driver` adds the driver API domain and its keys: callbacks of the
// driver calls enabled (cuMemcpyHtoD_v2 and cuLaunchKernel, made by cudart inside
// runtime calls and by the program; cuDeviceGet, made by the program with a bad ordinal
// and by a callback), their parameters, return values, contexts and kernel names, one
// enabled and disabled again (cuCtxSynchronize: never delivered), DRIVER records with
// the correlation ids of the callbacks and of the GPU work, one call left out of them
// (cuptiActivityEnableDriverApi), and cuptiGetCallbackName. `cupti_callbacks
// driver_all` enables the whole driver domain instead and prints how often each driver
// call was reported during the work (cudart's and the program's; a native run and a
// Flyt run must report the same calls), whether enter and exit nest properly, and
// whether each reported call has its DRIVER record. CUPTI_CB_VERBOSE=1 also logs every
// callback's fields to stderr.
#include <cupti.h>
#include <dlfcn.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "e2e_common.h"
#include "e2e_cupti.h"
#include "e2e_driver.h"

namespace {

struct Api {
  decltype(&cuptiSubscribe) subscribe;
  decltype(&cuptiUnsubscribe) unsubscribe;
  decltype(&cuptiEnableDomain) enable_domain;
  decltype(&cuptiEnableCallback) enable_callback;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks;
  decltype(&cuptiActivityEnable) enable;
  decltype(&cuptiActivityFlushAll) flush_all;
  decltype(&cuptiActivityGetNextRecord) next_record;
  decltype(&cuptiActivityEnableDriverApi) enable_driver_records;
  decltype(&cuptiGetCallbackName) callback_name;
} g;

// One callback as the app saw it.
struct Call {
  std::string name;
  int domain = 0;
  uint32_t cbid = 0, correlation = 0;
  int site = 0;
  bool data_kept = true;  // exit saw what enter wrote into correlationData
  CUcontext context = nullptr;
  uint32_t context_uid = 0;
  int result = -1;  // the return value at exit
  std::string symbol;
};
std::vector<Call> g_calls;
bool g_recording = false;
bool g_verbose = false;
size_t g_memcpy_count = 0;     // cudaMemcpy's count, read from its params at enter
int g_memcpy_kind = -1;        // and its kind
size_t g_htod_bytes = 0;       // cuMemcpyHtoD_v2's ByteCount, read at enter
int g_malloc_result_ok = 0;    // cudaMalloc's return value at exit, and the pointer written
CUdeviceptr g_launch_arg = 0;  // cuLaunchKernel's f and grid, read at enter
unsigned g_launch_grid = 0;
int g_device_get_ordinal = -1;  // cuDeviceGet's ordinal at enter (the failing call's)
// Set for the program's own launch: its enter callback calls cuDeviceGet, whose
// callbacks arrive inside it (counted in g_nested_callbacks).
bool g_nest = false;
decltype(&::cuDeviceGet) g_device_get = nullptr;
size_t g_nested_callbacks = 0;
int g_nested_result = -1;

struct Record {
  CUpti_ActivityKind kind = CUPTI_ACTIVITY_KIND_INVALID;
  uint32_t cbid = 0, correlation = 0;
  uint64_t start = 0, end = 0;
  std::string name;
  int result = 0;  // API records' returnValue
};
std::vector<Record> g_records;

void CUPTIAPI OnCallback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                         const void* data) {
  if (!g_recording) return;
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  Call c;
  c.name = info->functionName != nullptr ? info->functionName : "";
  c.domain = domain;
  c.cbid = cbid;
  c.site = info->callbackSite;
  c.correlation = info->correlationId;
  if (g_verbose)
    fprintf(stderr,
            "cb domain=%d cbid=%u site=%d name=%s info=%p params=%p ret=%p symbol=%p ctx=%p "
            "uid=%u cdata=%p corr=%u\n",
            domain, cbid, c.site, c.name.c_str(), data, info->functionParams,
            info->functionReturnValue, static_cast<const void*>(info->symbolName),
            static_cast<void*>(info->context), info->contextUid,
            static_cast<void*>(info->correlationData), info->correlationId);
  if (info->callbackSite == CUPTI_API_ENTER) {
    *info->correlationData = 0xC0DE0000ull + cbid;
  } else {
    c.data_kept = *info->correlationData == 0xC0DE0000ull + cbid;
  }
  c.context = info->context;
  c.context_uid = info->contextUid;
  if (info->symbolName != nullptr) c.symbol = info->symbolName;
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API && c.site == CUPTI_API_EXIT &&
      info->functionReturnValue != nullptr)
    c.result = *static_cast<const CUresult*>(info->functionReturnValue);
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020 && c.site == CUPTI_API_ENTER) {
      auto* p = static_cast<const cudaMemcpy_v3020_params*>(info->functionParams);
      g_memcpy_count = p->count;
      g_memcpy_kind = p->kind;
    }
    if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020 && c.site == CUPTI_API_EXIT) {
      auto* p = static_cast<const cudaMalloc_v3020_params*>(info->functionParams);
      auto* ret = static_cast<const cudaError_t*>(info->functionReturnValue);
      g_malloc_result_ok = *ret == cudaSuccess && *p->devPtr != nullptr;
    }
  } else {
    if (cbid == CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2 && c.site == CUPTI_API_ENTER)
      g_htod_bytes = static_cast<const cuMemcpyHtoD_v2_params*>(info->functionParams)->ByteCount;
    if (cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel && c.site == CUPTI_API_ENTER) {
      auto* p = static_cast<const cuLaunchKernel_params*>(info->functionParams);
      g_launch_grid = p->gridDimX * p->gridDimY * p->gridDimZ;
      g_launch_arg = p->f != nullptr;
      if (g_nest) {  // a driver call from inside a callback is reported too
        g_nest = false;
        size_t before = g_calls.size();
        CUdevice d = -1;
        g_nested_result = g_device_get(&d, 0);
        g_nested_callbacks = g_calls.size() - before;
      }
    }
    if (cbid == CUPTI_DRIVER_TRACE_CBID_cuDeviceGet && c.site == CUPTI_API_ENTER &&
        static_cast<const cuDeviceGet_params*>(info->functionParams)->ordinal != 0)
      g_device_get_ordinal = static_cast<const cuDeviceGet_params*>(info->functionParams)->ordinal;
  }
  g_calls.push_back(c);
}

void CUPTIAPI Requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 1 << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI Completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  while (g.next_record(buffer, valid, &r) == CUPTI_SUCCESS) {
    Record rec;
    rec.kind = r->kind;
    if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME || r->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      auto* a = reinterpret_cast<CUpti_ActivityAPI*>(r);
      rec.cbid = a->cbid, rec.correlation = a->correlationId, rec.start = a->start;
      rec.end = a->end;
      rec.result = static_cast<int>(a->returnValue);
    } else if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(r);
      rec.correlation = k->correlationId, rec.start = k->start, rec.end = k->end;
      rec.name = k->name != nullptr ? k->name : "";
    } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(r);
      rec.correlation = m->correlationId, rec.start = m->start, rec.end = m->end;
    } else {
      continue;
    }
    g_records.push_back(rec);
  }
  free(buffer);
}

__global__ void cupti_cb_kernel(int* out) { out[blockIdx.x * blockDim.x + threadIdx.x] = 2; }

// The calls of one domain with one name, in order.
std::vector<const Call*> Named(int domain, const std::string& name) {
  std::vector<const Call*> out;
  for (const Call& c : g_calls)
    if (c.domain == domain && c.name == name) out.push_back(&c);
  return out;
}

// enter/exit pairs of a call: sites alternate, each pair shares its correlation id and
// kept its correlation data.
void PrintPairs(const char* key, int domain, const std::string& name) {
  auto calls = Named(domain, name);
  bool paired = calls.size() % 2 == 0 && !calls.empty();
  for (size_t i = 0; paired && i + 1 < calls.size(); i += 2)
    paired = calls[i]->site == CUPTI_API_ENTER && calls[i + 1]->site == CUPTI_API_EXIT &&
             calls[i]->correlation == calls[i + 1]->correlation && calls[i]->correlation != 0 &&
             calls[i + 1]->data_kept;
  printf("%s.calls=%zu\n%s.paired=%d\n", key, calls.size() / 2, key, paired ? 1 : 0);
}

uint32_t FirstCorrelation(int domain, const std::string& name) {
  auto calls = Named(domain, name);
  return calls.empty() ? 0 : calls.front()->correlation;
}

// The records of one kind (and, for API records, one callback id) with a correlation id.
int CountRecords(CUpti_ActivityKind kind, uint32_t cbid, uint32_t correlation) {
  int n = 0;
  for (const Record& r : g_records)
    n += r.kind == kind && correlation != 0 && r.correlation == correlation &&
         (cbid == 0 || r.cbid == cbid);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  const bool driver = argc > 1 && std::string(argv[1]) == "driver";
  const bool driver_all = argc > 1 && std::string(argv[1]) == "driver_all";
  e2e::Init("cupti_callbacks");
  g_verbose = getenv("CUPTI_CB_VERBOSE") != nullptr;
  CK(cudaFree(nullptr));
  printf("under_flyt=%d\n", e2e::UnderFlyt() ? 1 : 0);
  decltype(&::cuMemcpyHtoD_v2) memcpy_htod = nullptr;
  decltype(&::cuLaunchKernel) launch = nullptr;
  decltype(&::cuCtxSynchronize) ctx_sync = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  e2e::ResolveDriver("cuMemcpyHtoD", &memcpy_htod);
  e2e::ResolveDriver("cuLaunchKernel", &launch);
  e2e::ResolveDriver("cuCtxSynchronize", &ctx_sync, 12000);  // 13000: the _v2 with a context
  e2e::ResolveDriver("cuGetErrorName", &e2e::g_error_name);
  e2e::ResolveDriver("cuDeviceGet", &g_device_get);
  e2e::ResolveDriver("cuCtxGetCurrent", &ctx_get_current);
  CUcontext ctx = nullptr;
  CU(ctx_get_current(&ctx));
  e2e::Step("dlopen libcupti");
  void* lib = e2e::OpenCupti();
  e2e::ResolveCupti(lib, "cuptiSubscribe", &g.subscribe);
  e2e::ResolveCupti(lib, "cuptiUnsubscribe", &g.unsubscribe);
  e2e::ResolveCupti(lib, "cuptiEnableDomain", &g.enable_domain);
  e2e::ResolveCupti(lib, "cuptiEnableCallback", &g.enable_callback);
  e2e::ResolveCupti(lib, "cuptiActivityRegisterCallbacks", &g.register_callbacks);
  e2e::ResolveCupti(lib, "cuptiActivityEnable", &g.enable);
  e2e::ResolveCupti(lib, "cuptiActivityFlushAll", &g.flush_all);
  e2e::ResolveCupti(lib, "cuptiActivityGetNextRecord", &g.next_record);
  e2e::ResolveCupti(lib, "cuptiActivityEnableDriverApi", &g.enable_driver_records);
  e2e::ResolveCupti(lib, "cuptiGetCallbackName", &g.callback_name);

  e2e::Step("subscribe");
  CUpti_SubscriberHandle sub = nullptr;
  CUPTI(g.subscribe(&sub, OnCallback, nullptr));
  if (getenv("CUPTI_CB_ONLY_MEMCPY") != nullptr)  // probing which switches a tool sets
    CUPTI(g.enable_callback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API,
                            CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020));
  else
    CUPTI(g.enable_domain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API));
  if (driver) {
    for (CUpti_CallbackId cbid :
         {CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
          CUPTI_DRIVER_TRACE_CBID_cuDeviceGet, CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize})
      CUPTI(g.enable_callback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, cbid));
    CUPTI(g.enable_callback(0, sub, CUPTI_CB_DOMAIN_DRIVER_API,
                            CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize));
  }
  if (driver_all) CUPTI(g.enable_domain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API));
  CUPTI(g.register_callbacks(Requested, Completed));
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                               CUPTI_ACTIVITY_KIND_MEMCPY})
    CUPTI(g.enable(k));
  if (driver || driver_all) CUPTI(g.enable(CUPTI_ACTIVITY_KIND_DRIVER));
  if (driver) CUPTI(g.enable_driver_records(CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, 0));

  e2e::Step("work");
  const size_t kBytes = 256 << 10;
  std::vector<char> host(kBytes, 3);
  g_recording = true;
  int* dev = nullptr;
  CK(cudaMalloc(&dev, kBytes));
  CK(cudaMemcpy(dev, host.data(), kBytes, cudaMemcpyHostToDevice));
  cupti_cb_kernel<<<4, 32>>>(dev);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  // The driver API directly, as a driver-API program calls it.
  CUdeviceptr raw = reinterpret_cast<CUdeviceptr>(dev);
  CU(memcpy_htod(raw, host.data(), 4096));
  CUfunction f = nullptr;
  CK(cudaGetFuncBySymbol(&f, reinterpret_cast<const void*>(cupti_cb_kernel)));
  void* args[] = {&dev};
  g_nest = driver || driver_all;
  CU(launch(f, 2, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  CU(ctx_sync());
  CUdevice bad = 0;
  CUresult bad_rc = g_device_get(&bad, 9999);  // fails: its exit callback sees the error
  CK(cudaFree(dev));
  g_recording = false;
  e2e::Step("flush");
  CUPTI(g.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  CUPTI(g.enable_domain(0, sub, CUPTI_CB_DOMAIN_RUNTIME_API));
  CUPTI(g.unsubscribe(sub));

  constexpr int kRt = CUPTI_CB_DOMAIN_RUNTIME_API, kDrv = CUPTI_CB_DOMAIN_DRIVER_API;
  PrintPairs("cudaMalloc", kRt, "cudaMalloc");
  PrintPairs("cudaMemcpy", kRt, "cudaMemcpy");
  PrintPairs("cudaLaunchKernel", kRt, "cudaLaunchKernel");
  PrintPairs("cudaDeviceSynchronize", kRt, "cudaDeviceSynchronize");
  PrintPairs("cudaFree", kRt, "cudaFree");
  printf("cudaMemcpy.params_count=%zu\ncudaMemcpy.params_kind=%d\n", g_memcpy_count, g_memcpy_kind);
  printf("cudaMalloc.exit_result_ok=%d\n", g_malloc_result_ok);
  if (driver) {
    // The driver calls enabled, cuMemcpyHtoD_v2 and cuLaunchKernel each made by cudart
    // inside a runtime call (sharing its correlation id) and by the program itself;
    // cuDeviceGet by the program and by a callback; not the other driver calls cudart
    // made, nor cuCtxSynchronize, enabled and disabled again.
    PrintPairs("cuMemcpyHtoD_v2", kDrv, "cuMemcpyHtoD_v2");
    PrintPairs("cuLaunchKernel", kDrv, "cuLaunchKernel");
    PrintPairs("cuDeviceGet", kDrv, "cuDeviceGet");
    printf("cuCtxSynchronize.calls=%zu\n", Named(kDrv, "cuCtxSynchronize").size());
    printf("cuMemcpyHtoD.params_bytes=%zu\n", g_htod_bytes);
    printf("cuLaunchKernel.params_grid=%u\ncuLaunchKernel.params_f=%d\n", g_launch_grid,
           static_cast<int>(g_launch_arg));
    std::set<std::string> drv;
    for (const Call& c : g_calls)
      if (c.domain == kDrv) drv.insert(c.name);
    printf("driver.names=%zu\n", drv.size());
    // Return values at exit: success, and the bad ordinal's error as the caller got it.
    int exits_ok = 1;
    for (const char* name : {"cuMemcpyHtoD_v2", "cuLaunchKernel"})
      for (const Call* c : Named(kDrv, name))
        exits_ok &= c->site == CUPTI_API_ENTER || c->result == CUDA_SUCCESS;
    printf("driver.exit_results_ok=%d\n", exits_ok);
    auto gets = Named(kDrv, "cuDeviceGet");
    printf("cuDeviceGet.params_ordinal=%d\n", g_device_get_ordinal);
    printf("cuDeviceGet.exit_result=%s\ncuDeviceGet.caller_result=%s\n",
           gets.size() >= 4 ? e2e::CuName(static_cast<CUresult>(gets[3]->result)) : "none",
           e2e::CuName(bad_rc));
    // A callback's own driver call: reported inside it, enter and exit.
    printf("driver.nested_callbacks=%zu\ndriver.nested_result=%s\n", g_nested_callbacks,
           e2e::CuName(static_cast<CUresult>(g_nested_result)));
    // Context, its number (as the runtime domain's), and the kernel's name at launches.
    int context_ok = 1, symbol_ok = 1;
    uint32_t rt_uid = 0;
    for (const Call& c : g_calls)
      if (c.domain == kRt && c.name == "cudaLaunchKernel") rt_uid = c.context_uid;
    for (const Call& c : g_calls) {
      if (c.domain != kDrv) continue;
      context_ok &= c.context == ctx && c.context_uid == rt_uid && rt_uid != 0;
      if (c.name == "cuLaunchKernel")
        symbol_ok &= c.symbol.find("cupti_cb_kernel") != std::string::npos;
    }
    printf("driver.context_ok=%d\ncuLaunchKernel.symbol_ok=%d\n", context_ok, symbol_ok);
    auto launches = Named(kDrv, "cuLaunchKernel");
    auto copies = Named(kDrv, "cuMemcpyHtoD_v2");
    printf("driver.nested_launch_shares_runtime_id=%d\n",
           !launches.empty() &&
               launches.front()->correlation == FirstCorrelation(kRt, "cudaLaunchKernel"));
    printf("driver.nested_memcpy_shares_runtime_id=%d\n",
           !copies.empty() && copies.front()->correlation == FirstCorrelation(kRt, "cudaMemcpy"));
    uint32_t direct = launches.size() >= 4 ? launches[2]->correlation : 0;
    uint32_t direct_copy = copies.size() >= 4 ? copies[2]->correlation : 0;
    int kernel_direct = 0;
    for (const Record& r : g_records)
      kernel_direct += r.kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
                       r.name.find("cupti_cb_kernel") != std::string::npos &&
                       r.correlation == direct && direct != 0;
    printf("record.kernel_of_driver_launch=%d\n", kernel_direct);
    printf("record.copy_of_driver_memcpy=%d\n",
           CountRecords(CUPTI_ACTIVITY_KIND_MEMCPY, 0, direct_copy));
    // DRIVER records: the program's launch and copy with their callbacks' ids (those
    // of their GPU work), none for cudart's launch (a driver call inside a runtime call
    // has a callback but no record, as natively on the H200), the failed call with its
    // error; none of cuCtxSynchronize, left out of the records.
    printf("record.driver_launch=%d\nrecord.driver_memcpy=%d\n",
           CountRecords(CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, direct),
           CountRecords(CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2,
                        direct_copy));
    printf("record.driver_launch_of_runtime_launch=%d\n",
           CountRecords(CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
                        FirstCorrelation(kRt, "cudaLaunchKernel")));
    int failed_get = 0, ctx_sync_records = 0;
    for (const Record& r : g_records) {
      failed_get += r.kind == CUPTI_ACTIVITY_KIND_DRIVER &&
                    r.cbid == CUPTI_DRIVER_TRACE_CBID_cuDeviceGet && r.result != CUDA_SUCCESS;
      ctx_sync_records += r.kind == CUPTI_ACTIVITY_KIND_DRIVER &&
                          r.cbid == CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize;
    }
    printf("record.driver_failed_device_get=%d\nrecord.driver_ctx_sync=%d\n", failed_get,
           ctx_sync_records);
    // Callback names, as CUPTI spells them.
    const char* n1 = nullptr;
    const char* n2 = nullptr;
    CUPTI(g.callback_name(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &n1));
    CUPTI(g.callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020,
                          &n2));
    printf("name.driver_launch=%s\nname.runtime_memcpy=%s\n", n1, n2);
    EXPECT(launches.size() == 4 && copies.size() == 4,
           "driver callbacks of cuLaunchKernel (%zu) and cuMemcpyHtoD_v2 (%zu)", launches.size(),
           copies.size());
  }

  if (driver_all) {
    // Every driver call reported during the work, by name; enter and exit properly
    // nested (a callback's own calls inside the call it was made in); a DRIVER record
    // with the id of each.
    std::map<std::string, int> count;
    std::vector<const Call*> open;
    int nesting_ok = 1, records_ok = 1, nested_calls = 0;
    std::set<uint32_t> runtime_ids;
    for (const Call& c : g_calls)
      if (c.domain == kRt) runtime_ids.insert(c.correlation);
    for (const Call& c : g_calls) {
      if (c.domain != kDrv) continue;
      if (c.site == CUPTI_API_ENTER) {
        ++count[c.name];
        open.push_back(&c);
      } else {
        // A callback's own call is pushed before the call it was made in (its enter
        // callback records itself last): an exit matches the innermost open enter.
        nesting_ok &= !open.empty() && open.back()->cbid == c.cbid &&
                      open.back()->correlation == c.correlation && c.data_kept;
        if (!open.empty()) open.pop_back();
        // A record for each call the program made itself; none for cudart's calls
        // (those share a runtime call's id).
        const bool in_runtime = runtime_ids.count(c.correlation) != 0;
        records_ok &=
            (CountRecords(CUPTI_ACTIVITY_KIND_DRIVER, c.cbid, c.correlation) > 0) != in_runtime;
        nested_calls += in_runtime;
      }
    }
    printf("driver_all.calls_in_runtime_calls=%d\n", nested_calls > 0 ? 1 : 0);
    nesting_ok &= open.empty();
    for (const auto& [name, n] : count) printf("driver_all.%s=%d\n", name.c_str(), n);
    printf("driver_all.nesting_ok=%d\ndriver_all.records_ok=%d\n", nesting_ok, records_ok);
    EXPECT(count["cuMemcpyHtoD_v2"] == 2 && count["cuLaunchKernel"] == 2,
           "driver callbacks of cuMemcpyHtoD_v2 (%d) and cuLaunchKernel (%d)",
           count["cuMemcpyHtoD_v2"], count["cuLaunchKernel"]);
  }

  // Activity records: the runtime record of cudaLaunchKernel and the kernel it launched
  // share a correlation id; so do cudaMemcpy's and its copy. The callback's id is the
  // record's.
  uint32_t launch_rt = FirstCorrelation(kRt, "cudaLaunchKernel");
  uint32_t memcpy_rt = FirstCorrelation(kRt, "cudaMemcpy");
  int rt_launch_record = 0, rt_memcpy_record = 0, kernel_rt = 0, copy_rt = 0, times_ok = 1;
  for (const Record& r : g_records) {
    times_ok &= r.start != 0 && r.start <= r.end;
    if (r.kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      rt_launch_record +=
          r.cbid == CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000 && r.correlation == launch_rt;
      rt_memcpy_record +=
          r.cbid == CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020 && r.correlation == memcpy_rt;
    } else if (r.kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
               r.name.find("cupti_cb_kernel") != std::string::npos) {
      kernel_rt += r.correlation == launch_rt;
    } else if (r.kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      copy_rt += r.correlation == memcpy_rt;
    }
  }
  printf("record.runtime_launch=%d\nrecord.runtime_memcpy=%d\n", rt_launch_record,
         rt_memcpy_record);
  printf("record.kernel_of_runtime_launch=%d\n", kernel_rt);
  printf("record.copy_of_runtime_memcpy=%d\nrecord.times_ok=%d\n", copy_rt, times_ok);
  EXPECT(g_memcpy_count == kBytes, "cudaMemcpy's params at enter: count %zu", g_memcpy_count);
  EXPECT(rt_launch_record == 1 && kernel_rt == 1,
         "cudaLaunchKernel's runtime record and its kernel share a correlation id");
  e2e::Pass();
  return 0;
}
