// Operators MXNet 1.9 lacks a fast CPU form of, as an external operator library
// (MXNet's lib_api: mx.library.load, loaded by sample_fc/fused_ops.py; built by setup.py).
//
// sample_fc_prelu(data, gamma): channel-wise PReLU, y = x > 0 ? x : gamma[c] * x, for data of
// shape (N, C, ...) and gamma of C elements (symbols/common.py keeps it as (C, 1, 1, 1)).
// Its backward: dx = x > 0 ? dy : gamma[c] * dy;  dgamma[c] = sum over n and the rest of
// dy * x where x <= 0. That is exactly what symbols/common.py's composite form computes
// (relu(x) + depthwise-1x1-conv(clip(x, -inf, 0), gamma), whose backward also lets x == 0
// through the negative branch), in one pass over the data instead of six operators.
//
// sample_fc_group_conv3x3(data, weight; num_group): the grouped 3x3 convolution, stride 1,
// pad 1, no bias, no dilation, with as many output channels as input ones: data (N, C, H, W),
// weight (C, k, 3, 3), k = C / num_group channels in and out per group,
// y[n, g*k+o, h, w] = sum over i < k and a, b < 3 of x[n, g*k+i, h+a-1, w+b-1] * W[g*k+o, i, a, b]
// (zero outside the plane). MXNet 1.9's CPU Convolution has a fast kernel for the depthwise
// case (k == 1) but not for k == 2 (mbf's stem_dw_conv: 128 channels in 64 groups), which it
// ran 4-7x slower than a depthwise conv of the same size (one thread, forward + backward, batch
// 64 at 16x16 and 56x56); this one is 3-7x faster at 16x16, 2.6-3x at 56x56. Each plane is
// copied into a zero-bordered buffer of row stride W+2, so that all 9 taps over a whole plane
// are one vectorised loop (no separate edge columns: the borders are the zero padding); the
// backward's dx is the same loop over dy with the kernel rotated by 180 degrees, and
// dW[o, i, a, b] = sum over n, h, w of dy[n, o, h, w] * x[n, i, h+a-1, w+b-1] is 9 dot
// products over the same buffers. The same function as MXNet's Convolution; the float sums
// are in another order (values differ by rounding only), and dW sums each plane in float and
// the batch in double, in a fixed order: the same bits whatever the thread count.
//
// sample_fc_layer_norm(data, gamma, beta; eps): LayerNorm over the last axis of data (any
// shape, W = its last dimension), y = (x - mean) * rstd * gamma + beta with rstd = 1 /
// sqrt(var + eps), var the biased variance of the row (MXNet's LayerNorm and torch's). MXNet
// 1.9's CPU backward of LayerNorm is its generic reduction path: 16x its forward's time, a
// fifth of a ViT step (vit_t, 64 px, batch 32, one thread: 310-356 of 1,480-1,660 ms). Here
// each row's mean and rstd are computed again in the backward (two passes over a row in cache), and
// dx = rstd * (g dy - mean(g dy) - xhat * mean(g dy xhat)), xhat = (x - mean) * rstd;
// dgamma = sum over rows of dy * xhat, dbeta = sum of dy, by blocks of columns that walk the
// rows in order (double sums): the same bits whatever the thread count.
//
// sample_fc_attention(qkv[, key_bias]; heads, key_bias): multi-head self-attention from a ViT
// block's fused qkv projection. qkv (N, L, 3W): each token's q, k and v, each split into `heads`
// heads of d = W / heads (symbols/vit.py's layout: reshape (N, L, 3, H, d)); key_bias, when the
// attribute key_bias is 1, (N H, 1, L): added to every query's scores of head h of sample n (the
// ViT's left-out tokens as keys). out (N, L, W), head h in columns h d .. h d + d - 1:
// softmax(q k^T / sqrt(d) + key_bias) v. MXNet 1.9 computes it as a 5-D transpose, splits, two
// batch_dots (a serial loop of one small sgemm per head and sample) and transposes back: a fifth of
// a vit_t step at 64 px. Here each (sample, head) is one task: its q, k, v copied into contiguous
// rows, the L x L scores and softmax, the mix, written in place; the backward recomputes the
// softmax (one more q k^T, the cheapest product of the block) and writes dq, dk, dv into dqkv
// and, with a key_bias, its gradient (the scores' gradient summed over the queries). Every
// output element is written by one task: the same bits whatever the thread count.
//
// sample_fc_clip(data; a_min, a_max): MXNet's clip, y = min(max(x, a_min), a_max), its backward
// dx = (x > a_max || x < a_min) ? 0 : dy (the bounds pass the gradient, NaN passes both ways), as
// MXNet computes them. MXNet 1.9's CPU clip branches per element: on data of both signs (a ViT
// MLP's ReLU6, clip(x, 0, 6), on centred pre-activations) its forward and backward ran 3x slower
// than on data of one sign (one thread: 24 against 8 ms on 1.6M elements), a seventh of a vit_t
// step at 64 px. Here both are a vector min and max, and a vector compare and blend.
//
// All float32 only (the backbone's CPU dtype); MXNet's operators stay for anything else.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
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

// Every input and output float32; `refusal` names the op and its inputs when one is not.
MXReturnValue float32_only(const char* refusal, std::vector<int>* in_types, std::vector<int>* out_types) {
  for (int& type : *in_types) {            // -1: not known yet; float32 is the only choice
    if (type != -1 && type != kFloat32) {
      MX_ERROR_MSG << refusal;
      return MX_FAIL;
    }
    type = kFloat32;
  }
  (*out_types)[0] = kFloat32;
  return MX_SUCCESS;
}

// The text of operator `op`'s attribute `name`, or null (the reason in MX_ERROR_MSG) when it is missing.
const std::string* attribute(const std::unordered_map<std::string, std::string>& attrs, const char* op,
                             const char* name) {
  auto found = attrs.find(name);
  if (found == attrs.end()) {
    MX_ERROR_MSG << op << " needs the attribute " << name;
    return nullptr;
  }
  return &found->second;
}

