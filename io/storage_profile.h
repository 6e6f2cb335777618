// Storage profiles: an emulated volume (latency, bandwidth, IOPS, requests in flight) layered on
// the real read engine, so that "what would a network volume do" can be answered on a laptop
// NVMe. Emulation can only slow the real device down: a profile faster than the disk measures
// the disk.
//
// Built-in profiles (figures for the class of device, not one product; docs/STORAGE.md):
//   direct   no emulation: the real device, O_DIRECT
//   nvme     lat=80us, bw=7000MB/s, iops=1000000, qd=128  PCIe 4.0 x4 SSD: ~7 GB/s sequential,
//            ~1M random-read IOPS at depth, 60-90 us QD1 read latency
//   sata     lat=100us, bw=550MB/s, iops=95000, qd=32     SATA III SSD: the 6 Gb/s link caps
//            reads at ~550 MB/s; NCQ allows 32 commands in flight
//   network  lat=1.5ms, bw=400MB/s, iops=6000, qd=32      a provisioned cloud block volume (EBS
//            gp3/io2, Azure Premium SSD, GCP pd-balanced class): 1-2 ms per I/O over the
//            network, 250-1000 MB/s and 3000-16000 IOPS caps per volume
//
// Custom profiles: "lat=2ms,bw=500MB/s,iops=5000,qd=32", any subset, or a built-in name
// followed by overrides ("network,lat=3ms").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace k3::io {

struct StorageProfile {
  std::string name = "direct";                    // as the user wrote it (tables, JSON)
  absl::Duration latency = absl::ZeroDuration();  // per I/O, added after its transfer
  double bytes_per_second = 0;                    // 0: unlimited
  double iops = 0;                                // operations (chunks) per second; 0: unlimited
  int max_in_flight = 0;  // requests in flight; 0: no cap beyond queue depth

  bool emulated() const {
    return latency > absl::ZeroDuration() || bytes_per_second > 0 || iops > 0 || max_in_flight > 0;
  }
  // "lat=1.5ms,bw=400MB/s,iops=6000,qd=32" (the settings, whatever the name); "direct".
  std::string Describe() const;
};

// One profile: a built-in name, key=value parts, or a name followed by key=value overrides.
// Errors are InvalidArgument naming the part that is wrong.
absl::StatusOr<StorageProfile> ParseStorageProfile(std::string_view spec);

// The values of a list flag (--storage-profile), which the flag library has split at commas:
// a built-in name is a profile of its own, and key=value parts gather into one custom profile
// until a key repeats ("direct,lat=2ms,bw=1GB/s,lat=5ms,network" is four profiles). (So a
// name with overrides cannot be written in a list; spell the settings out.)
absl::StatusOr<std::vector<StorageProfile>> ParseStorageProfileList(
    const std::vector<std::string>& parts);

// The emulated device's schedule (not thread-safe: the engine calls it under its lock). Each
// operation takes an IOPS slot, then its bytes pass through a pipe of the profile's bandwidth
// (no burst credit), then the latency elapses: so throughput is capped at the bandwidth, a lone
// small read takes the latency, and depth hides latency as on a real volume.
class StorageEmulator {
 public:
  explicit StorageEmulator(const StorageProfile& profile) : profile_(profile) {}
  // When an operation of `bytes` issued at `issue` may complete at the earliest.
  absl::Time Schedule(absl::Time issue, uint64_t bytes);

 private:
  StorageProfile profile_;
  absl::Time next_op_ = absl::InfinitePast();
  absl::Time pipe_free_ = absl::InfinitePast();
};

}  // namespace k3::io
