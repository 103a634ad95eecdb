// com.lara::LaraAttention as an onnxruntime custom-op library, backed by the fused CPU kernel.
//
// Built together with lara_cpu.cpp into one shared library (kernels/ort_library.py) and
// loaded with SessionOptions.register_custom_ops_library. onnxruntime then runs this kernel for every
// LaraAttention node on the CPU execution provider instead of inlining the node's ONNX function body,
// so exported models need no change; without the library the body runs as before.
//
// Only the plain C API is used (no C++ wrapper): it is ABI-stable, and asking for API version 22 lets
// the library load on every onnxruntime this project accepts (>= 1.22), whatever header it was built with.
//
// Inputs (see kernels/onnx_export.py): q, k, v [B, H, N, D] float32; q_landmarks, k_landmarks
// [B or 1, H, C, D]; key_padding_mask bool [B, N] or [1, 1]; noise [B or 1, H, C, D] or [1, 1, 1, 1];
// attribute alpha_coeff. Output [B, H, N, D] float32. Other element types are not registered, so a
// model in another dtype would not match this kernel (the exported models are float32).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "onnxruntime_c_api.h"

extern "C" int lara_cpu_forward_with(int64_t B, int64_t H, int64_t N, int64_t D, int64_t C, const float* q,
                                     const float* k, const float* v, const int64_t* strides, const float* ql,
                                     const float* kl, const float* noise, int64_t noise_bstride,
                                     const uint8_t* mask, float alpha_coeff, float* out, int num_threads,
                                     int force_generic, void (*par)(void*, void (*)(void*, size_t), size_t, void*),
                                     void* runner);