// Operator `op`'s attribute `name` as a positive integer: false (the reason in MX_ERROR_MSG) unless
// it is there and its whole text is one.
bool positive_int_attribute(const std::unordered_map<std::string, std::string>& attrs, const char* op,
                            const char* name, int64_t* value) {
  const std::string* text = attribute(attrs, op, name);
  if (!text) return false;
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(text->c_str(), &end, 10);
  if (end == text->c_str() || *end != '\0' || errno != 0 || parsed <= 0) {
    MX_ERROR_MSG << op << ": " << name << " must be a positive integer, got '" << *text << "'";
    return false;
  }
  *value = parsed;
  return true;
}

MXReturnValue infer_type(const std::unordered_map<std::string, std::string>& attrs,
                         std::vector<int>* in_types, std::vector<int>* out_types) {
  return float32_only("sample_fc_prelu takes float32 data and gamma", in_types, out_types);
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

// ---- sample_fc_group_conv3x3 ----

// Groups, channels per group and plane of a grouped conv; planes are read through zero-bordered
// copies of row stride S = W+2: (H+2) rows plus 2 floats of slack (the last taps of the last
// row's border columns), and results are written in that stride, H rows.
struct ConvLayout {
  int64_t batch, channels, height, width, groups, k;
  int64_t stride() const { return width + 2; }
  int64_t padded() const { return (height + 2) * stride() + 2; }
  int64_t rows() const { return height * stride(); }
};

constexpr int64_t kTaps = 9;
constexpr int64_t kAlign = 16;       // floats: scratch buffers start on a 64-byte boundary

// num_group from the attributes: false (and the reason in MX_ERROR_MSG) unless a positive integer
bool parse_num_group(const std::unordered_map<std::string, std::string>& attrs, int64_t* groups) {
  return positive_int_attribute(attrs, "sample_fc_group_conv3x3", "num_group", groups);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream text;
  text << "(";
  for (size_t i = 0; i < shape.size(); ++i) text << (i ? ", " : "") << shape[i];
  text << (shape.size() == 1 ? ",)" : ")");
  return text.str();
}

// The layout of data (N, C, H, W) and weight (C, C/num_group, 3, 3); false (the reason in
// MX_ERROR_MSG) for anything else. An empty weight shape (not known yet) is taken as the right one.
bool conv_layout(const std::unordered_map<std::string, std::string>& attrs, const std::vector<int64_t>& data,
                 const std::vector<int64_t>& weight, ConvLayout* layout) {
  int64_t groups = 0;
  if (!parse_num_group(attrs, &groups)) return false;
  if (data.size() != 4) {
    MX_ERROR_MSG << "sample_fc_group_conv3x3: data must be (N, C, H, W), got " << shape_text(data);
    return false;
  }
  if (data[1] % groups != 0) {
    MX_ERROR_MSG << "sample_fc_group_conv3x3: the " << data[1] << " channels of data do not divide into num_group = "
                 << groups << " groups";
    return false;
  }
  const int64_t k = data[1] / groups;
  const std::vector<int64_t> want = {data[1], k, 3, 3};
  if (!weight.empty() && weight != want) {
    MX_ERROR_MSG << "sample_fc_group_conv3x3: weight must be (C, C/num_group, 3, 3) = " << shape_text(want)
                 << " for data " << shape_text(data) << " and num_group = " << groups << ", got " << shape_text(weight);
    return false;
  }
  *layout = {data[0], data[1], data[2], data[3], groups, k};
  return true;
}

MXReturnValue conv_parse_attrs(const std::unordered_map<std::string, std::string>& attrs,
                               int* num_inputs, int* num_outputs) {
  int64_t groups = 0;
  if (!parse_num_group(attrs, &groups)) return MX_FAIL;
  return parse_attrs(attrs, num_inputs, num_outputs);
}

MXReturnValue conv_infer_type(const std::unordered_map<std::string, std::string>& attrs,
                              std::vector<int>* in_types, std::vector<int>* out_types) {
  return float32_only("sample_fc_group_conv3x3 takes float32 data and weight", in_types, out_types);
}

MXReturnValue conv_infer_shape(const std::unordered_map<std::string, std::string>& attrs,
                               std::vector<std::vector<unsigned int>>* in_shapes,
                               std::vector<std::vector<unsigned int>>* out_shapes) {
  const std::vector<int64_t> data((*in_shapes)[0].begin(), (*in_shapes)[0].end());
  const std::vector<int64_t> weight((*in_shapes)[1].begin(), (*in_shapes)[1].end());
  // data or its channels not known yet (infer_shape_partial; 0 is unknown): nothing to say
  if (data.empty() || (data.size() == 4 && data[1] == 0)) return MX_SUCCESS;
  ConvLayout L;
  if (!conv_layout(attrs, data, weight, &L)) return MX_FAIL;
  (*in_shapes)[1] = {static_cast<unsigned int>(L.channels), static_cast<unsigned int>(L.k), 3u, 3u};
  (*out_shapes)[0] = (*in_shapes)[0];
  return MX_SUCCESS;
}

// Zeroed scratch floats whose first one is 64-byte aligned: the vectorised loops then split
// into the same scalar and vector parts in every thread (the dot products' float sums too).
class Scratch {
 public:
  explicit Scratch(int64_t size) : store_(size + kAlign, 0.0f) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(store_.data());
    const uintptr_t bytes = kAlign * sizeof(float);
    data_ = store_.data() + ((bytes - address % bytes) % bytes) / sizeof(float);
  }
  float* data() { return data_; }

 private:
  std::vector<float> store_;
  float* data_;
};

// Copies `count` planes of H x W, `plane_gap` floats apart from `src`, into the interiors of
// the zero-bordered planes at `dst`, L.padded() apart (their borders stay zero).
void pad_planes(const float* src, int64_t plane_gap, int64_t count, const ConvLayout& L, float* dst) {
  const int64_t S = L.stride();
  for (int64_t c = 0; c < count; ++c) {
    for (int64_t h = 0; h < L.height; ++h) {
      std::memcpy(dst + c * L.padded() + (h + 1) * S + 1, src + c * plane_gap + h * L.width, L.width * sizeof(float));
    }
  }
}

