#include "expar/train/checkpoint.hpp"

#include <climits>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "expar/core/assert.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/io/checkpoint_dir.hpp"
#include "expar/io/durable_file.hpp"
#include "expar/io/mxfp4.hpp"
#include "expar/io/safetensors_file.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "expar/io/sharded_checkpoint.hpp"
#include "expar/io/strict_json.hpp"
#include "expar/model/gpt_oss_layout.hpp"
#include "expar/model/model_config_json.hpp"
#include "expar/model/weight_names.hpp"

namespace expar {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "expar-checkpoint-2";
constexpr const char* kFormatWithoutIds = "expar-checkpoint-1";  // read: files checked by step only
constexpr int kManifestMaxDepth = 8;
constexpr int64_t kMaxRanks = 1 << 20;

bool is_expert_shard(const Parameter& p) {
  return p.kind == ParamKind::Expert;
}

// "layers.3.moe.experts.w1" + global expert 5 -> "layers.3.moe.experts.5.w1"
std::string expert_name(const std::string& shard_name, int expert) {
  auto dot = shard_name.rfind('.');
  return shard_name.substr(0, dot) + "." + std::to_string(expert) + shard_name.substr(dot);
}

std::string model_hash(const ModelConfig& model) {
  return stable_hash(model_config_to_json(model).dump());
}

// Full Adam moment of parameter i (gathers an EP_DP-sharded slice), or an empty tensor.
Tensor full_moment(AdamW& opt, size_t i, bool second, Comm& ep_dp) {
  auto& s = opt.state()[i];
  const Parameter* p = opt.params()[i];
  const Tensor& part = second ? s.v : s.m;
  const int64_t n = p->value.numel();
  if (s.end - s.begin == n) return part.reshape(p->value.shape());
  Tensor full = Tensor::empty(p->value.shape(), DType::F32, MemCategory::CommScratch);
  std::vector<size_t> counts(static_cast<size_t>(ep_dp.size()));
  for (int r = 0; r < ep_dp.size(); ++r)
    counts[static_cast<size_t>(r)] = static_cast<size_t>(n * (r + 1) / ep_dp.size() - n * r / ep_dp.size());
  ep_dp.all_gather_v(part.raw(), static_cast<size_t>(part.numel()), full.raw(), counts, DType::F32);
  return full;
}

// gpt-oss keeps each layer's experts in four stacked tensors (model/gpt_oss_layout.hpp), and a safetensors
// index maps a name to one file, so the owners cannot each write their own experts: the members of the
// writing EP_MP group (EP_DP coordinate 0) convert their local experts to the family's layout and all-gather
// them, one tensor at a time, and world rank 0 (that group's EP_MP rank 0) stores the stacked tensors in
// dense.safetensors. Each member holds one gathered tensor at a time beyond its own experts; the writer keeps
// every layer's until its file is written. The Adam moments stay per expert in the owners'
// optimizer-experts-<m>.safetensors (our names), so resume reads them as for every other family.
std::map<std::string, Tensor> gather_gpt_oss_experts(MoeLayer& layer, int l, Comm& ep_mp) {
  const ExpertPlacement& placement = layer.placement();
  const ExpertWeights& w = layer.params().experts;
  const int64_t d = w.model(), h = w.hidden(), e_local = placement.local_count();
  const auto names = gpt_oss_expert_names(l);
  std::array<Shape, kGptOssExpertTensors> shapes;
  std::array<Tensor, kGptOssExpertTensors> local;
  std::array<float*, kGptOssExpertTensors> out{};
  for (int k = 0; k < kGptOssExpertTensors; ++k) {
    shapes[k] = gpt_oss_expert_shape(static_cast<GptOssExpertTensor>(k), d, h);
    local[k] = Tensor::empty({e_local, shape_numel(shapes[k])}, DType::F32, MemCategory::CommScratch);
  }
  for (int64_t i = 0; i < e_local; ++i) {
    for (int k = 0; k < kGptOssExpertTensors; ++k) out[k] = local[k].data<float>() + i * local[k].dim(1);
    gpt_oss_expert_to_hf(w, i, out);
  }
  std::map<std::string, Tensor> stacked;
  for (int k = 0; k < kGptOssExpertTensors; ++k) {
    const int64_t per = local[k].dim(1);
    std::vector<size_t> counts;
    for (int m = 0; m < placement.ep_size(); ++m)
      counts.push_back(placement.local_experts(m).size() * static_cast<size_t>(per));
    Tensor gathered = Tensor::empty({placement.num_experts() * per}, DType::F32, MemCategory::CommScratch);
    ep_mp.all_gather_v(local[k].raw(), static_cast<size_t>(local[k].numel()), gathered.raw(), counts,
                       DType::F32);
    Shape full{placement.num_experts()};
    full.insert(full.end(), shapes[k].begin(), shapes[k].end());
    Tensor t = Tensor::empty(full, DType::F32, MemCategory::CommScratch);
    // Rank-ordered blocks of each rank's local experts -> global expert order.
    const float* src = gathered.data<float>();
    for (int m = 0; m < placement.ep_size(); ++m)
      for (int e : placement.local_experts(m)) {
        std::memcpy(t.data<float>() + e * per, src, sizeof(float) * static_cast<size_t>(per));
        src += per;
      }
    stacked[names[k]] = t;
  }
  return stacked;
}

// expert_rows(name, e, shape): expert e of the stacked tensor `name` as f32 values, after checking that the
// stored tensor has `shape` [E, ...].
using StackedExpertRows = std::function<Tensor(const std::string&, int, const Shape&)>;

// Every MoE layer's local experts (weights and biases) from gpt-oss's stacked tensors.
void load_gpt_oss_experts(MoeTransformer& model, const StackedExpertRows& expert_rows) {
  for (int l = 0; l < model.config().layers; ++l) {
    if (!model.has_moe(l)) continue;  // a dense MLP layer
    MoeLayer& layer = model.moe(l);
    const ExpertPlacement& placement = layer.placement();
    const int my_ep = placement.ep_size() == 1 ? 0 : layer.ep_rank();
    ExpertWeights& w = layer.params().experts;
    const auto names = gpt_oss_expert_names(l);
    for (int i = 0; i < placement.local_count(); ++i) {
      const int e = placement.global_expert(my_ep, i);
      std::array<Tensor, kGptOssExpertTensors> rows;
      std::array<const float*, kGptOssExpertTensors> in{};
      for (int k = 0; k < kGptOssExpertTensors; ++k) {
        Shape full{placement.num_experts()};
        const Shape one = gpt_oss_expert_shape(static_cast<GptOssExpertTensor>(k), w.model(), w.hidden());
        full.insert(full.end(), one.begin(), one.end());
        rows[k] = expert_rows(names[k], e, full);
        in[k] = rows[k].data<float>();
      }
      gpt_oss_expert_from_hf(in, w, i);
    }
  }
}

// The config.json a save holds: the run's, verbatim, except that a quantization_config goes (gpt-oss's MXFP4
// experts are dequantised at load and every save holds them in F32; readers such as transformers would
// otherwise look for quantised blocks).
std::string config_json_of_save(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("quantization_config")) return text;
  j.erase("quantization_config");
  return j.dump(2) + "\n";
}

