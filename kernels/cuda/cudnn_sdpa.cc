#include "kernels/cuda/cudnn_sdpa.h"

#include <algorithm>
#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/sdpa_io_kernels.h"

#ifdef IRIS_HAVE_CUDNN
#include <cudnn.h>
#include <dlfcn.h>

#include <type_traits>
#endif

namespace iris::kernels::cuda {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr size_t kCacheLimit = 64;  // plans kept; past it the cache starts again

int64_t Align(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Where each part lives in the buffer, in bytes from its start.
struct Layout {
  int64_t q = 0, k = 0, v = 0, o = 0, seq_len = 0, q_offsets = 0, kv_offsets = 0, bytes = 0;
};

Layout LayoutOf(int64_t rows, int64_t seqs, int q_heads, int kv_heads, int head_dim) {
  Layout l;
  const int64_t q_bytes = Align(rows * q_heads * head_dim * 2), kv_bytes = Align(rows * kv_heads * head_dim * 2);
  l.k = l.q + q_bytes;
  l.v = l.k + kv_bytes;
  l.o = l.v + kv_bytes;
  l.seq_len = l.o + q_bytes;
  l.q_offsets = l.seq_len + Align(seqs * 4);
  l.kv_offsets = l.q_offsets + Align((seqs + 1) * 4);
  l.bytes = l.kv_offsets + Align((seqs + 1) * 4);
  return l;
}

}  // namespace

int64_t CudnnSdpa::LengthBucket(int64_t max_seqlen) {
  int64_t b = 64;
  while (b < max_seqlen) b *= 2;
  return b;
}

bool CudnnSdpa::Takes(const AttentionArgs& a) {
  return a.bf16 && !a.causal && a.num_rows > 0 && a.q_begin == 0 && (a.q_end < 0 || a.q_end == a.num_rows) &&
         a.head_dim > 0 && a.head_dim <= kMaxHeadDim && a.head_dim % 8 == 0 && a.num_kv_heads > 0 &&
         a.num_heads % a.num_kv_heads == 0 && a.cu_seqlens.size() >= 2 && a.max_seqlen > 0;
}

#ifdef IRIS_HAVE_CUDNN

namespace {

// The variant pack's tensor ids.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kScale, kSeqLenQ, kSeqLenKv, kQOffsets, kKvOffsets };

// cuDNN's entry points, loaded when the "cudnn" attention is first chosen rather than linked: a
// binary starts (and serves with the flash kernel) where cuDNN is not installed.
struct CudnnApi {
  decltype(&cudnnGetVersion) GetVersion = nullptr;
  decltype(&cudnnGetErrorString) GetErrorString = nullptr;
  decltype(&cudnnCreate) Create = nullptr;
  decltype(&cudnnDestroy) Destroy = nullptr;
  decltype(&cudnnSetStream) SetStream = nullptr;
  decltype(&cudnnBackendCreateDescriptor) CreateDescriptor = nullptr;
  decltype(&cudnnBackendDestroyDescriptor) DestroyDescriptor = nullptr;
  decltype(&cudnnBackendSetAttribute) SetAttribute = nullptr;
  decltype(&cudnnBackendGetAttribute) GetAttribute = nullptr;
  decltype(&cudnnBackendFinalize) Finalize = nullptr;
  decltype(&cudnnBackendExecute) Execute = nullptr;
};

// The process's copy (loaded once, never unloaded), or why it could not be loaded.
absl::StatusOr<const CudnnApi*> LoadCudnn() {
  static const absl::StatusOr<const CudnnApi*> api = []() -> absl::StatusOr<const CudnnApi*> {
    void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      return absl::FailedPreconditionError(absl::StrCat("attention \"cudnn\": cannot load libcudnn.so.9 (",
                                                        why != nullptr ? why : "not found",
                                                        "); install cuDNN 9 or put it on LD_LIBRARY_PATH"));
    }
    auto* a = new CudnnApi;
    bool missing = false;
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      missing = missing || fn == nullptr;
    };
    load(a->GetVersion, "cudnnGetVersion");
    load(a->GetErrorString, "cudnnGetErrorString");
    load(a->Create, "cudnnCreate");
    load(a->Destroy, "cudnnDestroy");
    load(a->SetStream, "cudnnSetStream");
    load(a->CreateDescriptor, "cudnnBackendCreateDescriptor");
    load(a->DestroyDescriptor, "cudnnBackendDestroyDescriptor");
    load(a->SetAttribute, "cudnnBackendSetAttribute");
    load(a->GetAttribute, "cudnnBackendGetAttribute");
    load(a->Finalize, "cudnnBackendFinalize");
    load(a->Execute, "cudnnBackendExecute");
    if (missing) {
      delete a;
      return absl::FailedPreconditionError("attention \"cudnn\": libcudnn.so.9 lacks the backend API's entry points");
    }
    return a;
  }();
  return api;
}

