// k3 generate --prompts FILE: many prompts, batched (pipeline/batch_scheduler.h), results as
// JSON lines in input order.
#pragma once

#include <string>

#include "pipeline/engine.h"

namespace k3::cli {

// Runs the prompts of `path` (JSON lines) with `options`; returns the exit code.
int RunGenerateBatch(EngineOptions options, const std::string& path);

}  // namespace k3::cli