// A manifest, read and checked: every value in range, every file name inside the step directory.
// Our parameter names -> the names a save of `format` stores them under (identity for ours).
class CheckpointNames {
 public:
  CheckpointNames(ModelFormat format, const ModelConfig& config) : hf_(format != ModelFormat::Expar) {
    if (hf_) names_ = translate_weight_names(expar_weight_names(), weight_names(format), config);
  }
  bool hf() const { return hf_; }
  const std::string& weight(const std::string& ours) const {
    if (!hf_) return ours;
    auto it = names_.find(ours);
    EXPAR_ASSERT(it != names_.end(), "parameter '{}' has no Hugging Face name", ours);
    return it->second;
  }
  // The file holding the optimizer moments of the weights in `file`.
  std::string optimizer_file(const std::string& file) const { return hf_ ? "optimizer-" + file : file; }

 private:
  bool hf_;
  std::map<std::string, std::string> names_;
};

struct Manifest {
  fs::path dir;       // the step directory
  std::string label;  // its manifest.json, for messages
  CheckpointInfo info;
  CheckpointIdentity identity;
  std::string dense_file;
  std::map<int, std::string> file_of_expert;
};

Manifest read_manifest(const std::string& dir) {
  Manifest m;
  m.dir = resolve_checkpoint_dir(dir);
  const fs::path path = m.dir / "manifest.json";
  m.label = path.string();
  const json j = parse_strict_json(read_text_file(path), m.label, kManifestMaxDepth);
  EXPAR_CHECK(j.is_object(), "{}: a checkpoint manifest must be a JSON object, got {}", m.label,
              json_excerpt(j));
  auto field = [&](const char* key) -> const json& {
    EXPAR_CHECK(j.contains(key), "{}: \"{}\" is missing: the manifest is damaged; use another step directory",
                m.label, key);
    return j.at(key);
  };
  auto integer = [&](const char* key, int64_t lo, int64_t hi) {
    const json& v = field(key);
    EXPAR_CHECK(v.is_number_integer() && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
                "{}: \"{}\" is {}, not an integer in [{}, {}]: the manifest is damaged; use another step "
                "directory",
                m.label, key, json_excerpt(v), lo, hi);
    return v.get<int64_t>();
  };
  auto name = [&](const json& v, const char* what) {
    EXPAR_CHECK(v.is_string() && is_name_inside_directory(v.get<std::string>()),
                "{}: {} {} is not a file name inside the checkpoint directory: file names must be relative "
                "paths without '..'",
                m.label, what, json_excerpt(v));
    return v.get<std::string>();
  };
  const json& format = field("format");
  EXPAR_CHECK(format == kFormat || format == kFormatWithoutIds,
              "{}: \"format\" is {}, not {} or {}: not a checkpoint this expar reads", m.label,
              json_excerpt(format), kFormat, kFormatWithoutIds);
  m.info.step = integer("step", 0, INT_MAX);
  const json& seed = field("seed");
  EXPAR_CHECK(seed.is_number_unsigned() || (seed.is_number_integer() && seed.get<int64_t>() >= 0),
              "{}: \"seed\" is {}, not a non-negative integer", m.label, json_excerpt(seed));
  m.info.seed = seed.get<uint64_t>();
  m.info.world = static_cast<int>(integer("world", 1, kMaxRanks));
  m.info.ep = static_cast<int>(integer("ep", 1, kMaxRanks));
  try {
    m.info.model = model_config_from_json(field("model"));
    m.info.model.validate();
  } catch (const Error& e) {
    fail("{}: \"model\": {}", m.label, e.what());
  }
  m.identity.step = m.info.step;
  if (format == kFormat) {
    for (const char* key : {"save_id", "model_hash"})
      EXPAR_CHECK(field(key).is_string(), "{}: \"{}\" must be a string, got {}", m.label, key,
                  json_excerpt(field(key)));
    m.identity.save_id = field("save_id").get<std::string>();
    m.identity.model_hash = field("model_hash").get<std::string>();
    EXPAR_CHECK(m.identity.model_hash == model_hash(m.info.model),
                "{}: \"model_hash\" {} does not match its \"model\" (hash {}): the model config was edited; "
                "restore the manifest written with the checkpoint",
                m.label, m.identity.model_hash, model_hash(m.info.model));
  }
  if (j.contains("architecture")) {
    const json& arch = j.at("architecture");
    EXPAR_CHECK(arch.is_string(), "{}: \"architecture\" must be a string, got {}", m.label,
                json_excerpt(arch));
    try {
      m.info.format = model_format_from_name(arch.get<std::string>());
    } catch (const Error& e) {
      fail("{}: \"architecture\": {}", m.label, e.what());
    }
  }
  m.dense_file = name(field("dense_file"), "\"dense_file\"");
  const json& experts = field("expert_files");
  EXPAR_CHECK(experts.is_object(),
              "{}: \"expert_files\" must be an object of file name -> expert ids, got {}", m.label,
              json_excerpt(experts));
  const int num_experts = m.info.model.moe.router.num_experts;
  for (const auto& [file, ids] : experts.items()) {
    name(json(file), "\"expert_files\" key");
    EXPAR_CHECK(ids.is_array(), "{}: \"expert_files\".\"{}\" must be an array of expert ids, got {}", m.label,
                text_excerpt(file), json_excerpt(ids));
    for (const json& e : ids) {
      EXPAR_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < num_experts,
                  "{}: \"expert_files\".\"{}\" lists expert {}, outside [0, {}) of the model's experts",
                  m.label, text_excerpt(file), json_excerpt(e), num_experts);
      EXPAR_CHECK(m.file_of_expert.emplace(e.get<int>(), file).second,
                  "{}: expert {} is listed in two expert files: the manifest is damaged", m.label,
                  e.get<int>());
    }
  }
  return m;
}

