#include "expar/moe/router.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <utility>

#include "expar/comm/comm.hpp"
#include "expar/core/assert.hpp"
#include "expar/core/error.hpp"
#include "expar/core/matmul.hpp"

namespace expar {

ScoreFunction score_function_from_name(const std::string& name) {
  if (name == "softmax") return ScoreFunction::Softmax;
  if (name == "sigmoid") return ScoreFunction::Sigmoid;
  fail("score function '{}' is unknown: use one of {}", name, fmt::join(score_function_names(), ", "));
}

std::string score_function_name(ScoreFunction fn) {
  return fn == ScoreFunction::Softmax ? "softmax" : "sigmoid";
}

std::vector<std::string> score_function_names() {
  return {score_function_name(ScoreFunction::Softmax), score_function_name(ScoreFunction::Sigmoid)};
}

void RouterConfig::validate() const {
  EXPAR_CHECK(num_experts >= 1, "num_experts={} must be at least 1", num_experts);
  EXPAR_CHECK(top_k >= 1 && top_k <= num_experts,
              "top_k={} must be in [1, num_experts={}]: a token cannot choose more experts than exist", top_k,
              num_experts);
  EXPAR_CHECK(n_group >= 1, "n_group={} must be at least 1 (1 = no group-limited routing)", n_group);
  if (n_group > 1) {
    EXPAR_CHECK(num_experts % n_group == 0,
                "num_experts={} is not divisible by n_group={}: choose n_group dividing it", num_experts,
                n_group);
    EXPAR_CHECK(topk_group >= 1 && topk_group <= n_group, "topk_group={} must be in [1, n_group={}]",
                topk_group, n_group);
    const int eligible = topk_group * (num_experts / n_group);
    EXPAR_CHECK(top_k <= eligible,
                "top_k={} exceeds the {} experts eligible with topk_group={} of n_group={}: raise topk_group",
                top_k, eligible, topk_group, n_group);
  }
  EXPAR_CHECK(
      !softmax_over_topk || (score == ScoreFunction::Softmax && n_group == 1),
      "softmax_over_topk (gpt-oss's router) needs the softmax score and no group-limited routing, got "
      "score {} and n_group={}",
      score_function_name(score), n_group);
  EXPAR_CHECK(std::isfinite(routed_scale) && routed_scale > 0.0,
              "routed_scale={} must be finite and positive (1: the weights as the score function gives them)",
              routed_scale);
  EXPAR_CHECK(!softmax_over_topk || routed_scale == 1.0,
              "routed_scale={} with softmax_over_topk (gpt-oss's router): that router has no scaling, use 1",
              routed_scale);
  EXPAR_CHECK(std::isfinite(aux_loss_coef) && aux_loss_coef >= 0.0,
              "aux_loss_coef={} must be finite and >= 0", aux_loss_coef);
  EXPAR_CHECK(std::isfinite(z_loss_coef) && z_loss_coef >= 0.0, "z_loss_coef={} must be finite and >= 0",
              z_loss_coef);
}

namespace {

// Softmax of one row in double; returns logsumexp.
double softmax_row(const float* logits, int n, double* out) {
  double mx = -INFINITY;
  for (int e = 0; e < n; ++e) mx = std::max(mx, static_cast<double>(logits[e]));
  double sum = 0.0;
  for (int e = 0; e < n; ++e) {
    out[e] = std::exp(static_cast<double>(logits[e]) - mx);
    sum += out[e];
  }
  for (int e = 0; e < n; ++e) out[e] /= sum;
  return mx + std::log(sum);
}

// Greater-first with ties to the lower index: a strict weak order for finite values.
struct ByScore {
  const float* v;
  bool operator()(int a, int b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

void check_router_inputs(const RouterConfig& config, const Tensor& x, const Tensor& w_router,
                         const Tensor* score_bias, const Tensor* logit_bias) {
  const int e_count = config.num_experts;
  EXPAR_ASSERT(x.dtype() == DType::F32 && x.ndim() == 2, "router input must be f32 [T, d], got {} {}",
               dtype_name(x.dtype()), shape_string(x.shape()));
  const int64_t d = x.dim(1);
  EXPAR_ASSERT(w_router.ndim() == 2 && w_router.dim(0) == e_count && w_router.dim(1) == d,
               "router weight has shape {}, expected [{}, {}] (num_experts, model dim)",
               shape_string(w_router.shape()), e_count, d);
  if (score_bias)
    EXPAR_ASSERT(score_bias->numel() == e_count, "score bias has {} entries, expected num_experts={}",
                 score_bias->numel(), e_count);
  if (logit_bias)
    EXPAR_ASSERT(logit_bias->dtype() == DType::F32 && logit_bias->numel() == e_count,
                 "router logit bias has {} {} entries, expected num_experts={} f32", logit_bias->numel(),
                 dtype_name(logit_bias->dtype()), e_count);
}

// logits [T, E] = x · W_rᵀ (+ the logit bias).
Tensor router_logits(const Tensor& x, const Tensor& w_router, const Tensor* logit_bias, int e_count) {
  const int64_t t_count = x.dim(0), d = x.dim(1);
  Tensor logits = Tensor::empty({t_count, e_count});
  matmul(x.data<float>(), w_router.data<float>(), logits.data<float>(), t_count, e_count, d, false, true,
         false);
  if (logit_bias) {
    float* l = logits.data<float>();
    const float* b = logit_bias->data<float>();
    for (int64_t t = 0; t < t_count; ++t)
      for (int e = 0; e < e_count; ++e) l[t * e_count + e] += b[e];
  }
  return logits;
}

// Per-token work buffers, sized once per call.
struct RouterScratch {
  std::vector<double> prob;        // softmax of the logits
  std::vector<float> select;       // what top-k ranks: score (or logit) + score bias
  std::vector<float> group_score;  // group-limited routing
  std::vector<int> order, groups;  // eligible experts; the groups by score

  RouterScratch(int e_count, int n_group)
      : prob(static_cast<size_t>(e_count)),
        select(static_cast<size_t>(e_count)),
        group_score(static_cast<size_t>(n_group)),
        order(static_cast<size_t>(e_count)),
        groups(static_cast<size_t>(n_group)) {}
};

// One token's scores into `srow` and the selection values into scratch.select; adds the scores into
// `score_sum` (aux loss). Returns the logits' logsumexp (z loss).
double score_token(const RouterConfig& config, int64_t t, const float* lrow, const float* bias, float* srow,
                   RouterScratch& s, std::vector<double>& score_sum) {
  const int e_count = config.num_experts;
  for (int e = 0; e < e_count; ++e)
    EXPAR_CHECK(std::isfinite(lrow[e]),
                "router logit of token {} for expert {} is {}: the input or router "
                "weights are not finite",
                t, e, lrow[e]);
  const double lse = softmax_row(lrow, e_count, s.prob.data());
  for (int e = 0; e < e_count; ++e) {
    srow[e] = config.score == ScoreFunction::Softmax
                  ? static_cast<float>(s.prob[static_cast<size_t>(e)])
                  : static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(lrow[e]))));
    const float v = config.softmax_over_topk ? lrow[e] : srow[e];
    s.select[static_cast<size_t>(e)] = bias ? v + bias[e] : v;
  }
  // The sequence-wise loss's P_e is over the scores normalised over every expert.
  double norm = 1.0;
  if (config.aux_loss_kind == AuxLossKind::Sequence) {
    norm = 0.0;
    for (int e = 0; e < e_count; ++e) norm += srow[e];
  }
  for (int e = 0; e < e_count; ++e)
    score_sum[static_cast<size_t>(e)] +=
        config.aux_loss_kind == AuxLossKind::Sequence ? srow[e] / norm : srow[e];
  return lse;
}

// The experts one token may choose, in index order, into scratch.order: all of them, or (n_group > 1) those
// of the topk_group best groups, a group scored by its best (softmax) or best two (sigmoid) values.
void eligible_experts(const RouterConfig& config, RouterScratch& s) {
  const int e_count = config.num_experts;
  const int group_size = e_count / config.n_group;
  s.order.clear();
  if (config.n_group == 1) {
    s.order.resize(static_cast<size_t>(e_count));
    std::iota(s.order.begin(), s.order.end(), 0);
    return;
  }
  for (int g = 0; g < config.n_group; ++g) {
    const float* gs = s.select.data() + static_cast<ptrdiff_t>(g) * group_size;
    if (config.score == ScoreFunction::Softmax) {
      s.group_score[static_cast<size_t>(g)] = *std::max_element(gs, gs + group_size);
    } else {
      float first = -INFINITY, second = -INFINITY;
      for (int i = 0; i < group_size; ++i) {
        if (gs[i] > first) {
          second = first;
          first = gs[i];
        } else if (gs[i] > second) {
          second = gs[i];
        }
      }
      s.group_score[static_cast<size_t>(g)] = group_size >= 2 ? first + second : first;
    }
  }
  std::iota(s.groups.begin(), s.groups.end(), 0);
  std::partial_sort(s.groups.begin(), s.groups.begin() + config.topk_group, s.groups.end(),
                    ByScore{s.group_score.data()});
  std::sort(s.groups.begin(), s.groups.begin() + config.topk_group);
  for (int i = 0; i < config.topk_group; ++i)
    for (int j = 0; j < group_size; ++j) s.order.push_back(s.groups[static_cast<size_t>(i)] * group_size + j);
}

// The first K of `order` (sorted best first) as one token's experts and weights: the scores, renormalised
// over the K, or (gpt-oss) a softmax of the K logits; counted into `expert_counts`.
void write_topk(const RouterConfig& config, const float* lrow, const float* srow,
                const std::vector<int>& order, int32_t* idx_out, float* w_out,
                std::vector<int64_t>& expert_counts) {
  const int k_count = config.top_k;
  double weight_sum = 0.0;
  for (int k = 0; k < k_count; ++k) weight_sum += srow[order[static_cast<size_t>(k)]];
  // softmax_over_topk: exp(l - max) over the K selected logits (the first is the largest).
  double exp_sum = 0.0;
  const double top_logit = lrow[order[0]];
  if (config.softmax_over_topk)
    for (int k = 0; k < k_count; ++k) exp_sum += std::exp(lrow[order[static_cast<size_t>(k)]] - top_logit);
  for (int k = 0; k < k_count; ++k) {
    const int e = order[static_cast<size_t>(k)];
    idx_out[k] = e;
    w_out[k] = config.softmax_over_topk ? static_cast<float>(std::exp(lrow[e] - top_logit) / exp_sum)
               : config.renormalize     ? static_cast<float>(srow[e] / weight_sum)
                                        : srow[e];
    if (config.routed_scale != 1.0) w_out[k] *= static_cast<float>(config.routed_scale);
    ++expert_counts[static_cast<size_t>(e)];
  }
}

// The statistics both losses are computed from, per batch of the loss scope: routes per expert, summed
// scores per expert, Σ lse², and the tokens they are over.
struct LossStatistics {
  std::vector<int64_t> counts;
  std::vector<double> score_sum;
  double z_sum = 0.0;
  int64_t tokens = 0;
};

// Sums every batch's statistics over `group` in one all-reduce of batches·(2E + 2) doubles (counts and
// tokens are integers far below 2^53, exact in a double).
void sum_over(Comm& group, std::vector<LossStatistics>& batches) {
  const size_t e_count = batches.front().counts.size(), stride = 2 * e_count + 2;
  std::vector<double> packed(batches.size() * stride);
  for (size_t b = 0; b < batches.size(); ++b) {
    double* p = packed.data() + b * stride;
    for (size_t e = 0; e < e_count; ++e) {
      p[e] = static_cast<double>(batches[b].counts[e]);
      p[e_count + e] = batches[b].score_sum[e];
    }
    p[2 * e_count] = batches[b].z_sum;
    p[2 * e_count + 1] = static_cast<double>(batches[b].tokens);
  }
  group.all_reduce(std::span<double>(packed));
  for (size_t b = 0; b < batches.size(); ++b) {
    const double* p = packed.data() + b * stride;
    for (size_t e = 0; e < e_count; ++e) {
      batches[b].counts[e] = static_cast<int64_t>(p[e]);
      batches[b].score_sum[e] = p[e_count + e];
    }
    batches[b].z_sum = p[2 * e_count];
    batches[b].tokens = static_cast<int64_t>(p[2 * e_count + 1]);
  }
}

// The load-balancing aux loss (E/K · Σ_e f_e · mean score_e, or per sequence Σ_e f_e · P_e) and the z loss
// (mean squared logsumexp) of one batch; 0 for an empty one.
std::pair<double, double> balance_losses(const RouterConfig& config, const LossStatistics& s) {
  if (s.tokens == 0) return {0.0, 0.0};
  const int e_count = config.num_experts;
  const int k_count = config.top_k;
  const auto tokens = static_cast<double>(s.tokens);
  double aux = 0.0;
  if (config.aux_loss_kind == AuxLossKind::Sequence) {
    // f_e = E/(K·T) · count_e, P_e = (Σ_t s'_{t,e}) / T.
    for (int e = 0; e < e_count; ++e)
      aux += static_cast<double>(e_count) * static_cast<double>(s.counts[static_cast<size_t>(e)]) /
             (k_count * tokens) * s.score_sum[static_cast<size_t>(e)] / tokens;
    return {aux, s.z_sum / tokens};
  }
  for (int e = 0; e < e_count; ++e) {
    const double f =
        static_cast<double>(s.counts[static_cast<size_t>(e)]) / static_cast<double>(s.tokens * k_count);
    aux += f * s.score_sum[static_cast<size_t>(e)] / static_cast<double>(s.tokens);
  }
  return {aux * e_count / k_count, s.z_sum / static_cast<double>(s.tokens)};
}

}  // namespace

