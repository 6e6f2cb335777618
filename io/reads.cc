#include "io/reads.h"

#include <utility>

namespace k3::io {

absl::StatusOr<std::span<uint8_t>> Reads::Read(ReadRequest request) {
  if (request.on_complete) return absl::InvalidArgumentError("Read() takes no callback");
  auto id = Submit(std::move(request));
  if (!id.ok()) return id.status();
  ReadResult r = Wait(*id);
  if (!r.status.ok()) return r.status;
  return r.data;
}

}  // namespace k3::io
