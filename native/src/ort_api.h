// ort_api.h -- the part of ONNX Runtime's C API the native engine calls, declared here.
//
// ONNX Runtime's C API is a table of function pointers (OrtApi) returned by
// OrtGetApiBase()->GetApi(version). The table is append-only: an entry keeps its position in
// every later release, so calling entry N of the table obtained for version kApiVersion works
// with every runtime at least that new. Only the entries used are named below, by position,
// with their signatures; every object is opaque. The runtime is the `libonnxruntime.so` that
// the installed onnxruntime Python package ships (loaded with dlopen at run time), so nothing
// from ONNX Runtime is needed at build time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sp::ort {

// Version 13 (ONNX Runtime 1.13) has every entry used here; pyproject asks for >= 1.21.
constexpr uint32_t kApiVersion = 13;

struct Status;
struct Env;
struct Session;
struct SessionOptions;
struct Value;
struct MemoryInfo;
struct TensorTypeAndShapeInfo;
struct ThreadingOptions;
struct CUDAProviderOptionsV2;
struct RunOptions;

// ONNXTensorElementDataType
enum ElementType : int {
  kFloat = 1, kUint8 = 2, kInt8 = 3, kUint16 = 4, kInt16 = 5, kInt32 = 6, kInt64 = 7,
  kString = 8, kBool = 9, kFloat16 = 10, kDouble = 11, kUint32 = 12, kUint64 = 13,
};

enum ErrorCode : int { kOk = 0, kFail = 1, kInvalidArgument = 2 };

// (position in OrtApi, function type)
template <int Index, typename F>
struct Entry {
  static constexpr int index = Index;
  using type = F;
};

using CreateEnv = Entry<3, Status* (*)(int log_level, const char* logid, Env** out)>;
using CreateSession = Entry<7, Status* (*)(const Env*, const char* model_path, const SessionOptions*,
                                           Session** out)>;
using Run = Entry<9, Status* (*)(Session*, const RunOptions*, const char* const* input_names,
                                 const Value* const* inputs, size_t input_len,
                                 const char* const* output_names, size_t output_len, Value** outputs)>;
using CreateSessionOptions = Entry<10, Status* (*)(SessionOptions** out)>;
using SetSessionLogSeverityLevel = Entry<22, Status* (*)(SessionOptions*, int level)>;
using SetIntraOpNumThreads = Entry<24, Status* (*)(SessionOptions*, int)>;
using SetInterOpNumThreads = Entry<25, Status* (*)(SessionOptions*, int)>;
using CreateTensorWithDataAsOrtValue =
    Entry<49, Status* (*)(const MemoryInfo*, void* data, size_t data_len, const int64_t* shape,
                          size_t shape_len, int element_type, Value** out)>;
using GetTensorMutableData = Entry<51, Status* (*)(Value*, void** out)>;
using GetTensorElementType = Entry<60, Status* (*)(const TensorTypeAndShapeInfo*, int* out)>;
using GetDimensionsCount = Entry<61, Status* (*)(const TensorTypeAndShapeInfo*, size_t* out)>;
using GetDimensions = Entry<62, Status* (*)(const TensorTypeAndShapeInfo*, int64_t* dims, size_t len)>;
using GetTensorShapeElementCount = Entry<64, Status* (*)(const TensorTypeAndShapeInfo*, size_t* out)>;
using GetTensorTypeAndShape = Entry<65, Status* (*)(const Value*, TensorTypeAndShapeInfo** out)>;
using CreateCpuMemoryInfo = Entry<69, Status* (*)(int allocator_type, int mem_type, MemoryInfo** out)>;
using GetErrorCode = Entry<1, int (*)(const Status*)>;
using GetErrorMessage = Entry<2, const char* (*)(const Status*)>;
using ReleaseEnv = Entry<92, void (*)(Env*)>;
using ReleaseStatus = Entry<93, void (*)(Status*)>;
using ReleaseMemoryInfo = Entry<94, void (*)(MemoryInfo*)>;
using ReleaseSession = Entry<95, void (*)(Session*)>;
using ReleaseValue = Entry<96, void (*)(Value*)>;
using ReleaseTensorTypeAndShapeInfo = Entry<99, void (*)(TensorTypeAndShapeInfo*)>;
using ReleaseSessionOptions = Entry<100, void (*)(SessionOptions*)>;
using CreateEnvWithGlobalThreadPools =
    Entry<119, Status* (*)(int log_level, const char* logid, const ThreadingOptions*, Env** out)>;
using DisablePerSessionThreads = Entry<120, Status* (*)(SessionOptions*)>;
using CreateThreadingOptions = Entry<121, Status* (*)(ThreadingOptions** out)>;
using ReleaseThreadingOptions = Entry<122, void (*)(ThreadingOptions*)>;
using AddSessionConfigEntry = Entry<130, Status* (*)(SessionOptions*, const char* key, const char* value)>;
using SetGlobalIntraOpNumThreads = Entry<147, Status* (*)(ThreadingOptions*, int)>;
using SetGlobalInterOpNumThreads = Entry<148, Status* (*)(ThreadingOptions*, int)>;
using AddInitializer = Entry<150, Status* (*)(SessionOptions*, const char* name, const Value*)>;
using AppendCudaV2 = Entry<204, Status* (*)(SessionOptions*, const CUDAProviderOptionsV2*)>;
using CreateCUDAProviderOptions = Entry<205, Status* (*)(CUDAProviderOptionsV2** out)>;
using UpdateCUDAProviderOptions =
    Entry<206, Status* (*)(CUDAProviderOptionsV2*, const char* const* keys, const char* const* values,
                           size_t count)>;
using ReleaseCUDAProviderOptions = Entry<208, void (*)(CUDAProviderOptionsV2*)>;

constexpr int kArenaAllocator = 1;  // OrtAllocatorType
constexpr int kMemTypeDefault = 0;  // OrtMemType
constexpr int kLogError = 3;        // OrtLoggingLevel

// The loaded table. call<E>(args...) calls entry E.
class Api {
 public:
  explicit Api(const void* const* table) : table_(table) {}
  template <typename E, typename... A>
  auto call(A... args) const {
    return reinterpret_cast<typename E::type>(const_cast<void*>(table_[E::index]))(args...);
  }

 private:
  const void* const* table_;
};

}  // namespace sp::ort