namespace {

constexpr uint32_t kApiVersion = 22;  // onnxruntime 1.22, the oldest pyproject.toml accepts (ParallelFor: 1.17)
constexpr size_t kInputs = 7;

const OrtApi* g_api = nullptr;

struct Kernel {
  float alpha_coeff = 1.0f;
};

// The kernel's tasks run on onnxruntime's own intra-op thread pool (KernelContext_ParallelFor), not on
// OpenMP threads: two pools on the same cores spin against each other (in a probe, the text model at 1 KB
// took 21 ms with OpenMP threads beside onnxruntime's, against 7 ms for the function body). One batch per
// task gives dynamic scheduling.
void ort_parallel_for(void* runner, void (*fn)(void*, size_t), size_t total, void* data) {
  OrtStatus* s = g_api->KernelContext_ParallelFor(static_cast<const OrtKernelContext*>(runner), fn, total, total, data);
  if (s != nullptr) {  // no pool to run on: run the tasks here, in order
    g_api->ReleaseStatus(s);
    for (size_t i = 0; i < total; ++i) fn(data, i);
  }
}

// A failed C API call becomes the kernel's error status (never a crash inside onnxruntime).
#define LARA_TRY(expr)                  \
  do {                                  \
    OrtStatus* _s = (expr);             \
    if (_s != nullptr) return _s;       \
  } while (0)

OrtStatus* fail(const std::string& msg) { return g_api->CreateStatus(ORT_INVALID_ARGUMENT, msg.c_str()); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// One input's data and shape. Element types need no check: onnxruntime matches the node to this kernel
// only when they are the registered ones (float32, and bool for the mask).
struct Input {
  const void* data = nullptr;
  std::vector<int64_t> shape;
};

OrtStatus* read_input(OrtKernelContext* ctx, size_t i, Input* in) {
  const OrtValue* value = nullptr;
  LARA_TRY(g_api->KernelContext_GetInput(ctx, i, &value));
  OrtTensorTypeAndShapeInfo* info = nullptr;
  LARA_TRY(g_api->GetTensorTypeAndShape(value, &info));
  size_t rank = 0;
  OrtStatus* s = g_api->GetDimensionsCount(info, &rank);
  if (s == nullptr) {
    in->shape.resize(rank);
    s = g_api->GetDimensions(info, in->shape.data(), rank);
  }
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  if (s != nullptr) return s;
  void* data = nullptr;
  // The C API of 1.22 has no const accessor; the data is only read.
  LARA_TRY(g_api->GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  in->data = data;
  return nullptr;
}

// Copies a [1, H, C, D] tensor B times (landmarks given once for the whole batch).
const float* per_batch(const Input& t, int64_t B, std::vector<float>* store) {
  const int64_t each = t.shape[1] * t.shape[2] * t.shape[3];
  if (t.shape[0] == B) return static_cast<const float*>(t.data);
  store->resize(static_cast<size_t>(B * each));
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(store->data() + b * each, t.data, static_cast<size_t>(each) * sizeof(float));
  return store->data();
}

OrtStatus* ORT_API_CALL compute(void* op_kernel, OrtKernelContext* ctx) {
  const Kernel* kernel = static_cast<const Kernel*>(op_kernel);
  Input in[kInputs];
  for (size_t i = 0; i < kInputs; ++i) LARA_TRY(read_input(ctx, i, &in[i]));
  const Input &q = in[0], &k = in[1], &v = in[2], &ql = in[3], &kl = in[4], &mask = in[5], &noise = in[6];
  if (q.shape.size() != 4) return fail("LaraAttention: q must be [B, H, N, D], got " + shape_str(q.shape));
  const int64_t B = q.shape[0], H = q.shape[1], N = q.shape[2], D = q.shape[3];
  if (k.shape != q.shape || v.shape != q.shape)
    return fail("LaraAttention: q, k, v must share one shape [B, H, N, D]; got " + shape_str(q.shape) + ", " +
                shape_str(k.shape) + ", " + shape_str(v.shape));
  if (ql.shape.size() != 4 || ql.shape != kl.shape || (ql.shape[0] != B && ql.shape[0] != 1) || ql.shape[1] != H ||
      ql.shape[3] != D || ql.shape[2] < 1)
    return fail("LaraAttention: landmarks must be [B or 1, H, C, D] with q " + shape_str(q.shape) + "; got " +
                shape_str(ql.shape) + " and " + shape_str(kl.shape));
  const int64_t C = ql.shape[2];

  // Key padding: [B, N] is used as it is (bool is one byte, 0 or 1); [1, 1] broadcasts one flag.
  const uint8_t* mask_ptr = nullptr;
  std::vector<uint8_t> mask_store;
  if (mask.shape == std::vector<int64_t>{B, N}) {
    mask_ptr = static_cast<const uint8_t*>(mask.data);
  } else if (mask.shape == std::vector<int64_t>{1, 1}) {
    if (*static_cast<const uint8_t*>(mask.data)) {
      mask_store.assign(static_cast<size_t>(B * N), 1);
      mask_ptr = mask_store.data();
    }
  } else {
    return fail("LaraAttention: key_padding_mask must be [B, N] = " + shape_str({B, N}) + " or [1, 1]; got " +
                shape_str(mask.shape));
  }

  // Noise: [B or 1, H, C, D], or [1, 1, 1, 1] (eval passes one zero, which is the same as no noise).
  const float* noise_ptr = nullptr;
  int64_t noise_bstride = 0;
  std::vector<float> noise_store;
  if (noise.shape == std::vector<int64_t>{1, 1, 1, 1}) {
    const float z = *static_cast<const float*>(noise.data);
    if (z != 0.0f) {
      noise_store.assign(static_cast<size_t>(H * C * D), z);
      noise_ptr = noise_store.data();
    }
  } else if (noise.shape.size() == 4 && (noise.shape[0] == B || noise.shape[0] == 1) && noise.shape[1] == H &&
             noise.shape[2] == C && noise.shape[3] == D) {
    noise_ptr = static_cast<const float*>(noise.data);
    noise_bstride = noise.shape[0] == 1 ? 0 : H * C * D;
  } else {
    return fail("LaraAttention: noise must be [B or 1, H, C, D] = " + shape_str({B, H, C, D}) +
                " or [1, 1, 1, 1]; got " + shape_str(noise.shape));
  }

  std::vector<float> ql_store, kl_store;
  const float* qlp = per_batch(ql, B, &ql_store);
  const float* klp = per_batch(kl, B, &kl_store);

  OrtValue* out_value = nullptr;
  LARA_TRY(g_api->KernelContext_GetOutput(ctx, 0, q.shape.data(), q.shape.size(), &out_value));
  void* out = nullptr;
  LARA_TRY(g_api->GetTensorMutableData(out_value, &out));
  if (B * H * N == 0) return nullptr;
  const int64_t strides[9] = {H * N * D, N * D, D, H * N * D, N * D, D, H * N * D, N * D, D};
  const int rc = lara_cpu_forward_with(B, H, N, D, C, static_cast<const float*>(q.data),
                                       static_cast<const float*>(k.data), static_cast<const float*>(v.data), strides,
                                       qlp, klp, noise_ptr, noise_bstride, mask_ptr, kernel->alpha_coeff,
                                       static_cast<float*>(out), 1, 0, ort_parallel_for, ctx);
  if (rc != 0) return fail("LaraAttention: the fused kernel refused sizes " + shape_str(q.shape) + ", C " +
                           std::to_string(C) + " (code " + std::to_string(rc) + ")");
  return nullptr;
}

OrtStatus* ORT_API_CALL create_kernel(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** out) {
  Kernel* kernel = new Kernel();
  float alpha = 1.0f;
  OrtStatus* s = api->KernelInfoGetAttribute_float(info, "alpha_coeff", &alpha);
  if (s == nullptr) {
    kernel->alpha_coeff = alpha;
  } else {
    api->ReleaseStatus(s);  // attribute absent: the schema's default, 1.0
  }
  *out = kernel;
  return nullptr;
}

void ORT_API_CALL destroy_kernel(void* op_kernel) { delete static_cast<Kernel*>(op_kernel); }

const char* ORT_API_CALL op_name(const OrtCustomOp*) { return "LaraAttention"; }
const char* ORT_API_CALL op_provider(const OrtCustomOp*) { return "CPUExecutionProvider"; }
size_t ORT_API_CALL input_count(const OrtCustomOp*) { return kInputs; }
size_t ORT_API_CALL output_count(const OrtCustomOp*) { return 1; }
ONNXTensorElementDataType ORT_API_CALL input_type(const OrtCustomOp*, size_t i) {
  return i == 5 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
ONNXTensorElementDataType ORT_API_CALL output_type(const OrtCustomOp*, size_t) {
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL required(const OrtCustomOp*, size_t) {
  return INPUT_OUTPUT_REQUIRED;
}
OrtMemType ORT_API_CALL input_memory(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL start_version(const OrtCustomOp*) { return 1; }
int ORT_API_CALL end_version(const OrtCustomOp*) { return 1; }

OrtCustomOp make_op() {
  OrtCustomOp op;
  std::memset(&op, 0, sizeof(op));  // every callback this version does not use stays null
  op.version = kApiVersion;
  op.GetName = op_name;
  op.GetExecutionProviderType = op_provider;
  op.GetInputType = input_type;
  op.GetInputTypeCount = input_count;
  op.GetOutputType = output_type;
  op.GetOutputTypeCount = output_count;
  op.KernelDestroy = destroy_kernel;
  op.GetInputCharacteristic = required;
  op.GetOutputCharacteristic = required;
  op.GetInputMemoryType = input_memory;
  op.CreateKernelV2 = create_kernel;
  op.KernelComputeV2 = compute;
  op.GetStartVersion = start_version;
  op.GetEndVersion = end_version;
  return op;
}

const OrtCustomOp g_op = make_op();

}  // namespace

extern "C" {

// The entry point onnxruntime calls for register_custom_ops_library. One domain object per session
// options; onnxruntime keeps a pointer to it for the sessions' lifetime, so it is never released.
OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(kApiVersion);
  if (api == nullptr) return nullptr;  // cannot even build a status; onnxruntime older than 1.22
  g_api = api;
  OrtCustomOpDomain* domain = nullptr;
  LARA_TRY(api->CreateCustomOpDomain("com.lara", &domain));
  LARA_TRY(api->CustomOpDomain_Add(domain, &g_op));
  return api->AddCustomOpDomain(options, domain);
}

// Lets the loader check it has this file's ABI (a cached library from an older source is rebuilt).
int lara_ort_op_abi_version() { return 1; }

}  // extern "C"