// The interior columns of `rows` (row stride W+2) into a dense H x W plane.
void unpad_plane(const float* rows, const ConvLayout& L, float* dst) {
  for (int64_t h = 0; h < L.height; ++h) {
    std::memcpy(dst + h * L.width, rows + h * L.stride(), L.width * sizeof(float));
  }
}

// out[q] = sum over i < k of the 9 taps w[i*9 + 3a+b] * padded plane i [q + a*S + b], for every
// q < H*S: the 3x3 correlation of k zero-bordered planes, one vectorised loop per input plane
// (columns W and W+1 of each out row are garbage, dropped by unpad_plane).
void correlate(const float* planes, const float* w, const ConvLayout& L, float* __restrict__ out) {
  const int64_t S = L.stride(), Q = L.rows();
  for (int64_t i = 0; i < L.k; ++i) {
    const float* __restrict__ r0 = planes + i * L.padded();
    const float* __restrict__ r1 = r0 + S;
    const float* __restrict__ r2 = r0 + 2 * S;
    const float* t = w + i * kTaps;
    const float w0 = t[0], w1 = t[1], w2 = t[2], w3 = t[3], w4 = t[4], w5 = t[5], w6 = t[6], w7 = t[7], w8 = t[8];
    if (i == 0) {
      for (int64_t q = 0; q < Q; ++q) {
        out[q] = w0 * r0[q] + w1 * r0[q + 1] + w2 * r0[q + 2] + w3 * r1[q] + w4 * r1[q + 1] + w5 * r1[q + 2] +
                 w6 * r2[q] + w7 * r2[q + 1] + w8 * r2[q + 2];
      }
    } else {
      for (int64_t q = 0; q < Q; ++q) {
        out[q] += w0 * r0[q] + w1 * r0[q + 1] + w2 * r0[q + 2] + w3 * r1[q] + w4 * r1[q + 1] + w5 * r1[q + 2] +
                  w6 * r2[q] + w7 * r2[q + 1] + w8 * r2[q + 2];
      }
    }
  }
}

// Every (n, group) pair's k output planes from its k input planes; `w` holds, for each output
// channel c, its k x 9 taps (the forward: the weight itself; dx: the transposed, rotated one).
void conv_planes(const float* in, const float* w, const ConvLayout& L, float* out) {
  const int64_t plane = L.height * L.width, pairs = L.batch * L.groups;
#pragma omp parallel if (L.batch * L.channels * plane > 65536)
  {
    Scratch padded(L.k * L.padded()), rows(L.rows());
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < pairs; ++pair) {
      const int64_t first = pair * L.k;        // (n * C + g * k): the group's first plane
      const int64_t g = pair % L.groups;
      pad_planes(in + first * plane, plane, L.k, L, padded.data());
      for (int64_t o = 0; o < L.k; ++o) {
        correlate(padded.data(), w + (g * L.k + o) * L.k * kTaps, L, rows.data());
        unpad_plane(rows.data(), L, out + (first + o) * plane);
      }
    }
  }
}

MXReturnValue conv_forward(const std::unordered_map<std::string, std::string>& attrs,
                           std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                           const OpResource& res) {
  ConvLayout L;
  if (!conv_layout(attrs, (*inputs)[0].shape, (*inputs)[1].shape, &L)) return MX_FAIL;
  conv_planes((*inputs)[0].data<float>(), (*inputs)[1].data<float>(), L, (*outputs)[0].data<float>());
  return MX_SUCCESS;
}

// inputs: dy, x, weight, y; outputs: dx, dweight
MXReturnValue conv_backward(const std::unordered_map<std::string, std::string>& attrs,
                            std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                            const OpResource& res) {
  ConvLayout L;
  if (!conv_layout(attrs, (*inputs)[1].shape, (*inputs)[2].shape, &L)) return MX_FAIL;
  const float* dy = (*inputs)[0].data<float>();
  const float* x = (*inputs)[1].data<float>();
  const float* w = (*inputs)[2].data<float>();
  float* dx = (*outputs)[0].data<float>();
  float* dw = (*outputs)[1].data<float>();
  const int64_t k = L.k, plane = L.height * L.width;

  // dx[i] = sum over o of dy[o] correlated with W[o, i] rotated by 180 degrees: the forward's
  // loop with, for input channel g*k+i, the taps rotated[g*k+i][o][8 - tap] = W[g*k+o][i][tap]
  std::vector<float> rotated(L.channels * k * kTaps);
  for (int64_t g = 0; g < L.groups; ++g)
    for (int64_t o = 0; o < k; ++o)
      for (int64_t i = 0; i < k; ++i)
        for (int64_t tap = 0; tap < kTaps; ++tap)
          rotated[((g * k + i) * k + o) * kTaps + kTaps - 1 - tap] = w[((g * k + o) * k + i) * kTaps + tap];
  conv_planes(dy, rotated.data(), L, dx);

  // dW[g*k+o][i][3a+b] = sum over n, then the plane, of dy[o][q] * x_padded[i][q + a*S + b]:
  // dy read from its own zero-bordered copy at (1, 1), so that its row stride is S and its
  // columns W and W+1 are the borders' zeros. Threads own whole groups and walk n in order.
  const int64_t S = L.stride(), Q = L.rows();
#pragma omp parallel if (L.batch * L.channels * plane > 65536)
  {
    Scratch xs(k * L.padded()), dys(k * L.padded());
    std::vector<double> sums(k * k * kTaps);
#pragma omp for schedule(static)
    for (int64_t g = 0; g < L.groups; ++g) {
      std::fill(sums.begin(), sums.end(), 0.0);
      for (int64_t n = 0; n < L.batch; ++n) {
        const int64_t first = (n * L.channels + g * k) * plane;
        pad_planes(x + first, plane, k, L, xs.data());
        pad_planes(dy + first, plane, k, L, dys.data());
        for (int64_t o = 0; o < k; ++o) {
          const float* __restrict__ d = dys.data() + o * L.padded() + S + 1;
          for (int64_t i = 0; i < k; ++i) {
            const float* __restrict__ r0 = xs.data() + i * L.padded();
            const float* __restrict__ r1 = r0 + S;
            const float* __restrict__ r2 = r0 + 2 * S;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0, s8 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3, s4, s5, s6, s7, s8)
            for (int64_t q = 0; q < Q; ++q) {
              const float v = d[q];
              s0 += v * r0[q]; s1 += v * r0[q + 1]; s2 += v * r0[q + 2];
              s3 += v * r1[q]; s4 += v * r1[q + 1]; s5 += v * r1[q + 2];
              s6 += v * r2[q]; s7 += v * r2[q + 1]; s8 += v * r2[q + 2];
            }
            double* sum = sums.data() + (o * k + i) * kTaps;
            sum[0] += s0; sum[1] += s1; sum[2] += s2; sum[3] += s3; sum[4] += s4;
            sum[5] += s5; sum[6] += s6; sum[7] += s7; sum[8] += s8;
          }
        }
      }
      for (int64_t j = 0; j < k * k * kTaps; ++j) dw[g * k * k * kTaps + j] = static_cast<float>(sums[j]);
    }
  }
  return MX_SUCCESS;
}

