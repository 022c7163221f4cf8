// iris-make-model: writes a synthetic checkpoint of one of the Qwen families (Hugging Face layout, bf16) whose
// weights follow tests/data/WEIGHTS.md, so that tests and benchmarks need no downloads.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "tools/iris-make-model/checkpoint_writer.h"
#include "core/command_line.h"
#include "core/memory_plan.h"
#include "core/model_config.h"
#include "tools/iris-make-model/presets.h"

ABSL_FLAG(std::string, preset, "", "model preset (required; see --help for the list)");
ABSL_FLAG(std::string, out, "", "output directory, created if missing (required)");
ABSL_FLAG(bool, vision_only, false, "write only the visual.* tensors (config files stay complete)");
ABSL_FLAG(std::string, dtype, "bf16", "weight dtype; only bf16 is supported");
ABSL_FLAG(std::string, tokenizer_from, "",
          "copy tokenizer.json, tokenizer_config.json and chat_template.json from this directory");
ABSL_FLAG(bool, config_only, false,
          "write only the JSON files (no weights) and print the memory the checkpoint would take; the only "
          "way to use the 32B/72B presets here");
ABSL_FLAG(uint64_t, max_shard_bytes, iris::tools::kDefaultMaxShardBytes,
          "(for tests) largest safetensors file before the weights are sharded");

namespace {

std::string Usage() {
  return absl::StrCat(
      "writes a synthetic Qwen2.5-VL checkpoint in the Hugging Face layout.\n\n"
      "usage: iris-make-model --preset NAME --out DIR [--vision-only] [--dtype bf16]\n"
      "                       [--tokenizer-from DIR]\n\n"
      "Writes config.json, preprocessor_config.json, generation_config.json and bf16 weights with\n"
      "the public tensor names: model.safetensors, or model-0000K-of-0000N.safetensors shards and\n"
      "model.safetensors.index.json when they exceed 4 GB. Every weight is a pure function of\n"
      "(seed, tensor name, index) as tests/data/WEIGHTS.md specifies. Tokenizers cannot be\n"
      "synthesised: --tokenizer-from copies them from a real checkpoint (or tests/data/tiny-qwen2.5-vl).\n\n"
      "flags:\n"
      "  --preset NAME          one of the presets below; required\n"
      "  --out DIR              output directory, created if missing; required\n"
      "  --vision-only          write only the visual.* tensors (the JSON files stay complete)\n"
      "  --dtype bf16           weight dtype; bf16 is the only one\n"
      "  --tokenizer-from DIR   copy tokenizer.json, tokenizer_config.json, chat_template.json\n"
      "                         (text-only presets: tokenizer.json, and tokenizer_config.json with\n"
      "                         Qwen2.5-Instruct's text chat template)\n"
      "  --config-only          only the JSON files; prints the memory iris would need for it\n\n"
      "presets:\n",
      iris::tools::PresetsHelp());
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "iris-make-model: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(Usage());
  for (int i = 1; i < argc && std::string_view(argv[i]) != "--"; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-help" || a == "-h") {
      std::printf("iris-make-model: %s", Usage().c_str());
      return 0;
    }
  }
  if (absl::Status parsed = iris::core::ParseFlags(argc, argv); !parsed.ok()) {
    return Fail(absl::StrCat(parsed.message(), " (see --help)"));
  }
  const std::string preset_name = absl::GetFlag(FLAGS_preset);
  if (preset_name.empty()) {
    return Fail(absl::StrCat("--preset is required (one of ", iris::tools::PresetNames(), "; see --help)"));
  }
  const iris::tools::Preset* preset = iris::tools::FindPreset(preset_name);
  if (preset == nullptr) {
    return Fail(absl::StrCat("unknown preset \"", preset_name, "\"; known presets: ",
                             iris::tools::PresetNames()));
  }
  if (absl::GetFlag(FLAGS_dtype) != "bf16") {
    return Fail(absl::StrCat("unsupported --dtype \"", absl::GetFlag(FLAGS_dtype), "\"; only bf16 is supported"));
  }
  iris::tools::WriteOptions options;
  options.out_dir = absl::GetFlag(FLAGS_out);
  if (options.out_dir.empty()) return Fail("--out DIR is required");
  options.vision_only = absl::GetFlag(FLAGS_vision_only);
  options.max_shard_bytes = absl::GetFlag(FLAGS_max_shard_bytes);
  options.tokenizer_from = absl::GetFlag(FLAGS_tokenizer_from);
  options.config_only = absl::GetFlag(FLAGS_config_only);

  const auto summary = iris::tools::WriteSyntheticModel(*preset, options);
  if (!summary.ok()) return Fail(std::string(summary.status().message()));
  if (options.config_only) {
    // The config as iris reads it: the tensor list it implies, and the memory at default budgets.
    auto config = iris::core::LoadModelConfig(options.out_dir);
    if (!config.ok()) return Fail(std::string(config.status().message()));
    const int64_t implied = iris::core::CountParameters(*config);
    if (implied != summary->parameters) {
      return Fail(absl::StrCat("the config implies ", implied, " parameters, the preset's tensors hold ",
                               summary->parameters));
    }
    iris::core::MemoryBudgets budgets;
    budgets.kv_cache_bytes = int64_t{1} << 30;  // iris-server's defaults
    const iris::core::MemoryEstimate estimate = iris::core::EstimateMemory(*config, budgets);
    std::printf("iris-make-model: preset %s (config only) -> %s: %lld tensors, %lld parameters (%s); "
                "iris-server would need %s at its default budgets\n",
                preset->name.c_str(), options.out_dir.c_str(), static_cast<long long>(summary->tensors),
                static_cast<long long>(summary->parameters), iris::core::FamilyArchitecture(config->family),
                iris::core::DescribeMemory(estimate, budgets).c_str());
    return 0;
  }
  std::printf("iris-make-model: preset %s%s -> %s: %lld tensors, %lld parameters, %llu bytes in %d file%s%s, %.2f s\n",
              preset->name.c_str(), options.vision_only ? " (vision only)" : "", options.out_dir.c_str(),
              static_cast<long long>(summary->tensors), static_cast<long long>(summary->parameters),
              static_cast<unsigned long long>(summary->bytes), summary->files, summary->files == 1 ? "" : "s",
              summary->tokenizer_files > 0 ? absl::StrCat(", ", summary->tokenizer_files, " tokenizer files copied").c_str() : "",
              summary->seconds);
  return 0;
}
