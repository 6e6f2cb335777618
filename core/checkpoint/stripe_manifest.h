// The stripe manifest (k3-stripe.json): its text, and parsing it without a checkpoint.
// Internal to core/checkpoint/stripe.cc; the format is in docs/STORAGE.md, "Striped layout".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/stripe.h"

namespace k3 {

struct StripeManifest {
  struct File {
    std::string name;  // a basename in the manifest's directory
    uint64_t bytes = 0;
  };
  struct Shard {
    std::string name;    // the source shard's basename
    uint64_t bytes = 0;  // its size when striped
  };

  std::string path;         // the manifest's path (messages name it)
  std::string Dir() const;  // the directory it is in, where its files are
  std::string fingerprint;
  int directory = 0;
  int directories = 1;
  int copies = 1;  // directories each expert was written to (information; absent in old ones)
  // kSlices: each extent is this directory's piece of its expert (SliceOf with `weights`);
  // manifests before slices have no "layout" and hold whole experts.
  StripeLayout layout = StripeLayout::kExperts;
  std::vector<double> weights;
  std::vector<File> files;
  std::vector<Shard> shards;
  // Grouped by shard in `shards` order; each one's path is the manifest's directory + its file.
  std::vector<StripeExtent> extents;
};

// The manifest's JSON: the fields in a fixed order, one extent a line.
std::string StripeManifestText(const StripeManifest& m);

// Parses and checks the structure: format and version, types of every field, the directory's
// index below the count, a positive weight each, plain file names, every extent in a listed file
// with the same offset modulo kStripeAlignment as in its shard, inside the file, not overlapping
// another, each (layer, expert) once, and every file exactly as long as its last extent's end.
// InvalidArgument naming `path` and the key at fault.
absl::StatusOr<StripeManifest> ParseStripeManifest(std::string_view json, const std::string& path);

}  // namespace k3
