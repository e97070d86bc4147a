#include "expar/model/architecture.hpp"

#include "expar/core/error.hpp"

namespace expar {

const std::vector<ModelFormat>& all_model_formats() {
  static const std::vector<ModelFormat> all{
      ModelFormat::Expar, ModelFormat::Mixtral, ModelFormat::QwenMoe,    ModelFormat::Qwen3Moe,
      ModelFormat::Olmoe, ModelFormat::GptOss,  ModelFormat::DeepseekV3, ModelFormat::DeepseekV2};
  return all;
}

std::string model_format_name(ModelFormat format) {
  switch (format) {
    case ModelFormat::Expar:
      return "ours";
    case ModelFormat::Mixtral:
      return "mixtral";
    case ModelFormat::QwenMoe:
      return "qwen-moe";
    case ModelFormat::Qwen3Moe:
      return "qwen3-moe";
    case ModelFormat::Olmoe:
      return "olmoe";
    case ModelFormat::GptOss:
      return "gpt-oss";
    case ModelFormat::DeepseekV3:
      return "deepseek-v3";
    case ModelFormat::DeepseekV2:
      return "deepseek-v2";
  }
  return "?";
}

std::string hf_model_type(ModelFormat format) {
  switch (format) {
    case ModelFormat::Mixtral:
      return "mixtral";
    case ModelFormat::QwenMoe:
      return "qwen2_moe";
    case ModelFormat::Qwen3Moe:
      return "qwen3_moe";
    case ModelFormat::Olmoe:
      return "olmoe";
    case ModelFormat::GptOss:
      return "gpt_oss";
    case ModelFormat::DeepseekV3:
      return "deepseek_v3";
    case ModelFormat::DeepseekV2:
      return "deepseek_v2";
    case ModelFormat::Expar:
      break;
  }
  return "";
}

std::vector<std::string> model_format_names() {
  std::vector<std::string> names;
  for (ModelFormat f : all_model_formats()) names.push_back(model_format_name(f));
  return names;
}

ModelFormat model_format_from_name(const std::string& name) {
  for (ModelFormat f : all_model_formats())
    if (name == model_format_name(f)) return f;
  fail("checkpoint format '{}' is unknown: use one of {} (or auto)", name,
       fmt::join(model_format_names(), ", "));
}

std::optional<ModelFormat> format_of_model_type(const std::string& model_type) {
  for (ModelFormat f : all_model_formats())
    if (f != ModelFormat::Expar && model_type == hf_model_type(f)) return f;
  return std::nullopt;
}

nn::RopeScaling rope_scaling(const ModelConfig& config, const ModelFeatures& features) {
  nn::RopeScaling s = features.rope;
  s.theta = config.rope_theta;
  return s;
}

}  // namespace expar