const CudnnApi& Api() { return **LoadCudnn(); }  // after CudnnSdpa::Create succeeded

absl::Status CudnnStatus(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuDNN ", what, ": ", Api().GetErrorString(s)));
}

}  // namespace

struct CudnnSdpa::Handle {
  cudnnHandle_t handle = nullptr;
  ~Handle() {
    if (handle != nullptr) Api().Destroy(handle);
  }
};

// One execution plan and the descriptors it was built from (destroyed with it).
struct CudnnSdpa::Plan {
  std::vector<cudnnBackendDescriptor_t> owned;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace_bytes = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;  // the first failure while building
  const char* failed_at = "";

  ~Plan() {
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) Api().DestroyDescriptor(*it);
  }
  void Fail(cudnnStatus_t s, const char* what) {
    if (status == CUDNN_STATUS_SUCCESS && s != CUDNN_STATUS_SUCCESS) {
      status = s;
      failed_at = what;
    }
  }
  cudnnBackendDescriptor_t Create(cudnnBackendDescriptorType_t type, const char* what) {
    cudnnBackendDescriptor_t d = nullptr;
    if (status == CUDNN_STATUS_SUCCESS) Fail(Api().CreateDescriptor(type, &d), what);
    if (d != nullptr) owned.push_back(d);
    return d;
  }
  void Set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* values, const char* what) {
    if (status == CUDNN_STATUS_SUCCESS) Fail(Api().SetAttribute(d, name, type, count, values), what);
  }
  void Link(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value,
            const char* what) {
    Set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
  }
  void Finalize(cudnnBackendDescriptor_t d, const char* what) {
    if (status == CUDNN_STATUS_SUCCESS) Fail(Api().Finalize(d), what);
  }
  // A finalized tensor descriptor: dims and strides as cuDNN's [batch, heads, sequence, dim].
  cudnnBackendDescriptor_t Tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 4> dims,
                                  std::array<int64_t, 4> strides, bool by_value,
                                  cudnnBackendDescriptor_t ragged_offsets, const char* what) {
    cudnnBackendDescriptor_t d = Create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, what);
    const int64_t alignment = 16;
    const bool is_virtual = false;
    Set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, what);
    Set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, what);
    Set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), what);
    Set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), what);
    Set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, what);
    Set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, what);
    Set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, what);
    if (ragged_offsets != nullptr) Link(d, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, ragged_offsets, what);
    Finalize(d, what);
    return d;
  }
};

absl::StatusOr<std::unique_ptr<CudnnSdpa>> CudnnSdpa::Create(CudaDevice& device) {
  const absl::StatusOr<const CudnnApi*> api = LoadCudnn();
  if (!api.ok()) return api.status();
  const size_t version = (*api)->GetVersion();
  if (version < 91500) {
    return absl::FailedPreconditionError(absl::StrCat("attention \"cudnn\": the cuDNN loaded is version ", version,
                                                      "; its SDPA operation with sequence lengths needs 9.15 or later"));
  }
  auto handle = std::make_unique<Handle>();
  device.AttachThread();  // the handle belongs to the current GPU
  if (absl::Status s = CudnnStatus(Api().Create(&handle->handle), "cudnnCreate"); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("attention \"cudnn\": ", s.message()));
  }
  if (absl::Status s = CudnnStatus(Api().SetStream(handle->handle, device.stream()), "cudnnSetStream"); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("attention \"cudnn\": ", s.message()));
  }
  return std::unique_ptr<CudnnSdpa>(new CudnnSdpa(device, std::move(handle)));
}

CudnnSdpa::CudnnSdpa(CudaDevice& device, std::unique_ptr<Handle> handle)
    : device_(device), handle_(std::move(handle)) {}

CudnnSdpa::~CudnnSdpa() {
  plans_.clear();  // the plans' descriptors before the handle
}

