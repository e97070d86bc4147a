#include "expar/train/checkpoint.hpp"

#include <fmt/ranges.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "expar/core/assert.hpp"
#include "expar/core/tensor_convert.hpp"
#include "expar/io/checkpoint_dir.hpp"
#include "expar/io/durable_file.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "expar/io/sharded_checkpoint.hpp"
#include "expar/model/checkpoint_manifest.hpp"
#include "expar/model/gpt_oss_layout.hpp"
#include "expar/model/hf_experts.hpp"
#include "expar/model/model_config_json.hpp"
#include "expar/model/tensor_store.hpp"
#include "expar/model/weight_names.hpp"
#include "expar/moe/expert_slots.hpp"

namespace expar {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool is_expert_shard(const Parameter& p) {
  return p.kind == ParamKind::Expert;
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
    Tensor gathered = Tensor::empty({placement.num_slots() * per}, DType::F32, MemCategory::CommScratch);
    ep_mp.all_gather_v(local[k].raw(), static_cast<size_t>(local[k].numel()), gathered.raw(), counts,
                       DType::F32);
    Shape full{placement.num_experts()};
    full.insert(full.end(), shapes[k].begin(), shapes[k].end());
    Tensor t = Tensor::empty(full, DType::F32, MemCategory::CommScratch);
    // Rank-ordered blocks of each rank's local experts -> global expert order (replicas: the same values).
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

// Every MoE layer's local experts (weights and biases) from gpt-oss's stacked tensors in `store`, read whole
// (intermediate [0, h)) by the engine's loader of that layout (model/hf_experts.hpp); `used` gets the names.
void load_gpt_oss_expert_params(const TensorStore& store, MoeTransformer& model,
                                std::set<std::string>& used) {
  for (int l = 0; l < model.config().layers; ++l) {
    if (!model.has_moe(l)) continue;  // a dense MLP layer
    MoeLayer& layer = model.moe(l);
    const ExpertPlacement& placement = layer.placement();
    const int my_ep = placement.ep_size() == 1 ? 0 : layer.ep_rank();
    ExpertWeights& w = layer.params().experts;
    const auto names = gpt_oss_expert_names(l);
    for (int k = 0; k < kGptOssExpertTensors; ++k) {
      Shape full{placement.num_experts()};
      const Shape one = gpt_oss_expert_shape(static_cast<GptOssExpertTensor>(k), w.model(), w.hidden());
      full.insert(full.end(), one.begin(), one.end());
      EXPAR_CHECK(store.contains(names[k]),
                  "checkpoint '{}': tensor '{}' is missing: the weights do not hold the gpt-oss model its "
                  "config describes",
                  store.label(), names[k]);
      const TensorInfo& info = store.info(names[k]);
      EXPAR_CHECK(info.shape == full, "checkpoint '{}': tensor '{}' is {} {} but the model needs {}",
                  store.label(), names[k], dtype_name(info.dtype), shape_string(info.shape),
                  shape_string(full));
      used.insert(names[k]);
    }
    const std::vector<int> local = placement.local_experts(my_ep);
    const GptOssExperts g = load_gpt_oss_experts(store, l, local, 0, w.hidden(), true);
    for (auto [dst, src] :
         {std::pair{&w.w1, &g.weights.w1}, std::pair{&w.w3, &g.weights.w3}, std::pair{&w.w2, &g.weights.w2},
          std::pair{&w.b1, &g.b1}, std::pair{&w.b3, &g.b3}, std::pair{&w.b2, &g.b2}}) {
      const Tensor f32 = to_f32(*src, MemCategory::Other);
      EXPAR_ASSERT(f32.numel() == dst->numel(), "gpt-oss experts of layer {}: {} values for {}", l,
                   f32.numel(), dst->numel());
      std::memcpy(dst->raw(), f32.raw(), dst->nbytes());
    }
  }
}

// The config.json a save holds: the run's, except that a quantization_config goes (gpt-oss's MXFP4 experts
// and FP8 weights are dequantised at load and every save holds them in the save's dtype; readers such as
// transformers would otherwise look for quantised blocks) and that its dtype key (v5's "dtype", else
// "torch_dtype") names the dtype the weights are saved in.
std::string config_json_of_save(const std::string& text, DType saved) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return text;
  j.erase("quantization_config");
  j[j.contains("dtype") ? "dtype" : "torch_dtype"] = saved == DType::BF16 ? "bfloat16" : "float32";
  return j.dump(2) + "\n";
}

// The prefix of a parameter's f32 master weights in a save whose weights are narrower (--save-dtype bf16):
// stored beside its optimizer moments, so that resuming starts from the exact f32 values.
constexpr const char* kMaster = "master.";

}  // namespace

std::vector<std::string> save_dtype_names() {
  return {"f32", "bf16"};
}

