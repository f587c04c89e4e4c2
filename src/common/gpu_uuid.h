// NVML's text form of a GPU's 16-byte UUID ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"),
// shared by the server (to find a device in the host's NVML) and Flyt's NVML library.
// Owns: the formatting only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace flyt {

inline std::string GpuUuidText(const uint8_t* b) {
  char text[64];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

}  // namespace flyt