// ---- sample_fc_layer_norm ----

constexpr int64_t kColumnBlock = 16;   // columns per thread's share of dgamma and dbeta (one cache line)

// eps from the attributes: false (and the reason in MX_ERROR_MSG) unless a positive finite number
bool parse_eps(const std::unordered_map<std::string, std::string>& attrs, float* eps) {
  const std::string* text = attribute(attrs, "sample_fc_layer_norm", "eps");
  if (!text) return false;
  char* end = nullptr;
  errno = 0;
  const float value = std::strtof(text->c_str(), &end);
  if (end == text->c_str() || *end != '\0' || errno != 0 || !(value > 0.0f) || !std::isfinite(value)) {
    MX_ERROR_MSG << "sample_fc_layer_norm: eps must be a positive number, got '" << *text << "'";
    return false;
  }
  *eps = value;
  return true;
}

MXReturnValue ln_parse_attrs(const std::unordered_map<std::string, std::string>& attrs,
                             int* num_inputs, int* num_outputs) {
  float eps = 0.0f;
  if (!parse_eps(attrs, &eps)) return MX_FAIL;
  *num_inputs = 3;
  *num_outputs = 1;
  return MX_SUCCESS;
}

MXReturnValue ln_infer_type(const std::unordered_map<std::string, std::string>& attrs,
                            std::vector<int>* in_types, std::vector<int>* out_types) {
  return float32_only("sample_fc_layer_norm takes float32 data, gamma and beta", in_types, out_types);
}

MXReturnValue ln_infer_shape(const std::unordered_map<std::string, std::string>& attrs,
                             std::vector<std::vector<unsigned int>>* in_shapes,
                             std::vector<std::vector<unsigned int>>* out_shapes) {
  const std::vector<unsigned int>& data = (*in_shapes)[0];
  if (data.empty() || data.back() == 0) return MX_SUCCESS;      // not known yet
  for (int i = 1; i < 3; ++i) {
    std::vector<unsigned int>& param = (*in_shapes)[i];
    int64_t size = 1;
    for (unsigned int d : param) size *= d;
    if (!param.empty() && size != data.back()) {
      MX_ERROR_MSG << "sample_fc_layer_norm: gamma and beta must hold " << data.back()
                   << " elements, the last dimension of data";
      return MX_FAIL;
    }
    param = {data.back()};
  }
  (*out_shapes)[0] = data;
  return MX_SUCCESS;
}

// A row's mean and 1 / sqrt(biased variance + eps), the variance from the centred values.
inline void row_stats(const float* __restrict__ x, int64_t width, float eps, float* mean, float* rstd) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < width; ++i) sum += x[i];
  const float m = sum / static_cast<float>(width);
  float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
  for (int64_t i = 0; i < width; ++i) squares += (x[i] - m) * (x[i] - m);
  *mean = m;
  *rstd = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
}

int64_t rows_of(const MXTensor& data) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < data.shape.size(); ++i) rows *= data.shape[i];
  return rows;
}

MXReturnValue ln_forward(const std::unordered_map<std::string, std::string>& attrs,
                         std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                         const OpResource& res) {
  float eps = 0.0f;
  if (!parse_eps(attrs, &eps)) return MX_FAIL;
  const int64_t width = (*inputs)[0].shape.back(), rows = rows_of((*inputs)[0]);
  const float* x = (*inputs)[0].data<float>();
  const float* gamma = (*inputs)[1].data<float>();
  const float* beta = (*inputs)[2].data<float>();
  float* y = (*outputs)[0].data<float>();
#pragma omp parallel for schedule(static) if (rows * width > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ xr = x + r * width;
    float* __restrict__ yr = y + r * width;
    float mean, rstd;
    row_stats(xr, width, eps, &mean, &rstd);
    for (int64_t i = 0; i < width; ++i) yr[i] = (xr[i] - mean) * rstd * gamma[i] + beta[i];
  }
  return MX_SUCCESS;
}