RouterOutput router_forward(const RouterConfig& config, const Tensor& x, const Tensor& w_router,
                            const Tensor* score_bias, RouterState& state, const Tensor* logit_bias,
                            const RouterLossScope& scope) {
  config.validate();
  check_router_inputs(config, x, w_router, score_bias, logit_bias);
  const int e_count = config.num_experts;
  const int k_count = config.top_k;
  const int64_t t_count = x.dim(0);
  EXPAR_ASSERT(scope.batches >= 1 && t_count % scope.batches == 0,
               "router loss scope: {} batches do not divide the {} rows", scope.batches, t_count);
  const int64_t batch_rows = t_count / scope.batches;

  state = {};
  state.x = x;
  state.logits = router_logits(x, w_router, logit_bias, e_count);
  state.scores = Tensor::empty({t_count, e_count});
  state.topk_idx = Tensor::empty({t_count, k_count}, DType::I32);
  state.topk_weight = Tensor::empty({t_count, k_count});
  state.expert_counts.assign(static_cast<size_t>(e_count), 0);

  const float* logits = state.logits.data<float>();
  float* scores = state.scores.data<float>();
  const float* bias = score_bias ? score_bias->data<float>() : nullptr;
  RouterScratch scratch(e_count, config.n_group);
  std::vector<LossStatistics> stats(static_cast<size_t>(scope.batches),
                                    {std::vector<int64_t>(static_cast<size_t>(e_count), 0),
                                     std::vector<double>(static_cast<size_t>(e_count))});
  for (int64_t t = 0; t < t_count; ++t) {
    LossStatistics& batch = stats[static_cast<size_t>(t / batch_rows)];
    const float* lrow = logits + t * e_count;
    float* srow = scores + t * e_count;
    const double lse = score_token(config, t, lrow, bias, srow, scratch, batch.score_sum);
    batch.z_sum += lse * lse;
    ++batch.tokens;
    eligible_experts(config, scratch);
    std::partial_sort(scratch.order.begin(), scratch.order.begin() + k_count, scratch.order.end(),
                      ByScore{scratch.select.data()});
    write_topk(config, lrow, srow, scratch.order, state.topk_idx.data<int32_t>() + t * k_count,
               state.topk_weight.data<float>() + t * k_count, batch.counts);
  }

  RouterOutput out;
  out.topk_idx = state.topk_idx;
  out.topk_weight = state.topk_weight;
  for (const LossStatistics& batch : stats)
    for (int e = 0; e < e_count; ++e)
      state.expert_counts[static_cast<size_t>(e)] += batch.counts[static_cast<size_t>(e)];
  out.expert_counts = state.expert_counts;
  if (scope.group != nullptr && scope.group->size() > 1) sum_over(*scope.group, stats);
  for (const LossStatistics& batch : stats) {
    const auto [aux, z] = balance_losses(config, batch);
    out.aux_loss += aux;
    out.z_loss += z;
    state.loss_counts.insert(state.loss_counts.end(), batch.counts.begin(), batch.counts.end());
    state.loss_tokens.push_back(batch.tokens);
  }
  out.aux_loss /= scope.batches;
  out.z_loss /= scope.batches;
  return out;
}

