// The part of NVIDIA's NVML ABI that Flyt uses, declared from NVML's public
// API reference (nvml.h is not installed on the build machines).
//
// Owns: the error codes, enums, buffer sizes and struct layouts that Flyt's
// libnvidia-ml.so.1 (src/nvml/nvml.cc) answers with and that flyt-server reads
// from the GPU host's real NVML (src/server/session_nvml.cc). Layouts must be
// byte-for-byte those of nvml.h: the static_asserts below pin them. Must not
// declare functions (each user binds what it needs).
#pragma once

#include <cstddef>

extern "C" {

typedef int nvmlReturn_t;
inline constexpr nvmlReturn_t NVML_SUCCESS = 0;
inline constexpr nvmlReturn_t NVML_ERROR_UNINITIALIZED = 1;
inline constexpr nvmlReturn_t NVML_ERROR_INVALID_ARGUMENT = 2;
inline constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
inline constexpr nvmlReturn_t NVML_ERROR_NO_PERMISSION = 4;
inline constexpr nvmlReturn_t NVML_ERROR_ALREADY_INITIALIZED = 5;
inline constexpr nvmlReturn_t NVML_ERROR_NOT_FOUND = 6;
inline constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;
inline constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_POWER = 8;
inline constexpr nvmlReturn_t NVML_ERROR_DRIVER_NOT_LOADED = 9;
inline constexpr nvmlReturn_t NVML_ERROR_TIMEOUT = 10;
inline constexpr nvmlReturn_t NVML_ERROR_IRQ_ISSUE = 11;
inline constexpr nvmlReturn_t NVML_ERROR_LIBRARY_NOT_FOUND = 12;
inline constexpr nvmlReturn_t NVML_ERROR_FUNCTION_NOT_FOUND = 13;
inline constexpr nvmlReturn_t NVML_ERROR_CORRUPTED_INFOROM = 14;
inline constexpr nvmlReturn_t NVML_ERROR_GPU_IS_LOST = 15;
inline constexpr nvmlReturn_t NVML_ERROR_RESET_REQUIRED = 16;
inline constexpr nvmlReturn_t NVML_ERROR_OPERATING_SYSTEM = 17;
inline constexpr nvmlReturn_t NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18;
inline constexpr nvmlReturn_t NVML_ERROR_IN_USE = 19;
inline constexpr nvmlReturn_t NVML_ERROR_MEMORY = 20;
inline constexpr nvmlReturn_t NVML_ERROR_NO_DATA = 21;
inline constexpr nvmlReturn_t NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22;
inline constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_RESOURCES = 23;
inline constexpr nvmlReturn_t NVML_ERROR_FREQ_NOT_SUPPORTED = 24;
inline constexpr nvmlReturn_t NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25;
inline constexpr nvmlReturn_t NVML_ERROR_UNKNOWN = 999;

// Opaque device handle.
typedef struct nvmlDevice_st* nvmlDevice_t;

// Buffer sizes (bytes, terminating NUL included).
enum : unsigned {
  NVML_DEVICE_NAME_BUFFER_SIZE = 64,
  NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96,
  NVML_DEVICE_UUID_BUFFER_SIZE = 80,
  NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96,
  NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32,
  NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16,
  NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80,
  NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE = 80,
};

// nvmlInitWithFlags flags.
enum : unsigned { NVML_INIT_FLAG_NO_GPUS = 1, NVML_INIT_FLAG_NO_ATTACH = 2 };

// Versioned structs carry NVML_STRUCT_VERSION(name, v) = sizeof | v << 24.
#define FLYT_NVML_STRUCT_VERSION(type, ver) \
  static_cast<unsigned>(sizeof(type) | (static_cast<unsigned>(ver) << 24))

typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
  unsigned int version;  // nvmlMemory_v2
  unsigned long long total;
  unsigned long long reserved;  // held by the driver and firmware
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 FLYT_NVML_STRUCT_VERSION(nvmlMemory_v2_t, 2)

// nvmlDeviceGetPciInfo_v3.
typedef struct nvmlPciInfo_st {
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];  // "%04X:%02X:%02X.0"
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;                        // device id << 16 | vendor id
  unsigned int pciSubSystemId;                     // subsystem id << 16 | subsystem vendor id
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];  // "%08X:%02X:%02X.0"
} nvmlPciInfo_t;

