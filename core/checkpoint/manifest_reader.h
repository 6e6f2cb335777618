// Typed fields of a JSON manifest (a k3 pack's trunk.json, a k3 stripe's k3-stripe.json), each
// error naming the manifest and the key's path. Manifests are small: nlohmann's DOM reads them.
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace k3 {

// Reads typed fields; every error starts with the manifest's name and the key's path.
class ManifestReader {
 public:
  explicit ManifestReader(std::string source) : source_(std::move(source)) {}

  absl::Status Error(const std::string& where, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", where, ": ", what));
  }

  absl::StatusOr<const nlohmann::json*> Field(const nlohmann::json& obj, const char* key,
                                              const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end()) return Error(Key(where, key), "missing");
    return &*it;
  }

  absl::StatusOr<uint64_t> U64(const nlohmann::json& obj, const char* key,
                               const std::string& where) const {
    auto f = Field(obj, key, where);
    if (!f.ok()) return f.status();
    if (!(*f)->is_number_unsigned()) {
      return Error(Key(where, key),
                   absl::StrCat("must be a non-negative integer, not ", (*f)->dump()));
    }
    return (*f)->get<uint64_t>();
  }

  absl::StatusOr<std::string> String(const nlohmann::json& obj, const char* key,
                                     const std::string& where) const {
    auto f = Field(obj, key, where);
    if (!f.ok()) return f.status();
    if (!(*f)->is_string() || (*f)->get<std::string>().empty()) {
      return Error(Key(where, key), "must be a non-empty string");
    }
    return (*f)->get<std::string>();
  }

  // A file name without a directory part, so that a manifest names only files beside it.
  absl::StatusOr<std::string> Basename(const nlohmann::json& obj, const char* key,
                                       const std::string& where) const {
    auto s = String(obj, key, where);
    if (s.ok() && (s->find('/') != std::string::npos || *s == "." || *s == "..")) {
      return Error(Key(where, key), absl::StrCat("\"", *s, "\" is not a plain file name"));
    }
    return s;
  }

  absl::StatusOr<const nlohmann::json*> Array(const nlohmann::json& obj, const char* key,
                                              const std::string& where) const {
    auto f = Field(obj, key, where);
    if (f.ok() && !(*f)->is_array()) return Error(Key(where, key), "must be an array");
    return f;
  }

  static std::string Key(const std::string& where, const char* key) {
    return where.empty() ? std::string(key) : absl::StrCat(where, ".", key);
  }

 private:
  std::string source_;
};

}  // namespace k3