// The files of one loaded checkpoint, each opened once and checked to belong to the manifest's save.
class CheckpointFiles {
 public:
  explicit CheckpointFiles(const Manifest& m) : m_(m) {}
  const SafetensorsFile& open(const std::string& name) {
    auto it = files_.find(name);
    if (it == files_.end()) {
      SafetensorsFile f = SafetensorsFile::open(m_.dir / name);
      check_checkpoint_file_identity(f.metadata(), f.label(), m_.identity, m_.label);
      it = files_.emplace(name, std::move(f)).first;
    }
    return it->second;
  }

 private:
  const Manifest& m_;
  std::map<std::string, SafetensorsFile> files_;
};

}  // namespace

std::string model_config_difference(const ModelConfig& ours, const ModelConfig& theirs) {
  const json a = model_config_to_json(ours), b = model_config_to_json(theirs);
  std::set<std::string> keys;
  for (const auto& [k, _] : a.items()) keys.insert(k);
  for (const auto& [k, _] : b.items()) keys.insert(k);
  for (const std::string& k : keys) {
    const json va = a.contains(k) ? a[k] : json(), vb = b.contains(k) ? b[k] : json();
    if (va != vb) return fmt::format("model.{} is {} here but {} in the checkpoint", k, va.dump(), vb.dump());
  }
  return {};
}

