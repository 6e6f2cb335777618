// The drives a run read from, as the run summary, --report-json, k3 bench and /metrics show
// them: per device its bytes, the rate it delivered while busy and its busy fraction.
#pragma once

#include <string>
#include <vector>

#include "io/read_router.h"
#include "nlohmann/json.hpp"
#include "pipeline/ranks/distributed_experts.h"

namespace k3 {

// "259:1 (/models/k3, /data/k3)", or the directory of a drive of its own.
std::string DeviceName(const io::DeviceReport& d);

// One line per drive ("drive 259:1 (/models/k3): 12.1 GB, 3.61 GB/s, busy 94%"), or nothing
// when there is only one: the run's other lines say it all. `seconds`: the wall time the busy
// fractions are of.
std::string DevicesText(const std::vector<io::DeviceReport>& devices, double seconds);

// One drive as every JSON of k3 shows it (--report-json, k3 bench, /k3/events): {"name" (as
// DeviceName), "id", "dirs", "profile", "queue_depth", "bytes", "reads", "busy_seconds",
// "busy_fraction" (of `seconds`), "rate_bytes_per_second" (delivered while busy), "failovers"}.
nlohmann::json DeviceJson(const io::DeviceReport& d, double seconds);
// DeviceJson of every drive.
nlohmann::json DevicesJson(const std::vector<io::DeviceReport>& devices, double seconds);

// The Prometheus lines: k3_device_read_bytes_total, k3_device_busy_seconds_total,
// k3_device_rate_bytes_per_second and k3_device_failovers_total, labelled by device.
std::string DevicesMetrics(const std::vector<io::DeviceReport>& devices);

// Under expert parallelism, one line per other rank: bytes on the wire (in all and per token of
// the `tokens` run), its busy time, and the round trip measured at start; nothing in one
// process.
std::string RanksText(const std::vector<ranks::RankTraffic>& traffic, int64_t tokens);
// [{"rank", "host", "bytes_out", "bytes_back", "layers", "seconds", "worker_seconds",
//   "ping_seconds", "ping_bytes", "bytes_per_token", "seconds_per_token"}] for every rank but 0;
// empty in one process.
nlohmann::json RanksJson(const std::vector<ranks::RankTraffic>& traffic, int64_t tokens);

}  // namespace k3