void router_backward(const RouterConfig& config, const RouterState& state, const Tensor& w_router,
                     const Tensor& grad_topk_weight, Tensor& grad_x, Tensor& grad_w_router,
                     Tensor* grad_logit_bias) {
  const int e_count = config.num_experts;
  const int k_count = config.top_k;
  const int64_t t_count = state.logits.dim(0);
  const int64_t d = state.x.dim(1);
  EXPAR_ASSERT(grad_topk_weight.ndim() == 2 && grad_topk_weight.dim(0) == t_count &&
                   grad_topk_weight.dim(1) == k_count,
               "router backward: grad_topk_weight has shape {}, expected [{}, {}]",
               shape_string(grad_topk_weight.shape()), t_count, k_count);
  EXPAR_ASSERT(grad_x.ndim() == 2 && grad_x.dim(0) == t_count && grad_x.dim(1) == d,
               "router backward: grad_x has shape {}, expected [{}, {}]", shape_string(grad_x.shape()),
               t_count, d);
  EXPAR_ASSERT(grad_w_router.ndim() == 2 && grad_w_router.dim(0) == e_count && grad_w_router.dim(1) == d,
               "router backward: grad_w_router has shape {}, expected [{}, {}]",
               shape_string(grad_w_router.shape()), e_count, d);
  if (grad_logit_bias)
    EXPAR_ASSERT(grad_logit_bias->numel() == e_count,
                 "router backward: grad_logit_bias has {} entries, expected {}", grad_logit_bias->numel(),
                 e_count);
  if (t_count == 0) return;

  const float* logits = state.logits.data<float>();
  const float* w = state.topk_weight.data<float>();
  const float* scores = state.scores.data<float>();
  const int32_t* idx = state.topk_idx.data<int32_t>();
  const float* gw = grad_topk_weight.data<float>();
  // The weights' gradient before routed_scale (the scale is the last step of the forward).
  Tensor scaled_gw;
  if (config.routed_scale != 1.0) {
    scaled_gw = Tensor::empty({t_count, k_count});
    for (int64_t i = 0; i < t_count * k_count; ++i)
      scaled_gw.data<float>()[i] = static_cast<float>(gw[i] * config.routed_scale);
    gw = scaled_gw.data<float>();
  }
  Tensor grad_logits = Tensor::empty({t_count, e_count});
  float* gl = grad_logits.data<float>();

  // Per batch of the loss scope (count_e and T those its loss was over, the batches' mean a factor
  // 1/batches): d L_aux / d s_{t,e} = factor · count_e (the counts held constant): E/K · f_e / T for the
  // batch form; for the sequence form the derivative by the normalised score s'_{t,e}, taken to s_{t,e}
  // below. The z-loss's 1/T likewise.
  const auto batches = static_cast<int64_t>(state.loss_tokens.size());
  const int64_t batch_rows = t_count / batches;
  const bool sequence_aux = config.aux_loss_kind == AuxLossKind::Sequence;
  std::vector<double> aux_grad(static_cast<size_t>(batches * e_count), 0.0);
  if (config.aux_loss_coef != 0.0)
    for (int64_t b = 0; b < batches; ++b) {
      const auto tokens = static_cast<double>(state.loss_tokens[static_cast<size_t>(b)]);
      for (int64_t e = b * e_count; e < (b + 1) * e_count; ++e)
        aux_grad[static_cast<size_t>(e)] =
            sequence_aux ? config.aux_loss_coef * e_count *
                               static_cast<double>(state.loss_counts[static_cast<size_t>(e)]) /
                               (k_count * tokens) / tokens / static_cast<double>(batches)
                         : config.aux_loss_coef * e_count / k_count *
                               static_cast<double>(state.loss_counts[static_cast<size_t>(e)]) /
                               (tokens * k_count) / tokens / static_cast<double>(batches);
    }

  std::vector<double> gs(static_cast<size_t>(e_count)), prob(static_cast<size_t>(e_count));
  for (int64_t t = 0; t < t_count; ++t) {
    const float* srow = scores + t * e_count;
    const float* lrow = logits + t * e_count;
    const int64_t b = t / batch_rows;
    for (int e = 0; e < e_count; ++e)
      gs[static_cast<size_t>(e)] = aux_grad[static_cast<size_t>(b * e_count + e)];
    if (sequence_aux && config.aux_loss_coef != 0.0) {
      // s'_e = s_e / S (S = Σ_j s_j): dL/ds_e = (g'_e - Σ_i g'_i s'_i) / S.
      double sum = 0.0, dot = 0.0;
      for (int e = 0; e < e_count; ++e) sum += srow[e];
      for (int e = 0; e < e_count; ++e) dot += gs[static_cast<size_t>(e)] * srow[e] / sum;
      for (int e = 0; e < e_count; ++e) gs[static_cast<size_t>(e)] = (gs[static_cast<size_t>(e)] - dot) / sum;
    }
    if (config.softmax_over_topk) {
      // Handled on the logits below (the weights are a softmax of the K logits, not of the scores).
    } else if (config.renormalize) {
      double sum = 0.0, gdot = 0.0;
      for (int k = 0; k < k_count; ++k) {
        const double s = srow[idx[t * k_count + k]];
        sum += s;
        gdot += gw[t * k_count + k] * s;
      }
      for (int k = 0; k < k_count; ++k)
        gs[static_cast<size_t>(idx[t * k_count + k])] += gw[t * k_count + k] / sum - gdot / (sum * sum);
    } else {
      for (int k = 0; k < k_count; ++k) gs[static_cast<size_t>(idx[t * k_count + k])] += gw[t * k_count + k];
    }
    const double lse = softmax_row(lrow, e_count, prob.data());
    float* grow = gl + t * e_count;
    if (config.score == ScoreFunction::Softmax) {
      double dot = 0.0;
      for (int e = 0; e < e_count; ++e) dot += gs[static_cast<size_t>(e)] * prob[static_cast<size_t>(e)];
      for (int e = 0; e < e_count; ++e)
        grow[e] = static_cast<float>(prob[static_cast<size_t>(e)] * (gs[static_cast<size_t>(e)] - dot));
    } else {
      for (int e = 0; e < e_count; ++e) {
        const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(lrow[e])));
        grow[e] = static_cast<float>(gs[static_cast<size_t>(e)] * s * (1.0 - s));
      }
    }
    if (config.z_loss_coef != 0.0) {
      const double zscale = config.z_loss_coef * 2.0 * lse /
                            static_cast<double>(state.loss_tokens[static_cast<size_t>(b)]) /
                            static_cast<double>(batches);
      for (int e = 0; e < e_count; ++e) grow[e] += static_cast<float>(zscale * prob[static_cast<size_t>(e)]);
    }
    if (config.softmax_over_topk) {
      // w_k = softmax over the K selected logits: dl_k = w_k (gw_k - Σ_j w_j gw_j).
      double dot = 0.0;
      for (int k = 0; k < k_count; ++k) dot += static_cast<double>(w[t * k_count + k]) * gw[t * k_count + k];
      for (int k = 0; k < k_count; ++k)
        grow[idx[t * k_count + k]] += static_cast<float>(w[t * k_count + k] * (gw[t * k_count + k] - dot));
    }
  }
  if (grad_logit_bias) {
    float* gb = grad_logit_bias->data<float>();
    for (int e = 0; e < e_count; ++e) {
      double acc = 0.0;
      for (int64_t t = 0; t < t_count; ++t) acc += gl[t * e_count + e];
      gb[e] += static_cast<float>(acc);
    }
  }
  // grad_x += grad_logits [T,E] · W_r [E,d];  grad_W_r += grad_logitsᵀ [E,T] · x [T,d].
  matmul(gl, w_router.data<float>(), grad_x.data<float>(), t_count, d, e_count, false, false, true);
  matmul(gl, state.x.data<float>(), grad_w_router.data<float>(), e_count, d, t_count, true, false, true);
}

}  // namespace expar
