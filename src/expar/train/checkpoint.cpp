#include "expar/train/checkpoint.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "expar/io/safetensors_file.hpp"
#include "expar/io/safetensors_writer.hpp"
#include "expar/model/model_config_json.hpp"

namespace expar {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool is_expert_shard(const Parameter& p) {
  return p.kind == ParamKind::Expert;
}

// "layers.3.moe.experts.w1" + global expert 5 -> "layers.3.moe.experts.5.w1"
std::string expert_name(const std::string& shard_name, int expert) {
  auto dot = shard_name.rfind('.');
  return shard_name.substr(0, dot) + "." + std::to_string(expert) + shard_name.substr(dot);
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

}  // namespace

void save_checkpoint(const std::string& dir, const CheckpointInfo& info, MoeTransformer& model,
                     AdamW* optimizer, Comm& world, Comm& ep_mp, Comm& ep_dp) {
  if (world.rank() == 0) fs::create_directories(dir);
  world.barrier();
  const ExpertPlacement& placement = model.moe(0).placement();
  const int my_ep = ep_mp.rank();
  auto& params = model.parameters();
  // Moments of sharded expert state must be gathered by every EP_DP member (collective), before deciding
  // who writes.
  std::map<std::string, Tensor> dense, experts;
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    Tensor m, v;
    if (optimizer) {
      m = full_moment(*optimizer, i, false, ep_dp);
      v = full_moment(*optimizer, i, true, ep_dp);
    }
    if (!is_expert_shard(p)) {
      dense[p.name] = p.value;
      if (optimizer) {
        dense["optimizer.m." + p.name] = m;
        dense["optimizer.v." + p.name] = v;
      }
      continue;
    }
    for (int l = 0; l < placement.local_count(); ++l) {
      const int e = placement.global_expert(my_ep, l);
      auto slice = [&](const Tensor& t) {
        Shape s(t.shape().begin() + 1, t.shape().end());
        return t.rows(l, l + 1).reshape(s);
      };
      experts[expert_name(p.name, e)] = slice(p.value);
      if (optimizer) {
        experts["optimizer.m." + expert_name(p.name, e)] = slice(m);
        experts["optimizer.v." + expert_name(p.name, e)] = slice(v);
      }
    }
  }
  for (int l = 0; l < model.config().layers; ++l) {
    const Tensor& bias = model.moe(l).params().score_bias;
    if (bias.defined() && bias.numel() > 0) dense["layers." + std::to_string(l) + ".moe.score_bias"] = bias;
  }
  std::map<std::string, std::string> meta{{"format", "expar"}, {"step", std::to_string(info.step)}};
  if (world.rank() == 0) write_safetensors(fs::path(dir) / "dense.safetensors", dense, meta);
  if (ep_dp.rank() == 0)
    write_safetensors(fs::path(dir) / ("experts-" + std::to_string(my_ep) + ".safetensors"), experts, meta);
  if (world.rank() == 0) {
    json files = json::object();
    for (int m = 0; m < placement.ep_size(); ++m)
      files["experts-" + std::to_string(m) + ".safetensors"] = placement.local_experts(m);
    json manifest{{"format", "expar-checkpoint-1"},
                  {"step", info.step},
                  {"seed", info.seed},
                  {"world", info.world},
                  {"ep", info.ep},
                  {"placement", placement_name(placement.kind())},
                  {"model", model_config_to_json(info.model)},
                  {"dense_file", "dense.safetensors"},
                  {"expert_files", files}};
    std::ofstream out(fs::path(dir) / "manifest.json");
    out << manifest.dump(2) << "\n";
  }
  world.barrier();
}

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "manifest.json");
  EXPAR_CHECK(in.good(), "checkpoint '{}' has no manifest.json: pass a directory written by expar train",
              dir);
  json j = json::parse(in);
  CheckpointInfo info;
  info.step = j.at("step");
  info.seed = j.at("seed");
  info.world = j.at("world");
  info.ep = j.at("ep");
  info.model = model_config_from_json(j.at("model"));
  return info;
}

void load_checkpoint(const std::string& dir, MoeTransformer& model, AdamW* optimizer) {
  std::ifstream in(fs::path(dir) / "manifest.json");
  EXPAR_CHECK(in.good(), "checkpoint '{}' has no manifest.json: pass a directory written by expar train",
              dir);
  json manifest = json::parse(in);
  SafetensorsFile dense = SafetensorsFile::open(fs::path(dir) / manifest.at("dense_file").get<std::string>());
  std::map<int, std::string> file_of_expert;
  for (auto& [file, ids] : manifest.at("expert_files").items())
    for (int e : ids) file_of_expert[e] = file;
  std::map<std::string, SafetensorsFile> expert_files;
  auto expert_file = [&](int e) -> SafetensorsFile& {
    auto it = file_of_expert.find(e);
    EXPAR_CHECK(it != file_of_expert.end(),
                "checkpoint '{}' holds no file for expert {}: the model has more "
                "experts than the checkpoint",
                dir, e);
    auto f = expert_files.find(it->second);
    if (f == expert_files.end())
      f = expert_files.emplace(it->second, SafetensorsFile::open(fs::path(dir) / it->second)).first;
    return f->second;
  };
  auto copy_into = [&](Tensor dst, const SafetensorsFile& file, const std::string& name) {
    EXPAR_CHECK(file.contains(name), "checkpoint '{}': tensor '{}' is missing from {}", dir, name,
                file.label());
    Tensor src = file.view(name);
    EXPAR_CHECK(src.numel() == dst.numel() && src.dtype() == DType::F32,
                "checkpoint '{}': tensor '{}' has shape {} {} but the model needs {} F32", dir, name,
                shape_string(src.shape()), dtype_name(src.dtype()), shape_string(dst.shape()));
    std::memcpy(dst.raw(), src.raw(), dst.nbytes());
  };
  const ExpertPlacement& placement = model.moe(0).placement();
  const int my_ep = placement.ep_size() == 1 ? 0 : model.moe(0).ep_rank();
  auto& params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    AdamW::State* st = optimizer ? &optimizer->state()[i] : nullptr;
    if (!is_expert_shard(p)) {
      copy_into(p.value, dense, p.name);
      if (st) {
        copy_into(st->m, dense, "optimizer.m." + p.name);
        copy_into(st->v, dense, "optimizer.v." + p.name);
      }
      continue;
    }
    const int64_t per_expert = p.value.numel() / placement.local_count();
    for (int l = 0; l < placement.local_count(); ++l) {
      const int e = placement.global_expert(my_ep, l);
      SafetensorsFile& file = expert_file(e);
      const std::string name = expert_name(p.name, e);
      copy_into(p.value.rows(l, l + 1), file, name);
      if (!st) continue;
      // The state may cover only a slice [begin, end) of the flattened local shard (EP_DP sharding).
      for (const char* which : {"m", "v"}) {
        const std::string key = std::string("optimizer.") + which + "." + name;
        EXPAR_CHECK(file.contains(key),
                    "checkpoint '{}' has no optimizer state '{}': resume needs a checkpoint "
                    "written with its optimizer",
                    dir, key);
        Tensor src = file.view(key);
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
    Tensor& bias = model.moe(l).params().score_bias;
    const std::string name = "layers." + std::to_string(l) + ".moe.score_bias";
    if (bias.defined() && bias.numel() > 0 && dense.contains(name)) copy_into(bias, dense, name);
  }
  if (optimizer) optimizer->set_steps_taken(manifest.at("step").get<int64_t>());
}

}  // namespace expar
