#include "core/checkpoint/stripe_manifest.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint/manifest_reader.h"
#include "io/file.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

absl::Status ParseStripeHeader(const ManifestReader& r, const json& root, StripeManifest& m) {
  auto format = r.String(root, "format", "");
  if (!format.ok()) return format.status();
  if (*format != kStripeFormat) {
    return r.Error("format", absl::StrCat("\"", *format, "\" is not \"", kStripeFormat, "\""));
  }
  auto version = r.U64(root, "version", "");
  if (!version.ok()) return version.status();
  if (*version < 1 || *version > kStripeVersion) {  // 1: before layouts (whole experts)
    return r.Error("version", absl::StrCat(*version, " is not supported (this k3 reads version ",
                                           kStripeVersion, "; re-run k3 stripe)"));
  }
  auto fingerprint = r.String(root, "fingerprint", "");
  auto directory = r.U64(root, "directory", "");
  auto directories = r.U64(root, "directories", "");
  auto alignment = r.U64(root, "alignment", "");
  for (const absl::Status& s :
       {fingerprint.status(), directory.status(), directories.status(), alignment.status()}) {
    if (!s.ok()) return s;
  }
  if (*directories == 0 || *directories > kMaxStripeDirectories) {
    return r.Error("directories",
                   absl::StrCat(*directories, " is not in [1, ", kMaxStripeDirectories, "]"));
  }
  if (*directory >= *directories) {
    return r.Error("directory",
                   absl::StrCat(*directory, " is not below directories (", *directories, ")"));
  }
  if (*alignment != kStripeAlignment) {
    return r.Error("alignment", absl::StrCat(*alignment, " is not ", kStripeAlignment));
  }
  m.fingerprint = *fingerprint;
  m.directory = static_cast<int>(*directory);
  m.directories = static_cast<int>(*directories);
  if (root.contains("copies")) {  // manifests written before --copies have none: 1
    auto copies = r.U64(root, "copies", "");
    if (!copies.ok()) return copies.status();
    if (*copies == 0 || *copies > *directories) {
      return r.Error("copies",
                     absl::StrCat(*copies, " is not in [1, directories (", *directories, ")]"));
    }
    m.copies = static_cast<int>(*copies);
  }
  if (root.contains("layout")) {
    auto layout = r.String(root, "layout", "");
    if (!layout.ok()) return layout.status();
    auto parsed = ParseStripeLayout(*layout);
    if (!parsed.ok()) return r.Error("layout", std::string(parsed.status().message()));
    m.layout = *parsed;
  }
  if (m.layout == StripeLayout::kSlices && m.copies != 1) {
    return r.Error("copies", absl::StrCat(m.copies, " with layout \"slices\" (one copy)"));
  }
  auto weights = r.Array(root, "weights", "");
  if (!weights.ok()) return weights.status();
  for (const json& w : **weights) {
    if (!w.is_number() || !std::isfinite(w.get<double>()) || w.get<double>() <= 0) {
      return r.Error("weights", absl::StrCat(w.dump(), " is not a positive number"));
    }
    m.weights.push_back(w.get<double>());
  }
  if (m.weights.size() != *directories) {
    return r.Error("weights", absl::StrCat("has ", m.weights.size(), " entries for ", *directories,
                                           " directories"));
  }
  return absl::OkStatus();
}

absl::Status ParseStripeFiles(const ManifestReader& r, const json& root, StripeManifest& m) {
  auto files = r.Array(root, "files", "");
  if (!files.ok()) return files.status();
  std::set<std::string> seen;
  for (size_t i = 0; i < (*files)->size(); ++i) {
    const json& f = (**files)[i];
    const std::string where = absl::StrCat("files[", i, "]");
    if (!f.is_object()) return r.Error(where, "must be an object");
    auto name = r.Basename(f, "name", where);
    if (!name.ok()) return name.status();
    auto bytes = r.U64(f, "bytes", where);
    if (!bytes.ok()) return bytes.status();
    if (!seen.insert(*name).second) return r.Error(where, absl::StrCat(*name, " is listed twice"));
    m.files.push_back({*name, *bytes});
  }
  return absl::OkStatus();
}