// inputs: dy, x, gamma, beta, y; outputs: dx, dgamma, dbeta
MXReturnValue ln_backward(const std::unordered_map<std::string, std::string>& attrs,
                          std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                          const OpResource& res) {
  float eps = 0.0f;
  if (!parse_eps(attrs, &eps)) return MX_FAIL;
  const int64_t width = (*inputs)[1].shape.back(), rows = rows_of((*inputs)[1]);
  const float* dy = (*inputs)[0].data<float>();
  const float* x = (*inputs)[1].data<float>();
  const float* gamma = (*inputs)[2].data<float>();
  float* dx = (*outputs)[0].data<float>();
  float* dgamma = (*outputs)[1].data<float>();
  float* dbeta = (*outputs)[2].data<float>();
  std::vector<float> means(rows), rstds(rows);
  const float inverse_width = 1.0f / static_cast<float>(width);
#pragma omp parallel for schedule(static) if (rows * width > 65536)
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ xr = x + r * width;
    const float* __restrict__ dyr = dy + r * width;
    float* __restrict__ dxr = dx + r * width;
    float mean, rstd;
    row_stats(xr, width, eps, &mean, &rstd);
    means[r] = mean;
    rstds[r] = rstd;
    float scaled_sum = 0.0f, projected_sum = 0.0f;     // sums of g dy and of g dy xhat
#pragma omp simd reduction(+ : scaled_sum, projected_sum)
    for (int64_t i = 0; i < width; ++i) {
      const float g_dy = gamma[i] * dyr[i];
      scaled_sum += g_dy;
      projected_sum += g_dy * (xr[i] - mean) * rstd;
    }
    const float a = scaled_sum * inverse_width, b = projected_sum * inverse_width;
    for (int64_t i = 0; i < width; ++i) dxr[i] = rstd * (gamma[i] * dyr[i] - a - (xr[i] - mean) * rstd * b);
  }
  const int64_t blocks = (width + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * width > 65536)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t first = block * kColumnBlock, count = std::min(width, first + kColumnBlock) - first;
    double gamma_sums[kColumnBlock] = {0.0}, beta_sums[kColumnBlock] = {0.0};
    for (int64_t r = 0; r < rows; ++r) {
      const float* __restrict__ xr = x + r * width + first;
      const float* __restrict__ dyr = dy + r * width + first;
      const float mean = means[r], rstd = rstds[r];
      for (int64_t i = 0; i < count; ++i) {
        gamma_sums[i] += static_cast<double>(dyr[i] * ((xr[i] - mean) * rstd));
        beta_sums[i] += static_cast<double>(dyr[i]);
      }
    }
    for (int64_t i = 0; i < count; ++i) {
      dgamma[first + i] = static_cast<float>(gamma_sums[i]);
      dbeta[first + i] = static_cast<float>(beta_sums[i]);
    }
  }
  return MX_SUCCESS;
}

// ---- sample_fc_attention ----

// heads and whether a key_bias is given, from the attributes: false (the reason in MX_ERROR_MSG)
// unless heads is a positive integer and key_bias 0 or 1
bool parse_attention(const std::unordered_map<std::string, std::string>& attrs, int64_t* heads, bool* biased) {
  if (!positive_int_attribute(attrs, "sample_fc_attention", "heads", heads)) return false;
  auto bias = attrs.find("key_bias");
  const std::string word = bias == attrs.end() ? "0" : bias->second;
  if (word != "0" && word != "1") {
    MX_ERROR_MSG << "sample_fc_attention: key_bias must be 0 or 1, got '" << word << "'";
    return false;
  }
  *biased = word == "1";
  return true;
}

struct AttentionLayout {
  int64_t batch, tokens, width, heads, head;
};

// The layout of qkv (N, L, 3W) with W a multiple of heads, and key_bias (N heads, 1, L) if given
// (empty: not known yet); false (the reason in MX_ERROR_MSG) for anything else.
bool attention_layout(int64_t heads, const std::vector<int64_t>& qkv, const std::vector<int64_t>* key_bias,
                      AttentionLayout* layout) {
  if (qkv.size() != 3 || qkv[2] % (3 * heads) != 0) {
    MX_ERROR_MSG << "sample_fc_attention: qkv must be (N, L, 3W) with W a multiple of heads = " << heads << ", got "
                 << shape_text(qkv);
    return false;
  }
  *layout = {qkv[0], qkv[1], qkv[2] / 3, heads, qkv[2] / (3 * heads)};
  if (key_bias && !key_bias->empty()) {
    const std::vector<int64_t> want = {qkv[0] * heads, 1, qkv[1]};
    if (*key_bias != want) {
      MX_ERROR_MSG << "sample_fc_attention: key_bias must be (N heads, 1, L) = " << shape_text(want) << ", got "
                   << shape_text(*key_bias);
      return false;
    }
  }
  return true;
}

MXReturnValue attention_parse_attrs(const std::unordered_map<std::string, std::string>& attrs,
                                    int* num_inputs, int* num_outputs) {
  int64_t heads = 0;
  bool biased = false;
  if (!parse_attention(attrs, &heads, &biased)) return MX_FAIL;
  *num_inputs = biased ? 2 : 1;
  *num_outputs = 1;
  return MX_SUCCESS;
}

MXReturnValue attention_infer_type(const std::unordered_map<std::string, std::string>& attrs,
                                   std::vector<int>* in_types, std::vector<int>* out_types) {
  return float32_only("sample_fc_attention takes float32 qkv and key_bias", in_types, out_types);
}

MXReturnValue attention_infer_shape(const std::unordered_map<std::string, std::string>& attrs,
                                    std::vector<std::vector<unsigned int>>* in_shapes,
                                    std::vector<std::vector<unsigned int>>* out_shapes) {
  int64_t heads = 0;
  bool biased = false;
  if (!parse_attention(attrs, &heads, &biased)) return MX_FAIL;
  const std::vector<int64_t> qkv((*in_shapes)[0].begin(), (*in_shapes)[0].end());
  if (qkv.empty() || std::find(qkv.begin(), qkv.end(), 0) != qkv.end()) return MX_SUCCESS;   // not known yet
  std::vector<int64_t> bias;
  if (biased) bias.assign((*in_shapes)[1].begin(), (*in_shapes)[1].end());
  AttentionLayout L;
  if (!attention_layout(heads, qkv, biased ? &bias : nullptr, &L)) return MX_FAIL;
  if (biased)
    (*in_shapes)[1] = {static_cast<unsigned int>(L.batch * L.heads), 1u, static_cast<unsigned int>(L.tokens)};
  (*out_shapes)[0] = {static_cast<unsigned int>(L.batch), static_cast<unsigned int>(L.tokens),
                      static_cast<unsigned int>(L.width)};
  return MX_SUCCESS;
}

// Each task's loops are compiled for AVX-512 and AVX2 beside the baseline (x86-64-v2), the
// widest the CPU has chosen at load (GCC's target_clones; an OpenMP region's body would not
// inherit it, so the regions call these functions).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WIDEST_VECTORS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define WIDEST_VECTORS
#endif

