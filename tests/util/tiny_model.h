// The options that synthesise the `tiny` checkpoint (the shape of
// ../shared/fixtures/reference-tiny) into a test's directory; tests adjust seed or skew.
#pragma once

#include <string>

#include "core/synth.h"

namespace k3::testing {

inline SynthOptions TinyModel(const std::string& out_dir) {
  SynthOptions o;
  o.preset = "tiny";
  o.out_dir = out_dir;
  return o;
}

}  // namespace k3::testing
