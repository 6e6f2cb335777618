#include "apps/flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, model, "", "Model directory (config.json and safetensors shards).");
ABSL_FLAG(std::string, out, "", "Output directory.");
ABSL_FLAG(
    std::string, preset, "",
    "k3 synth: the model shape (tiny, demo, bench, slice or full; default tiny). Elsewhere: the "
    "memory preset (ultra, laptop, desktop, workstation, server, max, auto; default auto).");
ABSL_FLAG(uint64_t, seed, 0, "Random seed; the same seed gives the same bytes.");
ABSL_FLAG(std::vector<std::string>, set, {},
          "Override a config key, e.g. --set hidden_size=256 --set full_attn_layers=4,8 "
          "(repeatable; a list value keeps its commas).");
ABSL_FLAG(double, router_skew, 0.0,
          "Per-expert popularity in the router bias (0 = uniform routing; about 1 looks like "
          "real traces).");
ABSL_FLAG(std::string, dtype, "release",
          "Float tensors: release (BF16 matrices, F32 where the release has F32), f16 or f32.");
ABSL_FLAG(std::string, weights, "",
          "k3 synth: how weight matrices are drawn: gaussian (the exponent distribution of "
          "trained weights) or uniform; default gaussian for slice and full, uniform otherwise.");
ABSL_FLAG(bool, sparse, false,
          "k3 synth: headers only, the tensor data left as file holes that read as zeros.");
ABSL_FLAG(bool, single_file, false,
          "k3 synth: the language model in one model.safetensors, without an index.");
ABSL_FLAG(bool, force, false, "Overwrite an existing model in the output directory.");
ABSL_FLAG(bool, quiet, false, "No progress bars or per-step tables.");
ABSL_FLAG(std::string, out_json, "", "Also write the results as JSON to this file.");
ABSL_FLAG(double, disk_gbps, 0,
          "Disk read rate in GB/s for the forecasts (0 = measure it as k3 doctor does).");
ABSL_FLAG(std::string, out_csv, "", "Also write the results as CSV to this file.");
ABSL_FLAG(
    std::vector<std::string>, queue_depth, {},
    "io_uring queue depth: reads kept in flight (default 32; a list where a command sweeps it).");
ABSL_FLAG(std::vector<std::string>, storage_profile, {},
          "direct (the real device, O_DIRECT), an emulated volume (nvme, network, sata) or "
          "lat=2ms,bw=500MB/s,iops=5000,qd=32 (any subset; a list where a command sweeps it).");
ABSL_FLAG(int32_t, repeat, 3, "Repetitions of each measurement; medians are reported.");