// exp(x) in float for a vectorised loop: 2^n * p(r), x = n ln 2 + r, |r| <= ln 2 / 2, p of degree
// 6 (relative error below 2e-7 over the range); 0 below -87 (a left-out key's score, -1e9), as
// expf underflows there.
inline float vector_exp(float x) {
  const bool underflows = x < -87.0f;
  x = std::max(x, -87.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return underflows ? 0.0f : p * scale;
}

constexpr int64_t kLanes = 16;        // a block of columns one AVX-512 register holds

inline int64_t padded_to_lanes(int64_t count) { return (count + kLanes - 1) / kLanes * kLanes; }

// Rows [i, i + rows) (rows <= Rows) of C's columns [col, col + Width) = A B * alpha: one
// accumulator per row and kLanes columns, Rows * Width / kLanes independent chains over k (no
// horizontal sums; enough of them to keep the FMA units busy).
template <int Width, int Rows>
inline void gemm_block(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t i,
                       int64_t rows, int64_t k, int64_t col, float alpha) {
  float acc[Rows][Width] = {{0.0f}};
  const float* a[Rows];
  for (int row = 0; row < Rows; ++row) a[row] = A + (i + std::min<int64_t>(row, rows - 1)) * lda;
  for (int64_t r = 0; r < k; ++r) {
    const float* __restrict__ b = B + r * ldb + col;
    for (int row = 0; row < Rows; ++row) {
      const float x = a[row][r];
      for (int l = 0; l < Width; ++l) acc[row][l] += x * b[l];
    }
  }
  for (int64_t row = 0; row < rows; ++row)
    for (int l = 0; l < Width; ++l) C[(i + row) * ldc + col + l] = acc[row][l] * alpha;
}

// Columns [col, col + Width) of C for every row, Rows rows at a time.
template <int Width, int Rows>
inline void gemm_columns(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t m,
                         int64_t k, int64_t col, float alpha) {
  for (int64_t i = 0; i < m; i += Rows)
    gemm_block<Width, Rows>(A, lda, B, ldb, C, ldc, i, std::min<int64_t>(Rows, m - i), k, col, alpha);
}

// C (m x n, row stride ldc) = A (m x k, row stride lda) B (k x n, row stride ldb) * alpha, n a
// multiple of kLanes: in column blocks of up to 4 kLanes, 2 rows at a time (4 for narrower blocks).
inline void small_gemm(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                       int64_t m, int64_t k, int64_t n, float alpha) {
  int64_t col = 0;
  for (; col + 4 * kLanes <= n; col += 4 * kLanes)
    gemm_columns<4 * kLanes, 2>(A, lda, B, ldb, C, ldc, m, k, col, alpha);
  if (n - col == 3 * kLanes) gemm_columns<3 * kLanes, 2>(A, lda, B, ldb, C, ldc, m, k, col, alpha);
  if (n - col == 2 * kLanes) gemm_columns<2 * kLanes, 4>(A, lda, B, ldb, C, ldc, m, k, col, alpha);
  if (n - col == kLanes) gemm_columns<kLanes, 4>(A, lda, B, ldb, C, ldc, m, k, col, alpha);
}

// dst (cols x rows_padded) = src (rows x cols, row stride ld) transposed; the padding columns 0
inline void transpose_into(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst, int64_t ldd) {
  for (int64_t c = 0; c < cols; ++c) {
    float* __restrict__ out = dst + c * ldd;
    for (int64_t r = 0; r < rows; ++r) out[r] = src[r * ld + c];
    for (int64_t r = rows; r < ldd; ++r) out[r] = 0.0f;
  }
}

// One (sample, head) task's blocks, rows padded to whole kLanes: q, k, v (T x D) and the
// transposed kt, vt (d x Tp); p (T x Tp) and its transpose; the backward's dy, dq, dk, dv and
// the scores' gradient ds with its transpose. T tokens, d the head's width, Tp and D padded.
struct HeadBlocks {
  int64_t T, d, Tp, D;
  std::vector<float> q, k, v, kt, vt, p, pt, dy, ds, dst, dq, dk, dv;
  HeadBlocks(int64_t tokens, int64_t head)
      : T(tokens), d(head), Tp(padded_to_lanes(tokens)), D(padded_to_lanes(head)),
        q(T * D), k(T * D), v(T * D), kt(d * Tp), vt(d * Tp), p(T * Tp), pt(T * Tp), dy(T * D),
        ds(T * Tp), dst(T * Tp), dq(T * D), dk(T * D), dv(T * D) {}
};

// Copies d columns of `tokens` rows `stride` apart into a block of row stride D (its padding 0).
inline void gather_rows(const float* src, int64_t stride, int64_t tokens, int64_t head, int64_t D, float* dst) {
  for (int64_t l = 0; l < tokens; ++l) {
    std::memcpy(dst + l * D, src + l * stride, head * sizeof(float));
    for (int64_t c = head; c < D; ++c) dst[l * D + c] = 0.0f;
  }
}

// d columns of `tokens` rows of a block of row stride D into rows `stride` apart.
inline void scatter_rows(const float* src, int64_t D, int64_t tokens, int64_t head, float* dst, int64_t stride) {
  for (int64_t l = 0; l < tokens; ++l) std::memcpy(dst + l * stride, src + l * D, head * sizeof(float));
}

// q, k, v of task (n, h) into b, and P = softmax over each row of q k^T * scale + bias (bias: L
// values, or null) into b.p (its padding columns 0)
WIDEST_VECTORS
void head_probabilities(const AttentionLayout& L, const float* qkv, int64_t task, const float* bias, float scale,
                        HeadBlocks* b) {
  const int64_t T = b->T, d = b->d, Tp = b->Tp, D = b->D, W = L.width, n = task / L.heads, h = task % L.heads;
  const float* base = qkv + n * T * 3 * W + h * d;
  gather_rows(base, 3 * W, T, d, D, b->q.data());
  gather_rows(base + W, 3 * W, T, d, D, b->k.data());
  gather_rows(base + 2 * W, 3 * W, T, d, D, b->v.data());
  transpose_into(b->k.data(), D, T, d, b->kt.data(), Tp);
  small_gemm(b->q.data(), D, b->kt.data(), Tp, b->p.data(), Tp, T, d, Tp, scale);
  for (int64_t i = 0; i < T; ++i) {
    float* __restrict__ row = b->p.data() + i * Tp;
    if (bias)
      for (int64_t j = 0; j < T; ++j) row[j] += bias[j];
    float largest = row[0];
    for (int64_t j = 1; j < T; ++j) largest = std::max(largest, row[j]);
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < T; ++j) {
      row[j] = vector_exp(row[j] - largest);
      total += row[j];
    }
    const float inverse = 1.0f / total;
    for (int64_t j = 0; j < T; ++j) row[j] *= inverse;
    for (int64_t j = T; j < Tp; ++j) row[j] = 0.0f;
  }
}

