// What the VMM test programs share: the driver's VMM calls, resolved through cudart (the
// programs do not link libcuda), the properties of a plain device allocation on device 0,
// and access settings for a range of it.
#pragma once

#include <cstring>

#include "e2e_driver.h"

namespace e2e {

struct VmmDriver {
  decltype(&::cuMemGetAllocationGranularity) granularity;
  decltype(&::cuMemAddressReserve) reserve;
  decltype(&::cuMemAddressFree) address_free;
  decltype(&::cuMemCreate) create;
  decltype(&::cuMemRelease) release;
  decltype(&::cuMemMap) map;
  decltype(&::cuMemUnmap) unmap;
  decltype(&::cuMemSetAccess) set_access;
  decltype(&::cuMemGetAccess) get_access;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) properties;
  decltype(&::cuMemRetainAllocationHandle) retain;
  decltype(&::cuMemExportToShareableHandle) export_handle;
  decltype(&::cuMemImportFromShareableHandle) import_handle;
  decltype(&::cuDeviceGetAttribute) attribute;
};
inline VmmDriver g_vmm;

inline void ResolveVmm() {
  ResolveDriver("cuGetErrorName", &g_error_name);
  ResolveDriver("cuMemGetAllocationGranularity", &g_vmm.granularity);
  ResolveDriver("cuMemAddressReserve", &g_vmm.reserve);
  ResolveDriver("cuMemAddressFree", &g_vmm.address_free);
  ResolveDriver("cuMemCreate", &g_vmm.create);
  ResolveDriver("cuMemRelease", &g_vmm.release);
  ResolveDriver("cuMemMap", &g_vmm.map);
  ResolveDriver("cuMemUnmap", &g_vmm.unmap);
  ResolveDriver("cuMemSetAccess", &g_vmm.set_access);
  ResolveDriver("cuMemGetAccess", &g_vmm.get_access);
  ResolveDriver("cuMemGetAllocationPropertiesFromHandle", &g_vmm.properties);
  ResolveDriver("cuMemRetainAllocationHandle", &g_vmm.retain);
  ResolveDriver("cuMemExportToShareableHandle", &g_vmm.export_handle);
  ResolveDriver("cuMemImportFromShareableHandle", &g_vmm.import_handle);
  ResolveDriver("cuDeviceGetAttribute", &g_vmm.attribute);
}

// A pinned device allocation on device 0, nothing shareable.
inline CUmemAllocationProp DeviceProp() {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  return prop;
}

// Device 0's access to [p, p+n).
inline void SetAccess(CUdeviceptr p, size_t n, CUmemAccess_flags flags) {
  CUmemAccessDesc desc;
  memset(&desc, 0, sizeof(desc));
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = 0;
  desc.flags = flags;
  CU(g_vmm.set_access(p, n, &desc, 1));
}

}  // namespace e2e