void save_checkpoint(const std::string& dir, const CheckpointInfo& info, MoeTransformer& model,
                     AdamW* optimizer, Comm& world, Comm& ep_mp, Comm& ep_dp,
                     const CheckpointSaveOptions& options) {
  // Rank 0 prepares the staging directory and names the save; the broadcast is also the barrier after which
  // every writer may write into it.
  char save_id[17] = {};
  if (world.rank() == 0) {
    begin_checkpoint_save(dir, info.step);
    const std::string id = new_save_id();
    std::memcpy(save_id, id.data(), std::min(id.size(), sizeof(save_id) - 1));
  }
  world.broadcast(save_id, sizeof(save_id), DType::U8, 0);
  const fs::path staging = checkpoint_staging_dir(dir, info.step);
  const ExpertPlacement& placement = model.first_moe().placement();
  const int my_ep = ep_mp.rank();
  auto& params = model.parameters();
  // Moments of sharded expert state must be gathered by every EP_DP member (collective), before deciding
  // who writes.
  const CheckpointNames names(info.format, model.config());
  const bool stacked_experts = info.format == ModelFormat::GptOss;  // see gather_gpt_oss_experts
  // Weights under the format's names; the moments under ours, beside them (ours) or in their own files.
  std::map<std::string, Tensor> dense, experts, dense_moments, expert_moments;
  std::map<std::string, Tensor>& dense_opt = names.hf() ? dense_moments : dense;
  std::map<std::string, Tensor>& expert_opt = names.hf() ? expert_moments : experts;
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    Tensor m, v;
    if (optimizer) {
      m = full_moment(*optimizer, i, false, ep_dp);
      v = full_moment(*optimizer, i, true, ep_dp);
    }
    if (!is_expert_shard(p)) {
      dense[names.weight(p.name)] = p.value;
      if (optimizer) {
        dense_opt["optimizer.m." + p.name] = m;
        dense_opt["optimizer.v." + p.name] = v;
      }
      continue;
    }
    for (int l = 0; l < placement.local_count(); ++l) {
      const int e = placement.global_expert(my_ep, l);
      auto slice = [&](const Tensor& t) {
        Shape s(t.shape().begin() + 1, t.shape().end());
        return t.rows(l, l + 1).reshape(s);
      };
      if (!stacked_experts) experts[names.weight(expert_name(p.name, e))] = slice(p.value);
      if (optimizer) {
        expert_opt["optimizer.m." + expert_name(p.name, e)] = slice(m);
        expert_opt["optimizer.v." + expert_name(p.name, e)] = slice(v);
      }
    }
  }
  for (int l = 0; l < model.config().layers; ++l) {
    if (!model.has_moe(l)) continue;
    const Tensor& bias = model.moe(l).params().score_bias;
    if (bias.defined() && bias.numel() > 0)
      dense[names.weight("layers." + std::to_string(l) + ".moe.score_bias")] = bias;
  }
  if (stacked_experts && ep_dp.rank() == 0)
    for (int l = 0; l < model.config().layers; ++l) {
      if (!model.has_moe(l)) continue;
      std::map<std::string, Tensor> layer = gather_gpt_oss_experts(model.moe(l), l, ep_mp);
      if (world.rank() == 0) dense.merge(layer);
    }
  const std::string hash = model_hash(info.model);
  std::map<std::string, std::string> meta{
      {"format", "expar"}, {"step", std::to_string(info.step)}, {"save_id", save_id}, {"model_hash", hash}};
  const std::string expert_file = "experts-" + std::to_string(my_ep) + ".safetensors";
  if (world.rank() == 0) {
    write_safetensors(staging / "dense.safetensors", dense, meta);
    if (names.hf())
      write_safetensors(staging / names.optimizer_file("dense.safetensors"), dense_moments, meta);
  }
  if (ep_dp.rank() == 0) {
    if (!stacked_experts) write_safetensors(staging / expert_file, experts, meta);
    if (names.hf()) write_safetensors(staging / names.optimizer_file(expert_file), expert_moments, meta);
  }
  if (names.hf() && world.rank() == 0) {
    // The Hugging Face index: every weight, the dense ones from here, each expert's from its owner's file
    // (rank 0 knows the names from the placement; every expert tensor of a layer has the same size).
    json weight_map = json::object();
    size_t total = 0;
    for (const auto& [n, t] : dense) {
      weight_map[n] = "dense.safetensors";
      total += t.nbytes();
    }
    for (const Parameter& p : params) {
      if (!is_expert_shard(p) || stacked_experts) continue;  // gpt-oss's are in the dense file
      const size_t per_expert = p.value.nbytes() / static_cast<size_t>(placement.local_count());
      for (int m = 0; m < placement.ep_size(); ++m)
        for (int e : placement.local_experts(m)) {
          weight_map[names.weight(expert_name(p.name, e))] = "experts-" + std::to_string(m) + ".safetensors";
          total += per_expert;
        }
    }
    const json index{{"metadata", {{"total_size", total}, {"format", "pt"}}}, {"weight_map", weight_map}};
    write_file_atomically(staging / std::string(kShardedIndexName), index.dump(2) + "\n");
    write_file_atomically(staging / "config.json", config_json_of_save(info.hf_config_json));
  }
  world.barrier();  // every file of the save is written and synced
  if (world.rank() == 0) {
    json files = json::object();
    for (int m = 0; m < placement.ep_size(); ++m)
      files["experts-" + std::to_string(m) + ".safetensors"] = placement.local_experts(m);
    json manifest{{"format", kFormat},
                  {"step", info.step},
                  {"seed", info.seed},
                  {"world", info.world},
                  {"ep", info.ep},
                  {"placement", placement_name(placement.kind())},
                  {"model", model_config_to_json(info.model)},
                  {"save_id", save_id},
                  {"model_hash", hash},
                  {"dense_file", "dense.safetensors"},
                  {"expert_files", files}};
    if (names.hf()) manifest["architecture"] = model_format_name(info.format);
    write_file_atomically(staging / "manifest.json", manifest.dump(2) + "\n");
    commit_checkpoint_save(dir, info.step, options.keep_last, options.remove_others);
  }
  world.barrier();
}

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  return read_manifest(dir).info;
}