DType save_dtype_from_name(const std::string& name) {
  if (name == "f32") return DType::F32;
  EXPAR_CHECK(name == "bf16", "--save-dtype {} is not a dtype a checkpoint is saved in: use f32 or bf16",
              name);
  return DType::BF16;
}

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
  // Logical experts only, so the save loads under any placement: each from its first slot.
  const std::vector<bool> first_slots = first_replica_slots(placement, my_ep);
  auto& params = model.parameters();
  // Moments of sharded expert state must be gathered by every EP_DP member (collective), before deciding
  // who writes.
  const CheckpointNames names(info.format, model.config());
  const bool stacked_experts = info.format == ModelFormat::GptOss;  // see gather_gpt_oss_experts
  EXPAR_CHECK(info.save_dtype == DType::F32 || info.save_dtype == DType::BF16,
              "a checkpoint's weights are saved as F32 or BF16, not {}: pass --save-dtype {}",
              dtype_name(info.save_dtype), fmt::format("{}", fmt::join(save_dtype_names(), " or ")));
  const bool narrow = info.save_dtype != DType::F32;  // then each weight's f32 master is saved too
  auto as_saved = [&](const Tensor& t) { return narrow ? to_bf16(t, MemCategory::CommScratch) : t; };
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
      dense[names.weight(p.name)] = as_saved(p.value);
      if (narrow) dense_opt[kMaster + p.name] = p.value;
      if (optimizer) {
        dense_opt["optimizer.m." + p.name] = m;
        dense_opt["optimizer.v." + p.name] = v;
      }
      continue;
    }
    for (int l = 0; l < placement.local_count(); ++l) {
      if (!first_slots[static_cast<size_t>(l)]) continue;  // a replica: saved from its expert's first slot
      const int e = placement.global_expert(my_ep, l);
      auto slice = [&](const Tensor& t) {
        Shape s(t.shape().begin() + 1, t.shape().end());
        return t.rows(l, l + 1).reshape(s);
      };
      if (!stacked_experts) experts[names.weight(expert_tensor_name(p.name, e))] = as_saved(slice(p.value));
      if (narrow) expert_opt[kMaster + expert_tensor_name(p.name, e)] = slice(p.value);
      if (optimizer) {
        expert_opt["optimizer.m." + expert_tensor_name(p.name, e)] = slice(m);
        expert_opt["optimizer.v." + expert_tensor_name(p.name, e)] = slice(v);
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
      if (world.rank() == 0)
        for (const auto& [name, t] : layer) dense[name] = as_saved(t);
    }
  const std::string hash = checkpoint_model_hash(info.model);
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
      const size_t per_expert =
          static_cast<size_t>(p.value.numel() / placement.local_count()) * dtype_size(info.save_dtype);
      for (int m = 0; m < placement.ep_size(); ++m)
        for (int e : first_replica_experts(placement, m)) {
          weight_map[names.weight(expert_tensor_name(p.name, e))] =
              "experts-" + std::to_string(m) + ".safetensors";
          total += per_expert;
        }
    }
    const json index{{"metadata", {{"total_size", total}, {"format", "pt"}}}, {"weight_map", weight_map}};
    write_file_atomically(staging / std::string(kShardedIndexName), index.dump(2) + "\n");
    write_file_atomically(staging / "config.json", config_json_of_save(info.hf_config_json, info.save_dtype));
  }
  world.barrier();  // every file of the save is written and synced
  if (world.rank() == 0) {
    json files = json::object();
    for (int m = 0; m < placement.ep_size(); ++m)
      files["experts-" + std::to_string(m) + ".safetensors"] = first_replica_experts(placement, m);
    json manifest{{"format", kCheckpointFormat},
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
  const CheckpointManifest m = read_checkpoint_manifest(dir);
  CheckpointInfo info;
  info.step = m.step;
  info.seed = m.seed;
  info.model = m.model;
  info.ep = m.ep;
  info.world = m.world;
  info.format = m.format;
  return info;
}

void load_checkpoint(const std::string& dir, MoeTransformer& model, AdamW* optimizer) {
  const std::unique_ptr<ExparCheckpointStore> store = ExparCheckpointStore::open(dir);
  const CheckpointManifest& manifest = store->manifest();
  const std::string label = store->label();
  const CheckpointNames names(manifest.format, model.config());
  std::set<std::string> used;
  const bool stacked_experts = manifest.format == ModelFormat::GptOss;  // in the dense file
  auto check_expert_file = [&](int e) {
    EXPAR_CHECK(manifest.file_of_expert.contains(e),
                "checkpoint '{}' holds no file for expert {}: the model has more experts than the checkpoint",
                label, e);
  };
  auto source = [&](const std::string& name, int64_t numel) {
    Tensor src = store->view(name);
    EXPAR_CHECK(src.numel() == numel && src.dtype() == DType::F32,
                "checkpoint '{}': tensor '{}' has shape {} {} but the model needs {} F32 values", label, name,
                shape_string(src.shape()), dtype_name(src.dtype()), numel);
    used.insert(name);
    return src;
  };
  auto copy_into = [&](Tensor dst, const std::string& name) {
    Tensor src = source(name, dst.numel());
    std::memcpy(dst.raw(), src.raw(), dst.nbytes());
  };
  const ExpertPlacement& placement = model.first_moe().placement();
  const int my_ep = placement.ep_size() == 1 ? 0 : model.first_moe().ep_rank();
  auto& params = model.parameters();
  // A save with narrower weights (--save-dtype bf16) holds every parameter's f32 master: the parameters
  // start from those (exactly the values saved), and the weights count as read. Else the weights are F32.
  const bool masters = store->contains(kMaster + params.front().name);
  auto load_weight = [&](Tensor dst, const std::string& ours, const std::string& weight) {
    if (!masters) return copy_into(dst, weight);
    copy_into(dst, kMaster + ours);
    used.insert(weight);
  };
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    AdamW::State* st = optimizer ? &optimizer->state()[i] : nullptr;
    if (!is_expert_shard(p)) {
      load_weight(p.value, p.name, names.weight(p.name));
      if (st) {
        copy_into(st->m, "optimizer.m." + p.name);
        copy_into(st->v, "optimizer.v." + p.name);
      }
      continue;
    }
    const int64_t per_expert = p.value.numel() / placement.local_count();
    for (int l = 0; l < placement.local_count(); ++l) {
      const int e = placement.global_expert(my_ep, l);
      const std::string name = expert_tensor_name(p.name, e);
      check_expert_file(e);
      if (!stacked_experts)
        load_weight(p.value.rows(l, l + 1), name, names.weight(name));
      else if (masters)
        copy_into(p.value.rows(l, l + 1), kMaster + name);
      if (!st) continue;
      // The state may cover only a slice [begin, end) of the flattened local shard (EP_DP sharding).
      for (const char* which : {"m", "v"}) {
        const std::string key = std::string("optimizer.") + which + "." + name;
        EXPAR_CHECK(store->contains(key),
                    "checkpoint '{}' has no optimizer state '{}': resume needs a checkpoint written with its "
                    "optimizer",
                    label, key);
        Tensor src = source(key, per_expert);
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
    EXPAR_CHECK(store->contains(name),
                "checkpoint '{}': tensor '{}' (the score bias its model config names) is missing from {}",
                label, name, manifest.dense_file);
    copy_into(bias, name);
  }
  if (stacked_experts && masters) {
    for (int l = 0; l < model.config().layers; ++l)
      if (model.has_moe(l))
        for (const std::string& name : gpt_oss_expert_names(l)) used.insert(name);
  } else if (stacked_experts) {
    load_gpt_oss_expert_params(*store, model, used);
  }
  // A tensor nobody loaded means the manifest's model config does not describe the files (e.g. "layers": 1
  // for a 2-layer checkpoint).
  std::vector<std::string> dense_files{manifest.dense_file};
  if (optimizer && names.hf()) dense_files.push_back(names.optimizer_file(manifest.dense_file));
  for (const std::string& file : dense_files)
    for (const std::string& name : store->tensor_names_in(file)) {
      const bool optimizer_state = name.starts_with("optimizer.");
      if (used.contains(name) || (optimizer_state && !optimizer)) continue;
      fail(
          "checkpoint '{}': {} holds tensor '{}', which the model of {} does not have: the manifest's model "
          "config does not describe these files; restore the manifest written with them",
          label, (manifest.dir / file).string(), name, manifest.label);
    }
  if (optimizer) optimizer->set_steps_taken(manifest.step);
}

void load_hf_weights(const fs::path& dir, ModelFormat format, MoeTransformer& model) {
  EXPAR_CHECK(format != ModelFormat::Expar, "load_hf_weights: '{}' names our format; use load_checkpoint",
              dir.string());
  const std::unique_ptr<TensorStore> store = open_hf_store(dir, format);
  const CheckpointNames names(format, model.config());
  auto copy = [&](Tensor dst, const std::string& name) {
    EXPAR_CHECK(
        store->contains(name),
        "'{}': tensor '{}' is missing: the weights do not hold the {} model its config.json describes",
        dir.string(), name, model_format_name(format));
    // FP8 weights come with their block multipliers (Fp8Store), so a fine-tuning run trains (and saves) the
    // values the release encodes.
    const Tensor src = store->view(name);
    EXPAR_CHECK(src.numel() == dst.numel(), "'{}': tensor '{}' has shape {} but the model needs {} values",
                dir.string(), name, shape_string(src.shape()), dst.numel());
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
      copy(p.value.rows(l, l + 1),
           names.weight(expert_tensor_name(p.name, placement.global_expert(my_ep, l))));
  }
  // The score bias of a family that has one (DeepSeek-V3's e_score_correction_bias) starts from its weights.
  for (int l = 0; l < model.config().layers; ++l) {
    if (!model.has_moe(l)) continue;
    Tensor& bias = model.moe(l).params().score_bias;
    if (bias.defined() && bias.numel() > 0)
      copy(bias, names.weight("layers." + std::to_string(l) + ".moe.score_bias"));
  }
  // gpt-oss's stacked experts; its released MXFP4 ones are dequantised by the store (Mxfp4Store).
  std::set<std::string> used;
  if (stacked_experts) load_gpt_oss_expert_params(*store, model, used);
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