// nvmlDeviceGetPciInfo and _v2 (before _v3): a 16-byte bus id, then four
// reserved words where _v3 has busId. Writing this much is safe for either.
typedef struct nvmlPciInfoLegacy_st {
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfoLegacy_t;

typedef struct nvmlUtilization_st {
  unsigned int gpu;     // percent of the sample period a kernel ran
  unsigned int memory;  // percent of the sample period memory was read or written
} nvmlUtilization_t;

// nvmlDeviceGet*RunningProcesses (v1 ABI).
typedef struct nvmlProcessInfo_v1_st {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

// nvmlDeviceGet*RunningProcesses_v2 and _v3 (nvmlProcessInfo_t).
typedef struct nvmlProcessInfo_st {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;      // 0xFFFFFFFF outside MIG
  unsigned int computeInstanceId;  // 0xFFFFFFFF outside MIG
} nvmlProcessInfo_t;
typedef nvmlProcessInfo_t nvmlProcessInfo_v2_t;

typedef struct nvmlProcessUtilizationSample_st {
  unsigned int pid;
  unsigned long long timeStamp;  // CPU timestamp, microseconds
  unsigned int smUtil;
  unsigned int memUtil;
  unsigned int encUtil;
  unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

// nvmlDeviceGetAttributes_v2.
typedef struct nvmlDeviceAttributes_st {
  unsigned int multiprocessorCount;
  unsigned int sharedCopyEngineCount;
  unsigned int sharedDecoderCount;
  unsigned int sharedEncoderCount;
  unsigned int sharedJpegCount;
  unsigned int sharedOfaCount;
  unsigned int gpuInstanceSliceCount;
  unsigned int computeInstanceSliceCount;
  unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef unsigned int nvmlTemperatureSensors_t;
enum : unsigned { NVML_TEMPERATURE_GPU = 0 };

typedef unsigned int nvmlClockType_t;
enum : unsigned {
  NVML_CLOCK_GRAPHICS = 0,
  NVML_CLOCK_SM = 1,
  NVML_CLOCK_MEM = 2,
  NVML_CLOCK_VIDEO = 3,
  NVML_CLOCK_COUNT = 4
};

typedef int nvmlPstates_t;  // NVML_PSTATE_0 .. NVML_PSTATE_15
enum : int { NVML_PSTATE_UNKNOWN = 32 };

typedef unsigned int nvmlComputeMode_t;
enum : unsigned { NVML_COMPUTEMODE_DEFAULT = 0 };

typedef unsigned int nvmlDeviceArchitecture_t;
enum : unsigned {
  NVML_DEVICE_ARCH_KEPLER = 2,
  NVML_DEVICE_ARCH_MAXWELL = 3,
  NVML_DEVICE_ARCH_PASCAL = 4,
  NVML_DEVICE_ARCH_VOLTA = 5,
  NVML_DEVICE_ARCH_TURING = 6,
  NVML_DEVICE_ARCH_AMPERE = 7,
  NVML_DEVICE_ARCH_ADA = 8,
  NVML_DEVICE_ARCH_HOPPER = 9,
  NVML_DEVICE_ARCH_BLACKWELL = 10,
  NVML_DEVICE_ARCH_UNKNOWN = 0xffffffffu,
};

// Interconnect queries (NCCL asks them while it starts).
typedef unsigned int nvmlEnableState_t;
enum : unsigned { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 };
typedef unsigned int nvmlGpuP2PCapsIndex_t;  // READ 0, WRITE 1, NVLINK 2, ATOMICS 3, PCI 4
typedef unsigned int nvmlGpuP2PStatus_t;
enum : unsigned { NVML_P2P_STATUS_OK = 0, NVML_P2P_STATUS_NOT_SUPPORTED = 5 };
typedef unsigned int nvmlGpuTopologyLevel_t;
enum : unsigned {
  NVML_TOPOLOGY_INTERNAL = 0,
  NVML_TOPOLOGY_SINGLE = 10,
  NVML_TOPOLOGY_MULTIPLE = 20,
  NVML_TOPOLOGY_HOSTBRIDGE = 30,
  NVML_TOPOLOGY_NODE = 40,
  NVML_TOPOLOGY_SYSTEM = 50,
};
typedef unsigned int nvmlNvLinkCapability_t;  // P2P_SUPPORTED 0 .. VALID 5

}  // extern "C"

static_assert(sizeof(nvmlMemory_t) == 24);
static_assert(sizeof(nvmlMemory_v2_t) == 40 && offsetof(nvmlMemory_v2_t, total) == 8);
static_assert(nvmlMemory_v2 == 0x02000028u);
static_assert(sizeof(nvmlPciInfo_t) == 68 && offsetof(nvmlPciInfo_t, busId) == 36);
static_assert(sizeof(nvmlPciInfoLegacy_t) == 52);
static_assert(sizeof(nvmlUtilization_t) == 8);
static_assert(sizeof(nvmlProcessInfo_v1_t) == 16);
static_assert(sizeof(nvmlProcessInfo_t) == 24 && offsetof(nvmlProcessInfo_t, gpuInstanceId) == 16);
static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32);
static_assert(sizeof(nvmlDeviceAttributes_t) == 40);
