// The routed experts' rows: the one function that multiplies an expert with the rows routed to
// it, used by the forward pass (Model::Moe, core/model/moe.cc) and by the other ranks of expert
// parallelism (pipeline/ranks/worker.cc), so that every process computes a product with the
// same code and gets the same bits.
#pragma once

#include <cstddef>
#include <span>

#include "core/checkpoint/config.h"
#include "core/model/expert_provider.h"
#include "core/model/step_scratch.h"

namespace k3 {

// Multiplies routed expert `ew` with rows of `x` ([*, routed_expert_hidden_size]): pair k takes
// row from[k] of `x` and puts its product in row to[k] of `out` (the same width), through
// kExpertRowsPerPass rows at a time in a pass borrowed from `scratch` (a chunk whose tokens all
// choose one expert then needs no more memory than one whose tokens spread). A row's product
// depends neither on the rows beside it nor on the threads (each output element is one task's),
// so any process multiplying the same rows with the same kernels gets the same bits. Safe to call
// for several experts at once.
void ExpertRows(const ModelConfig& config, const ExpertWeights& ew, std::span<const float> x,
                std::span<const size_t> from, std::span<const size_t> to, StepScratch& scratch,
                std::span<float> out);

}  // namespace k3
