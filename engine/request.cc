#include "engine/request.h"

namespace iris::engine {

int64_t Prompt::num_image_tokens() const {
  int64_t n = 0;
  for (const PromptImage& im : images) n += im.pad_end - im.pad_begin;
  return n;
}

}  // namespace iris::engine