absl::StatusOr<StripeExtent> ParseStripeExtent(const ManifestReader& r, const json& j,
                                               const std::string& where) {
  if (!j.is_object()) return r.Error(where, "must be an object");
  StripeExtent e;
  auto layer = r.U64(j, "layer", where);
  auto expert = r.U64(j, "expert", where);
  auto offset = r.U64(j, "offset", where);
  auto length = r.U64(j, "length", where);
  auto at = r.U64(j, "at", where);
  auto crc = r.U64(j, "crc32c", where);
  for (const absl::Status& s : {layer.status(), expert.status(), offset.status(), length.status(),
                                at.status(), crc.status()}) {
    if (!s.ok()) return s;
  }
  auto file = r.Basename(j, "file", where);
  if (!file.ok()) return file.status();
  if (*layer > (1u << 20) || *expert > (1u << 24)) {
    return r.Error(where, absl::StrCat("layer ", *layer, ", expert ", *expert, " is out of range"));
  }
  if (*crc > 0xffffffffu) return r.Error(where + ".crc32c", "is not a 32-bit CRC");
  if (*length == 0) return r.Error(where + ".length", "must be positive");
  if (*at % kStripeAlignment != *offset % kStripeAlignment) {
    return r.Error(where, absl::StrCat("at ", *at, " and offset ", *offset, " differ modulo ",
                                       kStripeAlignment));
  }
  e.layer = static_cast<int64_t>(*layer);
  e.expert = static_cast<int64_t>(*expert);
  e.offset = *offset;
  e.length = *length;
  e.path = *file;  // the basename until the caller joins the directory
  e.at = *at;
  e.crc = static_cast<uint32_t>(*crc);
  return e;
}

absl::Status ParseStripeShards(const ManifestReader& r, const json& root, StripeManifest& m) {
  auto shards = r.Array(root, "shards", "");
  if (!shards.ok()) return shards.status();
  std::set<std::string> seen;
  std::set<std::pair<int64_t, int64_t>> experts;
  for (size_t i = 0; i < (*shards)->size(); ++i) {
    const json& s = (**shards)[i];
    const std::string where = absl::StrCat("shards[", i, "]");
    if (!s.is_object()) return r.Error(where, "must be an object");
    auto name = r.Basename(s, "shard", where);
    if (!name.ok()) return name.status();
    auto bytes = r.U64(s, "bytes", where);
    if (!bytes.ok()) return bytes.status();
    if (!seen.insert(*name).second) return r.Error(where, absl::StrCat(*name, " is listed twice"));
    m.shards.push_back({*name, *bytes});
    auto extents = r.Array(s, "extents", where);
    if (!extents.ok()) return extents.status();
    for (size_t k = 0; k < (*extents)->size(); ++k) {
      const std::string at = absl::StrCat(where, ".extents[", k, "]");
      auto e = ParseStripeExtent(r, (**extents)[k], at);
      if (!e.ok()) return e.status();
      if (e->offset > *bytes || e->length > *bytes - e->offset) {
        return r.Error(at, absl::StrCat("ends at byte ", e->offset + e->length,
                                        ", past the end of ", *name, " (", *bytes, " bytes)"));
      }
      if (!experts.insert({e->layer, e->expert}).second) {
        return r.Error(
            at, absl::StrCat("expert ", e->expert, " of layer ", e->layer, " is listed twice"));
      }
      e->shard = *name;
      m.extents.push_back(*std::move(e));
    }
  }
  return absl::OkStatus();
}

