// Operators MXNet 1.9 lacks a fast CPU form of, as an external operator library
// (MXNet's lib_api: mx.library.load, loaded by sample_fc/fused_ops.py; built by setup.py).
//
// sample_fc_prelu(data, gamma): channel-wise PReLU, y = x > 0 ? x : gamma[c] * x, for data of
// shape (N, C, ...) and gamma of C elements (symbols/common.py keeps it as (C, 1, 1, 1)).
// Its backward: dx = x > 0 ? dy : gamma[c] * dy;  dgamma[c] = sum over n and the rest of
// dy * x where x <= 0. That is exactly what symbols/common.py's composite form computes
// (relu(x) + depthwise-1x1-conv(clip(x, -inf, 0), gamma), whose backward also lets x == 0
// through the negative branch), in one pass over the data instead of six operators.
// float32 only (the backbone's CPU dtype); the composite stays for anything else.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "lib_api.h"

using namespace mxnet::ext;

namespace {

// Planes of N*C elements each, `plane` long, channel = plane index % channels.
constexpr int64_t kChannelBlock = 8;   // channels per thread's share of the backward

struct Layout {
  int64_t batch, channels, plane;
};

bool layout_of(const MXTensor& data, const MXTensor& gamma, Layout* layout) {
  if (data.shape.size() < 2) return false;
  int64_t plane = 1;
  for (size_t i = 2; i < data.shape.size(); ++i) plane *= data.shape[i];
  layout->batch = data.shape[0];
  layout->channels = data.shape[1];
  layout->plane = plane;
  return gamma.size() == layout->channels;
}

MXReturnValue parse_attrs(const std::unordered_map<std::string, std::string>& attrs,
                          int* num_inputs, int* num_outputs) {
  *num_inputs = 2;
  *num_outputs = 1;
  return MX_SUCCESS;
}

MXReturnValue infer_type(const std::unordered_map<std::string, std::string>& attrs,
                         std::vector<int>* in_types, std::vector<int>* out_types) {
  for (int& type : *in_types) {            // -1: not known yet; float32 is the only choice
    if (type != -1 && type != kFloat32) {
      MX_ERROR_MSG << "sample_fc_prelu takes float32 data and gamma";
      return MX_FAIL;
    }
    type = kFloat32;
  }
  (*out_types)[0] = kFloat32;
  return MX_SUCCESS;
}

MXReturnValue infer_shape(const std::unordered_map<std::string, std::string>& attrs,
                          std::vector<std::vector<unsigned int>>* in_shapes,
                          std::vector<std::vector<unsigned int>>* out_shapes) {
  const std::vector<unsigned int>& data = (*in_shapes)[0];
  const std::vector<unsigned int>& gamma = (*in_shapes)[1];
  int64_t gamma_size = 1;
  for (unsigned int d : gamma) gamma_size *= d;
  if (data.size() < 2 || gamma_size != data[1]) {
    MX_ERROR_MSG << "sample_fc_prelu: data must be (N, C, ...) and gamma hold C elements";
    return MX_FAIL;
  }
  (*out_shapes)[0] = data;
  return MX_SUCCESS;
}

MXReturnValue forward(const std::unordered_map<std::string, std::string>& attrs,
                      std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                      const OpResource& res) {
  Layout L;
  if (!layout_of((*inputs)[0], (*inputs)[1], &L)) return MX_FAIL;
  const float* x = (*inputs)[0].data<float>();
  const float* gamma = (*inputs)[1].data<float>();
  float* y = (*outputs)[0].data<float>();
  const int64_t planes = L.batch * L.channels;
#pragma omp parallel for schedule(static) if (planes * L.plane > 65536)
  for (int64_t p = 0; p < planes; ++p) {
    const float slope = gamma[p % L.channels];
    const float* __restrict__ xp = x + p * L.plane;
    float* __restrict__ yp = y + p * L.plane;
    // branch-free (a data-dependent branch mispredicts on half the elements): relu(x) + slope * min(x, 0),
    // the composite's own sum, so the same bits
    for (int64_t i = 0; i < L.plane; ++i) yp[i] = std::max(xp[i], 0.0f) + slope * std::min(xp[i], 0.0f);
  }
  return MX_SUCCESS;
}

// inputs: dy, x, gamma, y; outputs: dx, dgamma
MXReturnValue backward(const std::unordered_map<std::string, std::string>& attrs,
                       std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                       const OpResource& res) {
  Layout L;
  if (!layout_of((*inputs)[1], (*inputs)[2], &L)) return MX_FAIL;
  const float* dy = (*inputs)[0].data<float>();
  const float* x = (*inputs)[1].data<float>();
  const float* gamma = (*inputs)[2].data<float>();
  float* dx = (*outputs)[0].data<float>();
  float* dgamma = (*outputs)[1].data<float>();
  const int64_t C = L.channels;
  const int64_t blocks = (C + kChannelBlock - 1) / kChannelBlock;
  // Threads split the channels into blocks; each block walks the batch in order, so every
  // dgamma[c] is summed in the same order whatever the thread count. Two loops per plane:
  // GCC vectorises a select and a reduction apart, not together (`omp simd` allows the
  // reduction's reassociation).
#pragma omp parallel for schedule(static) if (L.batch * C * L.plane > 65536)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t first = block * kChannelBlock, last = std::min(C, first + kChannelBlock);
    for (int64_t c = first; c < last; ++c) dgamma[c] = 0.0f;
    for (int64_t n = 0; n < L.batch; ++n) {
      for (int64_t c = first; c < last; ++c) {
        const float slope = gamma[c];
        const int64_t offset = (n * C + c) * L.plane;
        const float* __restrict__ xp = x + offset;
        const float* __restrict__ dyp = dy + offset;
        float* __restrict__ dxp = dx + offset;
        for (int64_t i = 0; i < L.plane; ++i) dxp[i] = xp[i] > 0.0f ? dyp[i] : dyp[i] * slope;
        float plane_sum = 0.0f;
#pragma omp simd reduction(+ : plane_sum)
        for (int64_t i = 0; i < L.plane; ++i) plane_sum += dyp[i] * std::min(xp[i], 0.0f);
        dgamma[c] += plane_sum;
      }
    }
  }
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(sample_fc_prelu)
    .setParseAttrs(parse_attrs)
    .setInferType(infer_type)
    .setInferShape(infer_shape)
    .setForward(forward, "cpu")
    .setBackward(backward, "cpu");

MXReturnValue initialize(int version) {
  if (version < 10700) {
    MX_ERROR_MSG << "sample_fc's operators need MXNet >= 1.7, found version " << version;
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
