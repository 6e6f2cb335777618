// Figures the kernel reports in /proc files of "Name:   value kB" lines (/proc/meminfo,
// /proc/self/status), read in one place.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace k3 {

// The value of `field` (e.g. "MemAvailable", without the colon) in the /proc file at `path`:
// in bytes for a figure given in kB, as written for one without a unit (HugePages_Total); 0
// when the file or the field is missing.
uint64_t ProcField(const std::string& path, std::string_view field);

// ProcField of /proc/meminfo: "MemTotal", "MemAvailable", ...
inline uint64_t MeminfoBytes(std::string_view field) { return ProcField("/proc/meminfo", field); }

}  // namespace k3
