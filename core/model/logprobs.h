// Log probabilities of a sampled token and of the most likely ones, from the logits it was
// sampled from (log-softmax, in double), as the OpenAI API's logprobs report them.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace k3 {

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the `top` most likely ids, most likely first
};

// `top` in [0, 20]; ids whose logit is -infinity (masked out) never appear among the top.
TokenLogprob LogProbs(std::span<const float> logits, int32_t id, int top);

}  // namespace k3