// Every extent in a listed file, inside it and not overlapping another; each file as long as its
// last extent's end. Then the extents' paths become the files' paths.
absl::Status CheckStripeFiles(const ManifestReader& r, StripeManifest& m) {
  absl::flat_hash_map<std::string, size_t> file_index;
  for (size_t i = 0; i < m.files.size(); ++i) file_index[m.files[i].name] = i;
  std::vector<std::vector<const StripeExtent*>> in_file(m.files.size());
  for (const StripeExtent& e : m.extents) {
    auto it = file_index.find(e.path);
    if (it == file_index.end()) {
      return r.Error(absl::StrCat("expert ", e.expert, " of layer ", e.layer),
                     absl::StrCat("file ", e.path, " is not listed in files"));
    }
    in_file[it->second].push_back(&e);
  }
  for (size_t i = 0; i < m.files.size(); ++i) {
    auto& list = in_file[i];
    std::sort(list.begin(), list.end(),
              [](const StripeExtent* a, const StripeExtent* b) { return a->at < b->at; });
    uint64_t end = 0;
    for (const StripeExtent* e : list) {
      if (e->at < end) {
        return r.Error(absl::StrCat("expert ", e->expert, " of layer ", e->layer),
                       absl::StrCat("bytes [", e->at, ", ", e->at + e->length, ") of ",
                                    m.files[i].name, " overlap the extent before them"));
      }
      end = e->at + e->length;
    }
    if (end != m.files[i].bytes) {
      return r.Error(absl::StrCat("files[", i, "]"),
                     absl::StrCat(m.files[i].name, " is recorded as ", m.files[i].bytes,
                                  " bytes, but its extents end at byte ", end));
    }
  }
  const std::string dir = m.Dir();
  for (StripeExtent& e : m.extents) e.path = io::JoinPath(dir, e.path);
  return absl::OkStatus();
}

std::string StripeBasename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string StripeManifest::Dir() const {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string StripeManifestText(const StripeManifest& m) {
  ojson files = ojson::array();
  for (const StripeManifest::File& f : m.files)
    files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  ojson head;
  head["format"] = kStripeFormat;
  head["version"] = kStripeVersion;
  head["fingerprint"] = m.fingerprint;
  head["directory"] = m.directory;
  head["directories"] = m.directories;
  head["copies"] = m.copies;
  head["layout"] = std::string(StripeLayoutName(m.layout));
  head["weights"] = m.weights;
  head["alignment"] = kStripeAlignment;
  head["files"] = std::move(files);
  // The header's fields one a line, then each shard with its extents one a line: readable, and
  // ~130 bytes an expert.
  std::string text = "{\n";
  for (auto it = head.begin(); it != head.end(); ++it) {
    absl::StrAppend(&text, " ", ojson(it.key()).dump(), ": ", it.value().dump(), ",\n");
  }
  text += " \"shards\": [";
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const StripeManifest::Shard& s = m.shards[i];
    absl::StrAppend(&text, i == 0 ? "\n" : ",\n", "  {\"shard\": ", ojson(s.name).dump(),
                    ", \"bytes\": ", s.bytes, ", \"extents\": [");
    bool first = true;
    for (const StripeExtent& e : m.extents) {
      if (e.shard != s.name) continue;
      const ojson j = {{"layer", e.layer},
                       {"expert", e.expert},
                       {"offset", e.offset},
                       {"length", e.length},
                       {"file", StripeBasename(e.path)},
                       {"at", e.at},
                       {"crc32c", e.crc}};
      absl::StrAppend(&text, first ? "\n" : ",\n", "   ", j.dump());
      first = false;
    }
    text += first ? "]}" : "\n  ]}";
  }
  text += m.shards.empty() ? "]\n}\n" : "\n ]\n}\n";
  return text;
}

absl::StatusOr<StripeManifest> ParseStripeManifest(std::string_view text, const std::string& path) {
  ManifestReader r(path);
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return r.Error("(top level)", "not valid JSON");
  if (!root.is_object()) return r.Error("(top level)", "must be a JSON object");
  StripeManifest m;
  m.path = path;
  for (auto step : {ParseStripeHeader, ParseStripeFiles, ParseStripeShards}) {
    if (absl::Status s = step(r, root, m); !s.ok()) return s;
  }
  if (absl::Status s = CheckStripeFiles(r, m); !s.ok()) return s;
  return m;
}

}  // namespace k3
