#include "apps/reports/device_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace k3 {
namespace {

double Fraction(double part, double whole) { return whole > 0 ? part / whole : 0.0; }

// Bytes over busy time: what the drive delivers while it has work.
double DeliveredRate(const io::DeviceReport& d) {
  return d.busy_seconds > 0 ? static_cast<double>(d.bytes) / d.busy_seconds : 0.0;
}

std::string Label(const std::string& value) {
  return absl::StrReplaceAll(value, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

}  // namespace

std::string DeviceName(const io::DeviceReport& d) {
  if (d.dirs.size() == 1 && d.dirs[0] == d.id) return d.id;
  return absl::StrCat(d.id, " (", absl::StrJoin(d.dirs, ", "), ")");
}

std::string DevicesText(const std::vector<io::DeviceReport>& devices, double seconds) {
  if (devices.size() < 2) return "";
  std::string out;
  for (const io::DeviceReport& d : devices) {
    absl::StrAppendFormat(
        &out, "drive %s: %.3f GB, %.2f GB/s while busy, busy %.0f%%%s\n", DeviceName(d),
        static_cast<double>(d.bytes) / 1e9, DeliveredRate(d) / 1e9,
        100 * Fraction(d.busy_seconds, seconds),
        d.failovers > 0 ? absl::StrCat(", ", d.failovers, " reads failed over") : std::string());
  }
  return out;
}

nlohmann::json DeviceJson(const io::DeviceReport& d, double seconds) {
  return {{"name", DeviceName(d)},
          {"id", d.id},
          {"dirs", d.dirs},
          {"profile", d.profile},
          {"queue_depth", d.queue_depth},
          {"bytes", d.bytes},
          {"reads", d.reads},
          {"busy_seconds", d.busy_seconds},
          // A read in flight across the end of the span counts in full.
          {"busy_fraction", std::min(1.0, Fraction(d.busy_seconds, seconds))},
          {"rate_bytes_per_second", DeliveredRate(d)},
          {"failovers", d.failovers}};
}

nlohmann::json DevicesJson(const std::vector<io::DeviceReport>& devices, double seconds) {
  nlohmann::json out = nlohmann::json::array();
  for (const io::DeviceReport& d : devices) out.push_back(DeviceJson(d, seconds));
  return out;
}

std::string DevicesMetrics(const std::vector<io::DeviceReport>& devices) {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help, auto value) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
    for (const io::DeviceReport& d : devices) {
      absl::StrAppend(&out, name, "{device=\"", Label(d.id), "\",dirs=\"",
                      Label(absl::StrJoin(d.dirs, ",")), "\"} ", value(d), "\n");
    }
  };
  family("k3_device_read_bytes_total", "counter", "Bytes read from each drive.",
         [](const io::DeviceReport& d) { return static_cast<double>(d.bytes); });
  family("k3_device_busy_seconds_total", "counter",
         "Seconds each drive had at least one read in flight.",
         [](const io::DeviceReport& d) { return d.busy_seconds; });
  family("k3_device_rate_bytes_per_second", "gauge",
         "Bytes a second each drive delivered while busy, over the run.",
         [](const io::DeviceReport& d) { return DeliveredRate(d); });
  family("k3_device_failovers_total", "counter",
         "Reads of a drive's copy that failed and were read again from another copy.",
         [](const io::DeviceReport& d) { return static_cast<double>(d.failovers); });
  return out;
}

std::string RanksText(const std::vector<ranks::RankTraffic>& traffic, int64_t tokens) {
  std::string out;
  const double per = tokens > 0 ? 1.0 / static_cast<double>(tokens) : 0.0;
  for (const ranks::RankTraffic& t : traffic) {
    if (t.rank == 0) continue;
    const double bytes = static_cast<double>(t.bytes_out + t.bytes_back);
    absl::StrAppendFormat(&out,
                          "rank %d on %s: %.3f MB on the wire (%.1f KB a token), %lld layer jobs, "
                          "busy %.3f s reading and multiplying; round trip %.0f us (measured at "
                          "start, a decode layer's %.1f KB)\n",
                          t.rank, t.host, bytes / 1e6, bytes * per / 1e3,
                          static_cast<long long>(t.layers), t.worker_seconds, 1e6 * t.ping_seconds,
                          static_cast<double>(t.ping_bytes) / 1e3);
  }
  return out;
}

nlohmann::json RanksJson(const std::vector<ranks::RankTraffic>& traffic, int64_t tokens) {
  nlohmann::json out = nlohmann::json::array();
  const double per = tokens > 0 ? 1.0 / static_cast<double>(tokens) : 0.0;
  for (const ranks::RankTraffic& t : traffic) {
    if (t.rank == 0) continue;
    out.push_back({{"rank", t.rank},
                   {"host", t.host},
                   {"bytes_out", t.bytes_out},
                   {"bytes_back", t.bytes_back},
                   {"layers", t.layers},
                   {"seconds", t.seconds},
                   {"worker_seconds", t.worker_seconds},
                   {"ping_seconds", t.ping_seconds},
                   {"ping_bytes", t.ping_bytes},
                   {"bytes_per_token", static_cast<double>(t.bytes_out + t.bytes_back) * per},
                   {"seconds_per_token", t.seconds * per}});
  }
  return out;
}

}  // namespace k3