absl::StatusOr<CudnnSdpa::Plan*> CudnnSdpa::PlanFor(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (plans_.size() >= kCacheLimit) plans_.clear();
  const auto [b, s, hq, hkv, d] = key;
  auto p = std::make_unique<Plan>();
  Plan& P = *p;
  // Packed rows: element (row, head, i) at row * heads * d + head * d + i; a sequence's rows
  // start at its ragged offset, so the batch stride is never used.
  auto rows_of = [&](int64_t uid, int64_t heads, cudnnBackendDescriptor_t offsets, const char* what) {
    return P.Tensor(uid, CUDNN_DATA_BFLOAT16, {b, heads, s, d}, {s * heads * d, d, heads * d, 1}, false, offsets,
                    what);
  };
  auto ints = [&](int64_t uid, int64_t n, const char* what) {
    return P.Tensor(uid, CUDNN_DATA_INT32, {n, 1, 1, 1}, {1, 1, 1, 1}, false, nullptr, what);
  };
  cudnnBackendDescriptor_t q_offsets = ints(kQOffsets, b + 1, "q offsets");
  cudnnBackendDescriptor_t kv_offsets = ints(kKvOffsets, b + 1, "k/v offsets");
  cudnnBackendDescriptor_t seq_len_q = ints(kSeqLenQ, b, "q lengths");
  cudnnBackendDescriptor_t seq_len_kv = ints(kSeqLenKv, b, "k/v lengths");
  cudnnBackendDescriptor_t scale =
      P.Tensor(kScale, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, true, nullptr, "scale");
  cudnnBackendDescriptor_t op = P.Create(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, "SDPA operation");
  P.Link(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, rows_of(kQ, hq, q_offsets, "q"), "SDPA q");
  P.Link(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, rows_of(kK, hkv, kv_offsets, "k"), "SDPA k");
  P.Link(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, rows_of(kV, hkv, kv_offsets, "v"), "SDPA v");
  P.Link(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, rows_of(kO, hq, q_offsets, "output"), "SDPA output");
  P.Link(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale, "SDPA scale");
  P.Link(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC, seq_len_q, "SDPA q lengths");
  P.Link(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_KVDESC, seq_len_kv, "SDPA k/v lengths");
  P.Finalize(op, "SDPA operation");
  cudnnBackendDescriptor_t graph = P.Create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  P.Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op, "operation graph");
  P.Set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_->handle, "operation graph");
  P.Finalize(graph, "operation graph");
  cudnnBackendDescriptor_t heuristics = P.Create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  P.Link(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics");
  P.Set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics");
  P.Finalize(heuristics, "heuristics");
  int64_t count = 0;
  if (P.status == CUDNN_STATUS_SUCCESS) {
    P.Fail(Api().GetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                    &count, nullptr),
           "heuristics results");
  }
  std::vector<cudnnBackendDescriptor_t> configs(static_cast<size_t>(std::max<int64_t>(count, 0)));
  for (auto& c : configs) c = P.Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
  if (P.status == CUDNN_STATUS_SUCCESS && count > 0) {
    P.Fail(Api().GetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                    &count, configs.data()),
           "heuristics results");
  }
  // The first config (in the heuristics' order) whose plan finalizes.
  for (int64_t i = 0; i < count && P.status == CUDNN_STATUS_SUCCESS && P.plan == nullptr; ++i) {
    cudnnBackendDescriptor_t candidate = P.Create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
    P.Link(candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[i], "execution plan");
    if (P.status == CUDNN_STATUS_SUCCESS && Api().Finalize(candidate) == CUDNN_STATUS_SUCCESS) P.plan = candidate;
  }
  if (P.status != CUDNN_STATUS_SUCCESS) return CudnnStatus(P.status, P.failed_at);
  if (P.plan == nullptr) {
    return absl::UnimplementedError(absl::StrCat("cuDNN has no SDPA plan for ", b, " sequences of up to ", s,
                                                 " rows, ", hq, "/", hkv, " heads x ", d, " (", count,
                                                 " engine configs tried)"));
  }
  if (absl::Status st = CudnnStatus(Api().GetAttribute(P.plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                             CUDNN_TYPE_INT64, 1, nullptr, &P.workspace_bytes),
                                    "workspace size");
      !st.ok()) {
    return st;
  }
  ++plans_built_;
  Plan* raw = p.get();
  plans_[key] = std::move(p);
  return raw;
}

absl::Status CudnnSdpa::Reserve(int64_t buffer_bytes, int64_t workspace_bytes) {
  const int64_t held = static_cast<int64_t>(buffer_.nbytes());
  if (held < buffer_bytes) {
    // Grown by doubling, as the rows of successive forwards climb.
    const int64_t grown = std::max(buffer_bytes, 2 * held);
    absl::StatusOr<core::Tensor> t = device_.Allocate(core::DType::kU8, {grown});
    if (!t.ok()) return t.status();
    buffer_ = std::move(*t);
  }
  if (static_cast<int64_t>(workspace_.nbytes()) < workspace_bytes) {
    absl::StatusOr<core::Tensor> t = device_.Allocate(core::DType::kU8, {workspace_bytes});
    if (!t.ok()) return t.status();
    workspace_ = std::move(*t);
  }
  return absl::OkStatus();
}

