#pragma once
// A refused layout as data: the rule it broke (the values and the rule, as the message says them) and the
// ways out. Each way out is one setting and every value of it that the WHOLE validation accepts, the other
// settings as given (or as the fix's `with` sets them first). The validators compute those values by
// running their own rule check over candidates (find_layout_fixes), so a suggestion cannot drift from the
// rules it suggests for; tests/topo/refusal_fixes_test.cpp applies every suggested value.
//
// Settings are named as the messages name them ("ep_degree", "data_parallel_size", "M_E", "C", ...).
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace expar {

struct LayoutFix {
  std::vector<std::pair<std::string, int>> with;  // settings changed first; empty: only `setting` changes
  std::string setting;
  std::vector<int> values;  // ascending, never empty
  std::string phrase;       // how the message says it; "" for "choose S in {..}" / "set S=v"
  // > 0: every larger multiple of `period` is accepted too (a setting without an upper bound, such as the
  // DP replicas of a given EP group size); `values` are those up to the range's end.
  int period = 0;
  std::string text() const;
};

struct LayoutRefusal {
  std::string rule;  // "num_experts=6 is not divisible by ep_degree=4"
  std::string note;  // why the setting at fault has no accepted value of its own ("" when it has)
  std::vector<LayoutFix> fixes;
  // rule[; note]: fix, or fix, ...
  std::string message() const;
};

// A setting a fix may change, and the candidate values to try; the range must hold every value the
// validation could accept, so that a fix lists the whole accepted set.
struct SettingRange {
  std::string name;
  int lo = 1, hi = 1;
};

// The fixes for a refused `config`, in this order:
//  1. each setting of `order` alone: every accepted value (settings with none are left out);
//  2. when no single setting is enough: the first pair (A set to its accepted-making value nearest to the
//     given one, then every accepted value of B), trying A, B in `order`;
//  3. when no pair is enough: every setting but B at its lowest value, then every accepted value of B.
// `get(config, name)` reads a setting, `set(config, name, value)` returns a copy with it changed and
// `accepted(config)` runs the whole validation (no messages, so it stays cheap over many candidates).
template <class Config, class Get, class Set, class Accepted>
std::vector<LayoutFix> find_layout_fixes(const Config& config, const std::vector<SettingRange>& order,
                                         Get get, Set set, Accepted accepted) {
  auto values_of = [&](const Config& base, const SettingRange& s) {
    std::vector<int> out;
    for (int v = s.lo; v <= s.hi; ++v)
      if (accepted(set(base, s.name, v))) out.push_back(v);
    return out;
  };
  std::vector<LayoutFix> fixes;
  for (const SettingRange& s : order) {
    std::vector<int> values = values_of(config, s);
    if (!values.empty()) fixes.push_back(LayoutFix{{}, s.name, std::move(values), "", 0});
  }
  if (!fixes.empty()) return fixes;
  for (const SettingRange& a : order) {
    std::vector<int> candidates;
    for (int v = a.lo; v <= a.hi; ++v)
      if (v != get(config, a.name)) candidates.push_back(v);
    const int given = get(config, a.name);
    std::stable_sort(candidates.begin(), candidates.end(),
                     [given](int x, int y) { return std::abs(x - given) < std::abs(y - given); });
    for (const SettingRange& b : order) {
      if (b.name == a.name) continue;
      for (int v : candidates) {
        std::vector<int> values = values_of(set(config, a.name, v), b);
        if (!values.empty()) return {LayoutFix{{{a.name, v}}, b.name, std::move(values), "", 0}};
      }
    }
  }
  for (const SettingRange& b : order) {
    Config base = config;
    std::vector<std::pair<std::string, int>> with;
    for (const SettingRange& a : order) {
      if (a.name == b.name || get(config, a.name) == a.lo) continue;
      base = set(base, a.name, a.lo);
      with.emplace_back(a.name, a.lo);
    }
    std::vector<int> values = values_of(base, b);
    if (!values.empty()) return {LayoutFix{std::move(with), b.name, std::move(values), "", 0}};
  }
  return {};
}

}  // namespace expar