// out's columns of head h for sample n: P v
WIDEST_VECTORS
void head_forward(const AttentionLayout& L, const float* qkv, int64_t task, const float* bias, float scale,
                  float* out, HeadBlocks* b) {
  head_probabilities(L, qkv, task, bias, scale, b);
  const int64_t T = b->T, D = b->D, W = L.width, n = task / L.heads, h = task % L.heads;
  small_gemm(b->p.data(), b->Tp, b->v.data(), D, b->dq.data(), D, T, T, D, 1.0f);      // dq: scratch here
  scatter_rows(b->dq.data(), D, T, b->d, out + n * T * W + h * b->d, W);
}

// dq, dk, dv of task (n, h) into dqkv, and the scores' gradient summed over the queries into
// dbias (L values, or null)
WIDEST_VECTORS
void head_backward(const AttentionLayout& L, const float* dout, const float* qkv, int64_t task, const float* bias,
                   float scale, float* dqkv, float* dbias, HeadBlocks* b) {
  head_probabilities(L, qkv, task, bias, scale, b);
  const int64_t T = b->T, d = b->d, Tp = b->Tp, D = b->D, W = L.width, n = task / L.heads, h = task % L.heads;
  gather_rows(dout + n * T * W + h * d, W, T, d, D, b->dy.data());
  transpose_into(b->v.data(), D, T, d, b->vt.data(), Tp);
  small_gemm(b->dy.data(), D, b->vt.data(), Tp, b->ds.data(), Tp, T, d, Tp, 1.0f);      // dp = dout v^T
  for (int64_t i = 0; i < T; ++i) {
    const float* __restrict__ pi = b->p.data() + i * Tp;
    float* __restrict__ dsi = b->ds.data() + i * Tp;
    float weighted = 0.0f;                      // sum over j of p_ij dp_ij
#pragma omp simd reduction(+ : weighted)
    for (int64_t j = 0; j < T; ++j) weighted += pi[j] * dsi[j];
    for (int64_t j = 0; j < Tp; ++j) dsi[j] = pi[j] * (dsi[j] - weighted);    // the scores' gradient (pad: 0)
  }
  if (dbias) {
    for (int64_t j = 0; j < T; ++j) dbias[j] = 0.0f;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) dbias[j] += b->ds[i * Tp + j];
  }
  transpose_into(b->p.data(), Tp, T, T, b->pt.data(), Tp);
  transpose_into(b->ds.data(), Tp, T, T, b->dst.data(), Tp);
  small_gemm(b->pt.data(), Tp, b->dy.data(), D, b->dv.data(), D, T, T, D, 1.0f);       // dv = p^T dout
  small_gemm(b->ds.data(), Tp, b->k.data(), D, b->dq.data(), D, T, T, D, scale);       // dq = ds k / sqrt(d)
  small_gemm(b->dst.data(), Tp, b->q.data(), D, b->dk.data(), D, T, T, D, scale);      // dk = ds^T q / sqrt(d)
  float* target = dqkv + n * T * 3 * W + h * d;
  scatter_rows(b->dq.data(), D, T, d, target, 3 * W);
  scatter_rows(b->dk.data(), D, T, d, target + W, 3 * W);
  scatter_rows(b->dv.data(), D, T, d, target + 2 * W, 3 * W);
}

// The attention of `attrs` over inputs[first] (qkv) and, with a key_bias, inputs[first + 1]: its
// layout and those arrays (key_bias null without one); false (the reason in MX_ERROR_MSG) if the
// attributes or shapes are not an attention's.
bool attention_inputs(const std::unordered_map<std::string, std::string>& attrs, std::vector<MXTensor>* inputs,
                      size_t first, AttentionLayout* L, const float** qkv, const float** key_bias) {
  int64_t heads = 0;
  bool biased = false;
  if (!parse_attention(attrs, &heads, &biased)) return false;
  if (!attention_layout(heads, (*inputs)[first].shape, biased ? &(*inputs)[first + 1].shape : nullptr, L)) return false;
  *qkv = (*inputs)[first].data<float>();
  *key_bias = biased ? (*inputs)[first + 1].data<float>() : nullptr;
  return true;
}

MXReturnValue attention_forward(const std::unordered_map<std::string, std::string>& attrs,
                                std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                                const OpResource& res) {
  AttentionLayout L;
  const float *qkv, *key_bias;
  if (!attention_inputs(attrs, inputs, 0, &L, &qkv, &key_bias)) return MX_FAIL;
  float* out = (*outputs)[0].data<float>();
  const int64_t T = L.tokens, tasks = L.batch * L.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.head));
#pragma omp parallel if (tasks * T * T * L.head > 65536)
  {
    HeadBlocks b(T, L.head);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task)
      head_forward(L, qkv, task, key_bias ? key_bias + task * T : nullptr, scale, out, &b);
  }
  return MX_SUCCESS;
}

// inputs: dout, qkv, [key_bias,] out; outputs: dqkv[, dkey_bias]
MXReturnValue attention_backward(const std::unordered_map<std::string, std::string>& attrs,
                                 std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                                 const OpResource& res) {
  AttentionLayout L;
  const float *qkv, *key_bias;
  if (!attention_inputs(attrs, inputs, 1, &L, &qkv, &key_bias)) return MX_FAIL;
  const float* dout = (*inputs)[0].data<float>();
  float* dqkv = (*outputs)[0].data<float>();
  float* dkey_bias = key_bias ? (*outputs)[1].data<float>() : nullptr;
  const int64_t T = L.tokens, tasks = L.batch * L.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(L.head));