void load_checkpoint(const std::string& dir, MoeTransformer& model, AdamW* optimizer) {
  const Manifest manifest = read_manifest(dir);
  const std::string label = manifest.dir.string();
  const CheckpointNames names(manifest.info.format, model.config());
  CheckpointFiles files(manifest);
  const SafetensorsFile& dense = files.open(manifest.dense_file);
  const SafetensorsFile* dense_moments_file = nullptr;
  auto dense_moments = [&]() -> const SafetensorsFile& {
    if (!dense_moments_file) dense_moments_file = &files.open(names.optimizer_file(manifest.dense_file));
    return *dense_moments_file;
  };
  std::set<std::string> dense_used;
  const bool stacked_experts = manifest.info.format == ModelFormat::GptOss;  // in the dense file
  auto expert_file_name = [&](int e) -> const std::string& {
    auto it = manifest.file_of_expert.find(e);
    EXPAR_CHECK(it != manifest.file_of_expert.end(),
                "checkpoint '{}' holds no file for expert {}: the model has more experts than the checkpoint",
                label, e);
    return it->second;
  };
  auto source = [&](const SafetensorsFile& file, const std::string& name, int64_t numel) {
    EXPAR_CHECK(file.contains(name), "checkpoint '{}': tensor '{}' is missing from {}", label, name,
                file.label());
    Tensor src = file.view(name);
    EXPAR_CHECK(src.numel() == numel && src.dtype() == DType::F32,
                "checkpoint '{}': tensor '{}' in {} has shape {} {} but the model needs {} F32 values", label,
                name, file.label(), shape_string(src.shape()), dtype_name(src.dtype()), numel);
    if (&file == &dense || &file == dense_moments_file) dense_used.insert(name);
    return src;
  };
  auto copy_into = [&](Tensor dst, const SafetensorsFile& file, const std::string& name) {
    Tensor src = source(file, name, dst.numel());
    std::memcpy(dst.raw(), src.raw(), dst.nbytes());
  };
  const ExpertPlacement& placement = model.first_moe().placement();
  const int my_ep = placement.ep_size() == 1 ? 0 : model.first_moe().ep_rank();
  auto& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    AdamW::State* st = optimizer ? &optimizer->state()[i] : nullptr;
    if (!is_expert_shard(p)) {
      copy_into(p.value, dense, names.weight(p.name));
      if (st) {
        copy_into(st->m, names.hf() ? dense_moments() : dense, "optimizer.m." + p.name);
        copy_into(st->v, names.hf() ? dense_moments() : dense, "optimizer.v." + p.name);
      }
      continue;
    }
    const int64_t per_expert = p.value.numel() / placement.local_count();
    for (int l = 0; l < placement.local_count(); ++l) {
      const int e = placement.global_expert(my_ep, l);
      const std::string name = expert_name(p.name, e);
      if (!stacked_experts)
        copy_into(p.value.rows(l, l + 1), files.open(expert_file_name(e)), names.weight(name));
      if (!st) continue;
      const SafetensorsFile& moments = files.open(names.optimizer_file(expert_file_name(e)));
      // The state may cover only a slice [begin, end) of the flattened local shard (EP_DP sharding).
      for (const char* which : {"m", "v"}) {
        const std::string key = std::string("optimizer.") + which + "." + name;
        EXPAR_CHECK(moments.contains(key),
                    "checkpoint '{}' has no optimizer state '{}': resume needs a checkpoint written with its "
                    "optimizer",
                    label, key);
        Tensor src = source(moments, key, per_expert);
        Tensor& dst = which[0] == 'm' ? st->m : st->v;
        const int64_t lo = std::max<int64_t>(st->begin, l * per_expert);
        const int64_t hi = std::min<int64_t>(st->end, (l + 1) * per_expert);
        if (lo < hi)
          std::memcpy(dst.data<float>() + (lo - st->begin), src.data<float>() + (lo - l * per_expert),
                      sizeof(float) * static_cast<size_t>(hi - lo));
      }
    }
  }
  for (int l = 0; l < model.config().layers; ++l) {
    if (!model.has_moe(l)) continue;
    Tensor& bias = model.moe(l).params().score_bias;
    const std::string name = names.weight("layers." + std::to_string(l) + ".moe.score_bias");
    if (!bias.defined() || bias.numel() == 0) continue;
    EXPAR_CHECK(dense.contains(name),
                "checkpoint '{}': tensor '{}' (the score bias its model config names) is missing from {}",
                label, name, dense.label());
    copy_into(bias, dense, name);
  }
  if (stacked_experts)
    load_gpt_oss_experts(model, [&](const std::string& name, int e, const Shape& shape) {
      EXPAR_CHECK(dense.contains(name), "checkpoint '{}': tensor '{}' is missing from {}", label, name,
                  dense.label());
      const Tensor src = dense.view(name);
      EXPAR_CHECK(src.shape() == shape && src.dtype() == DType::F32,
                  "checkpoint '{}': tensor '{}' in {} is {} {} but the model needs F32 {}", label, name,
                  dense.label(), dtype_name(src.dtype()), shape_string(src.shape()), shape_string(shape));
      dense_used.insert(name);
      return src.rows(e, e + 1);
    });
  // A tensor nobody loaded means the manifest's model config does not describe the files (e.g. "layers": 1
  // for a 2-layer checkpoint).
  std::vector<const SafetensorsFile*> dense_files{&dense};
  if (dense_moments_file) dense_files.push_back(dense_moments_file);
  for (const SafetensorsFile* file : dense_files)
    for (const std::string& name : file->names()) {
      const bool optimizer_state = name.starts_with("optimizer.");
      if (dense_used.contains(name) || (optimizer_state && !optimizer)) continue;
      fail(
          "checkpoint '{}': {} holds tensor '{}', which the model of {} does not have: the manifest's model "
          "config does not describe these files; restore the manifest written with them",
          label, file->label(), name, manifest.label);
    }
  if (optimizer) optimizer->set_steps_taken(manifest.info.step);
}

