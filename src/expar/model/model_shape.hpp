#pragma once
// The shape `expar plan` counts (topo/model_shapes.hpp) of an architecture the model layer reads: a
// Hugging Face config.json (model/hf_config) or our checkpoint's manifest, so a plan is made for the model a
// user has, not only for the hand-typed presets.
#include <string>

#include "expar/model/architecture.hpp"
#include "expar/topo/model_shapes.hpp"

namespace expar {

// Every parameter of the architecture lands in one of the shape's counts (the q/k norms, attention sinks and
// the biases that ModelShape has no field for go to attention_extra_params).
ModelShape model_shape(const Architecture& architecture, const std::string& name);

}  // namespace expar