#pragma omp parallel if (tasks * T * T * L.head > 65536)
  {
    HeadBlocks b(T, L.head);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task)
      head_backward(L, dout, qkv, task, key_bias ? key_bias + task * T : nullptr, scale, dqkv,
                    dkey_bias ? dkey_bias + task * T : nullptr, &b);
  }
  return MX_SUCCESS;
}

// ---- sample_fc_clip ----

// a_min and a_max from the attributes (numbers; "inf" and "-inf" too): false (the reason in
// MX_ERROR_MSG) unless both are there, neither is NaN and a_min <= a_max
bool parse_bounds(const std::unordered_map<std::string, std::string>& attrs, float* a_min, float* a_max) {
  const char* names[2] = {"a_min", "a_max"};
  float* values[2] = {a_min, a_max};
  for (int i = 0; i < 2; ++i) {
    const std::string* text = attribute(attrs, "sample_fc_clip", names[i]);
    if (!text) return false;
    char* end = nullptr;
    *values[i] = std::strtof(text->c_str(), &end);
    if (end == text->c_str() || *end != '\0' || std::isnan(*values[i])) {
      MX_ERROR_MSG << "sample_fc_clip: " << names[i] << " must be a number, got '" << *text << "'";
      return false;
    }
  }
  if (!(*a_min <= *a_max)) {
    MX_ERROR_MSG << "sample_fc_clip: a_min must be <= a_max, got " << *a_min << " and " << *a_max;
    return false;
  }
  return true;
}

MXReturnValue clip_parse_attrs(const std::unordered_map<std::string, std::string>& attrs,
                               int* num_inputs, int* num_outputs) {
  float a_min, a_max;
  if (!parse_bounds(attrs, &a_min, &a_max)) return MX_FAIL;
  *num_inputs = 1;
  *num_outputs = 1;
  return MX_SUCCESS;
}

MXReturnValue clip_infer_type(const std::unordered_map<std::string, std::string>& attrs,
                              std::vector<int>* in_types, std::vector<int>* out_types) {
  return float32_only("sample_fc_clip takes float32 data", in_types, out_types);
}

MXReturnValue clip_infer_shape(const std::unordered_map<std::string, std::string>& attrs,
                               std::vector<std::vector<unsigned int>>* in_shapes,
                               std::vector<std::vector<unsigned int>>* out_shapes) {
  (*out_shapes)[0] = (*in_shapes)[0];
  return MX_SUCCESS;
}

constexpr int64_t kClipChunk = 1 << 14;   // elements per task of the elementwise loops

WIDEST_VECTORS
void clip_chunk(const float* __restrict__ x, int64_t count, float a_min, float a_max, float* __restrict__ y) {
  for (int64_t i = 0; i < count; ++i) y[i] = std::min(std::max(x[i], a_min), a_max);
}

WIDEST_VECTORS
void clip_grad_chunk(const float* __restrict__ dy, const float* __restrict__ x, int64_t count, float a_min,
                     float a_max, float* __restrict__ dx) {
  for (int64_t i = 0; i < count; ++i) dx[i] = (x[i] > a_max || x[i] < a_min) ? 0.0f : dy[i];
}

MXReturnValue clip_forward(const std::unordered_map<std::string, std::string>& attrs,
                           std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                           const OpResource& res) {
  float a_min, a_max;
  if (!parse_bounds(attrs, &a_min, &a_max)) return MX_FAIL;
  const int64_t size = (*inputs)[0].size();
  const float* x = (*inputs)[0].data<float>();
  float* y = (*outputs)[0].data<float>();
#pragma omp parallel for schedule(static) if (size > 4 * kClipChunk)
  for (int64_t first = 0; first < size; first += kClipChunk)
    clip_chunk(x + first, std::min(kClipChunk, size - first), a_min, a_max, y + first);
  return MX_SUCCESS;
}

// inputs: dy, x, y; outputs: dx
MXReturnValue clip_backward(const std::unordered_map<std::string, std::string>& attrs,
                            std::vector<MXTensor>* inputs, std::vector<MXTensor>* outputs,
                            const OpResource& res) {
  float a_min, a_max;
  if (!parse_bounds(attrs, &a_min, &a_max)) return MX_FAIL;
  const int64_t size = (*inputs)[1].size();
  const float* dy = (*inputs)[0].data<float>();
  const float* x = (*inputs)[1].data<float>();
  float* dx = (*outputs)[0].data<float>();
#pragma omp parallel for schedule(static) if (size > 4 * kClipChunk)
  for (int64_t first = 0; first < size; first += kClipChunk)
    clip_grad_chunk(dy + first, x + first, std::min(kClipChunk, size - first), a_min, a_max, dx + first);
  return MX_SUCCESS;
}

}  // namespace

REGISTER_OP(sample_fc_prelu)
    .setParseAttrs(parse_attrs)
    .setInferType(infer_type)
    .setInferShape(infer_shape)
    .setForward(forward, "cpu")
    .setBackward(backward, "cpu");

REGISTER_OP(sample_fc_group_conv3x3)
    .setParseAttrs(conv_parse_attrs)
    .setInferType(conv_infer_type)
    .setInferShape(conv_infer_shape)
    .setForward(conv_forward, "cpu")
    .setBackward(conv_backward, "cpu");

REGISTER_OP(sample_fc_attention)
    .setParseAttrs(attention_parse_attrs)
    .setInferType(attention_infer_type)
    .setInferShape(attention_infer_shape)
    .setForward(attention_forward, "cpu")
    .setBackward(attention_backward, "cpu");

REGISTER_OP(sample_fc_layer_norm)
    .setParseAttrs(ln_parse_attrs)
    .setInferType(ln_infer_type)
    .setInferShape(ln_infer_shape)
    .setForward(ln_forward, "cpu")
    .setBackward(ln_backward, "cpu");

REGISTER_OP(sample_fc_clip)
    .setParseAttrs(clip_parse_attrs)
    .setInferType(clip_infer_type)
    .setInferShape(clip_infer_shape)
    .setForward(clip_forward, "cpu")
    .setBackward(clip_backward, "cpu");

MXReturnValue initialize(int version) {
  if (version < 10700) {
    MX_ERROR_MSG << "sample_fc's operators need MXNet >= 1.7, found version " << version;
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