void load_hf_weights(const fs::path& dir, ModelFormat format, MoeTransformer& model) {
  EXPAR_CHECK(format != ModelFormat::Expar, "load_hf_weights: '{}' names our format; use load_checkpoint",
              dir.string());
  const ShardedCheckpoint checkpoint = ShardedCheckpoint::open_directory(dir);
  const CheckpointNames names(format, model.config());
  auto copy = [&](Tensor dst, const std::string& name) {
    EXPAR_CHECK(
        checkpoint.contains(name),
        "'{}': tensor '{}' is missing: the weights do not hold the {} model its config.json describes",
        dir.string(), name, model_format_name(format));
    Tensor src = checkpoint.view(name);
    EXPAR_CHECK(src.numel() == dst.numel(), "'{}': tensor '{}' has shape {} but the model needs {} values",
                dir.string(), name, shape_string(src.shape()), dst.numel());
    if (src.dtype() == DType::F8E4M3) {
      // Block-scaled FP8 (DeepSeek-V3's and Qwen3's FP8 releases): NAME_scale_inv multiplies each 128 x 128
      // block; dequantised here, so a fine-tuning run trains (and saves) the values the release encodes.
      const std::string scale = name + "_scale_inv";
      const Shape grid = src.ndim() == 2 ? Shape{(src.dim(0) + kFp8Block - 1) / kFp8Block,
                                                 (src.dim(1) + kFp8Block - 1) / kFp8Block}
                                         : Shape{};
      EXPAR_CHECK(src.ndim() == 2 && checkpoint.contains(scale) &&
                      checkpoint.info(scale).dtype == DType::F32 && checkpoint.info(scale).shape == grid,
                  "'{}': tensor '{}' is F8_E4M3 {} without its block multipliers '{}' (F32 [ceil(out/128), "
                  "ceil(in/128)]): expar loads block-scaled FP8 only; dequantise the checkpoint to BF16",
                  dir.string(), name, shape_string(src.shape()), scale);
      src = src.with_block_scales(checkpoint.view(scale));
    }
    const Tensor f32 = to_f32(src, MemCategory::Other);
    std::memcpy(dst.raw(), f32.raw(), dst.nbytes());
  };
  const ExpertPlacement& placement = model.first_moe().placement();
  const int my_ep = placement.ep_size() == 1 ? 0 : model.first_moe().ep_rank();
  const bool stacked_experts = format == ModelFormat::GptOss;
  for (Parameter& p : model.parameters()) {
    if (!is_expert_shard(p)) {
      copy(p.value, names.weight(p.name));
      continue;
    }
    if (stacked_experts) continue;  // below
    for (int l = 0; l < placement.local_count(); ++l)
      copy(p.value.rows(l, l + 1), names.weight(expert_name(p.name, placement.global_expert(my_ep, l))));
  }
  // The score bias of a family that has one (DeepSeek-V3's e_score_correction_bias) starts from its weights.
  for (int l = 0; l < model.config().layers; ++l) {
    if (!model.has_moe(l)) continue;
    Tensor& bias = model.moe(l).params().score_bias;
    if (bias.defined() && bias.numel() > 0)
      copy(bias, names.weight("layers." + std::to_string(l) + ".moe.score_bias"));
  }
  if (!stacked_experts) return;
  load_gpt_oss_experts(model, [&](const std::string& name, int e, const Shape& shape) {
    const std::string blocks = name + "_blocks", scales = name + "_scales";
    if (!checkpoint.contains(name) && checkpoint.contains(blocks) && checkpoint.contains(scales)) {
      // gpt-oss's released MXFP4 experts: this rank's experts dequantised at load (io/mxfp4.hpp).
      const int64_t in = shape[1], out = shape.back();
      const Shape want_blocks{shape[0], out, in / 32, 16}, want_scales{shape[0], out, in / 32};
      EXPAR_CHECK(
          shape.size() == 3 && in % 32 == 0 && checkpoint.info(blocks).dtype == DType::U8 &&
              checkpoint.info(blocks).shape == want_blocks && checkpoint.info(scales).dtype == DType::U8 &&
              checkpoint.info(scales).shape == want_scales,
          "'{}': MXFP4 tensors '{}' {} and '{}' {} do not encode the model's {} (blocks U8 {}, scales "
          "U8 {})",
          dir.string(), blocks, shape_string(checkpoint.info(blocks).shape), scales,
          shape_string(checkpoint.info(scales).shape), shape_string(shape), shape_string(want_blocks),
          shape_string(want_scales));
      Tensor values = Tensor::empty({1, in, out}, DType::F32, MemCategory::Other);
      dequantize_mxfp4(static_cast<const uint8_t*>(checkpoint.view_rows(blocks, e, e + 1).raw()),
                       static_cast<const uint8_t*>(checkpoint.view_rows(scales, e, e + 1).raw()), 1, in, out,
                       values.data<float>());
      return values;
    }
    EXPAR_CHECK(
        checkpoint.contains(name),
        "'{}': tensor '{}' is missing: the weights do not hold the {} model its config.json describes",
        dir.string(), name, model_format_name(format));
    EXPAR_CHECK(checkpoint.info(name).shape == shape, "'{}': tensor '{}' has shape {} but the model needs {}",
                dir.string(), name, shape_string(checkpoint.info(name).shape), shape_string(shape));
    return to_f32(checkpoint.view_rows(name, e, e + 1), MemCategory::Other);
  });
}

void check_checkpoint_target(const std::string& dir, const ModelConfig& model, bool overwrite) {
  check_checkpoint_dir_writable(dir, "--checkpoint");
  if (overwrite || !holds_checkpoint(dir)) return;
  CheckpointInfo existing;
  try {
    existing = read_checkpoint_info(dir);
  } catch (const Error& e) {
    fail(
        "--checkpoint '{}' holds a checkpoint that cannot be read ({}): pass --overwrite to replace it, or "
        "another directory",
        dir, e.what());
  }
  const std::string difference = model_config_difference(model, existing.model);
  EXPAR_CHECK(
      difference.empty(),
      "--checkpoint '{}' already holds a checkpoint of another model ({}): pass --overwrite to replace "
      "it, or another directory",
      dir, difference);
}

}  // namespace expar