void CudnnSdpa::Run(const AttentionArgs& a) {
  const int64_t b = static_cast<int64_t>(a.cu_seqlens.size()) - 1, rows = a.num_rows;
  const int hq = a.num_heads, hkv = a.num_kv_heads, d = a.head_dim;
  absl::StatusOr<Plan*> plan = PlanFor(Key{b, LengthBucket(a.max_seqlen), hq, hkv, d});
  if (!plan.ok()) return device_.Report(plan.status());
  const Layout l = LayoutOf(rows, b, hq, hkv, d);
  if (absl::Status s = Reserve(l.bytes, std::max<int64_t>((*plan)->workspace_bytes, 1)); !s.ok()) {
    return device_.Report(s);
  }
  char* base = buffer_.data<char>();
  auto at = [&](int64_t offset) { return base + offset; };
  uint16_t* q = reinterpret_cast<uint16_t*>(at(l.q));
  uint16_t* k = reinterpret_cast<uint16_t*>(at(l.k));
  uint16_t* v = reinterpret_cast<uint16_t*>(at(l.v));
  uint16_t* o = reinterpret_cast<uint16_t*>(at(l.o));
  int32_t* seq_len = reinterpret_cast<int32_t*>(at(l.seq_len));
  int32_t* q_offsets = reinterpret_cast<int32_t*>(at(l.q_offsets));
  int32_t* kv_offsets = reinterpret_cast<int32_t*>(at(l.kv_offsets));
  CUstream_st* stream = device_.stream();
  device_.Check(LaunchSdpaMeta(stream, a.cu_seqlens.data(), static_cast<int>(b), hq * d, hkv * d, seq_len, q_offsets,
                               kv_offsets),
                "SDPA metadata");
  device_.Check(LaunchSdpaPack(stream, {a.q.data, a.q.row_stride, a.q.head_stride},
                               {a.k.data, a.k.row_stride, a.k.head_stride},
                               {a.v.data, a.v.row_stride, a.v.head_stride}, rows, hq, hkv, d, q, k, v),
                "SDPA pack");
  float scale = a.scale;
  const std::array<int64_t, 9> uids = {kQ, kK, kV, kO, kScale, kSeqLenQ, kSeqLenKv, kQOffsets, kKvOffsets};
  std::array<void*, 9> pointers = {q, k, v, o, &scale, seq_len, seq_len, q_offsets, kv_offsets};
  void* workspace = workspace_.data<void>();
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t s = Api().CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (s == CUDNN_STATUS_SUCCESS) {
    s = Api().SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.size(), uids.data());
  }
  if (s == CUDNN_STATUS_SUCCESS) {
    s = Api().SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers.size(),
                                 pointers.data());
  }
  if (s == CUDNN_STATUS_SUCCESS) {
    s = Api().SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  }
  if (s == CUDNN_STATUS_SUCCESS) s = Api().Finalize(pack);
  if (s == CUDNN_STATUS_SUCCESS) s = Api().Execute(handle_->handle, (*plan)->plan, pack);
  if (pack != nullptr) Api().DestroyDescriptor(pack);
  if (s != CUDNN_STATUS_SUCCESS) return device_.Report(CudnnStatus(s, "SDPA execute"));
  device_.Check(LaunchSdpaUnpack(stream, o, rows, static_cast<int64_t>(hq) * d, a.out, a.out_row_stride),
                "SDPA unpack");
}

#else  // no cuDNN in this build

struct CudnnSdpa::Handle {};
struct CudnnSdpa::Plan {};

absl::StatusOr<std::unique_ptr<CudnnSdpa>> CudnnSdpa::Create(CudaDevice&) {
  return absl::FailedPreconditionError("attention \"cudnn\": this build found no cuDNN (cudnn.h, libcudnn)");
}
CudnnSdpa::CudnnSdpa(CudaDevice& device, std::unique_ptr<Handle> handle)
    : device_(device), handle_(std::move(handle)) {}
CudnnSdpa::~CudnnSdpa() = default;
absl::StatusOr<CudnnSdpa::Plan*> CudnnSdpa::PlanFor(const Key&) { return absl::UnimplementedError("no cuDNN"); }
absl::Status CudnnSdpa::Reserve(int64_t, int64_t) { return absl::UnimplementedError("no cuDNN"); }
void CudnnSdpa::Run(const AttentionArgs&) { device_.Report(absl::UnimplementedError("no cuDNN in this build")); }

#endif

}  // namespace iris::kernels::cuda
