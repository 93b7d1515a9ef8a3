// ort_engine.cc -- see ort_engine.h.
#include "ort_engine.h"

#include <dlfcn.h>

#include <ctime>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "response.h"

namespace sp::ort {
namespace {

int64_t wall_ns() {  // OpenTelemetry's clock: time since the epoch
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct ApiBase {  // OrtApiBase: GetApi(version), GetVersionString()
  const void* const* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
};

std::mutex g_mutex;
const Api* g_api = nullptr;
std::string g_api_error;
Env* g_env = nullptr;  // one per process, never released (sessions may outlive any one engine)
bool g_env_global_pools = false;

// Throws on a failed status, releasing it.
void check(const Api* api, Status* st, const char* what) {
  if (st == nullptr) return;
  std::string msg = std::string(what) + ": " + api->call<GetErrorMessage>(st);
  api->call<ReleaseStatus>(st);
  throw std::runtime_error(msg);
}

// The process's environment, created by the first engine: with global thread pools if that one
// wanted them. `has_global` tells whether it has them (a later engine's sessions that want the
// global pools get pools of their own of the same sizes when it does not).
Env* environment(const Api* api, bool global_pools, int intra, int inter, bool& has_global) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_env != nullptr) {
    has_global = g_env_global_pools;
    return g_env;
  }
  if (global_pools) {
    ThreadingOptions* tp = nullptr;
    check(api, api->call<CreateThreadingOptions>(&tp), "CreateThreadingOptions");
    Status* st = api->call<SetGlobalIntraOpNumThreads>(tp, intra);
    if (!st) st = api->call<SetGlobalInterOpNumThreads>(tp, inter);
    if (!st) st = api->call<CreateEnvWithGlobalThreadPools>(kLogError, "serving_processor", tp, &g_env);
    api->call<ReleaseThreadingOptions>(tp);
    check(api, st, "CreateEnvWithGlobalThreadPools");
  } else {
    check(api, api->call<CreateEnv>(kLogError, "serving_processor", &g_env), "CreateEnv");
  }
  g_env_global_pools = has_global = global_pools;
  return g_env;
}

bool output_elem(int type, Elem& elem, int32_t& dtype) {
  switch (type) {
    case kFloat: elem = Elem::F32; dtype = DT_FLOAT; return true;
    case kDouble: elem = Elem::F64; dtype = DT_DOUBLE; return true;
    case kFloat16: elem = Elem::HALF; dtype = DT_HALF; return true;
    case kInt32: elem = Elem::I32; dtype = DT_INT32; return true;
    case kInt64: elem = Elem::I64; dtype = DT_INT64; return true;
    case kInt16: elem = Elem::I16; dtype = DT_INT16; return true;
    case kInt8: elem = Elem::I8; dtype = DT_INT8; return true;
    case kUint8: elem = Elem::U8; dtype = DT_UINT8; return true;
    case kUint16: elem = Elem::U16; dtype = DT_UINT16; return true;
    case kBool: elem = Elem::BOOL; dtype = DT_BOOL; return true;
    default: return false;  // strings, unsigned 32/64: the reference path encodes them
  }
}

// True for a successful call; a failure's status is released (its message is not needed).
bool succeeded(const Api* api, Status* st) {
  if (st == nullptr) return true;
  api->call<ReleaseStatus>(st);
  return false;
}

// Releases ONNX Runtime values at scope exit.
struct Values {
  const Api* api;
  std::vector<Value*> items;
  ~Values() {
    for (Value* v : items) api->call<ReleaseValue>(v);
  }
};

}  // namespace

int input_element_type(const InputSpec& spec) {
  if (spec.fingerprint) return kUint64;
  switch (spec.dtype) {
    case DT_FLOAT: return kFloat;
    case DT_DOUBLE: return kDouble;
    case DT_INT32: return kInt32;
    case DT_UINT8: return kUint8;
    case DT_INT16: return kInt16;
    case DT_INT8: return kInt8;
    case DT_UINT16: return kUint16;
    case DT_INT64: return kInt64;
    case DT_BOOL: return kBool;
    default: return 0;  // a plain string input: not taken
  }
}

const Api* load_api(const std::string& library, std::string& err) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_api == nullptr && g_api_error.empty()) {
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    auto* get_base = handle ? reinterpret_cast<const ApiBase* (*)()>(dlsym(handle, "OrtGetApiBase")) : nullptr;
    const ApiBase* base = get_base ? get_base() : nullptr;
    const void* const* table = base ? base->GetApi(kApiVersion) : nullptr;
    if (table == nullptr) {
      g_api_error = handle == nullptr ? std::string("cannot load ") + library + ": " + dlerror()
                  : base == nullptr   ? library + " has no OrtGetApiBase"
                                      : library + " does not offer C API version " + std::to_string(kApiVersion);
    } else {
      g_api = new Api(table);  // process lifetime, like the library
    }
  }
  err = g_api_error;
  return g_api;
}

Engine::Engine(const Api* api, const std::string& model_path, const std::vector<Parameter>& params,
               const std::vector<SessionSpec>& sessions, std::vector<int> lane_session,
               std::vector<std::string> input_names, std::vector<std::string> output_names,
               int global_intra, int global_inter)
    : api_(api), lane_session_(std::move(lane_session)), input_names_(std::move(input_names)),
      output_names_(std::move(output_names)) {
  try {
    bool global_pools = false;
    for (const SessionSpec& s : sessions) global_pools |= !s.per_session_threads;
    bool env_global = false;
    Env* env = environment(api, global_pools, global_intra, global_inter, env_global);
    check(api, api->call<CreateCpuMemoryInfo>(kArenaAllocator, kMemTypeDefault, &cpu_), "CreateCpuMemoryInfo");
    for (const Parameter& p : params) {
      Value* v = nullptr;
      check(api, api->call<CreateTensorWithDataAsOrtValue>(cpu_, p.data, p.bytes, p.shape.data(), p.shape.size(),
                                                           p.element_type, &v),
            "CreateTensorWithDataAsOrtValue");
      params_.push_back(v);
    }
    for (const SessionSpec& s : sessions) {
      SessionOptions* so = nullptr;
      check(api, api->call<CreateSessionOptions>(&so), "CreateSessionOptions");
      Status* st = api->call<SetSessionLogSeverityLevel>(so, kLogError);
      // The Python backend's settings: no private repacked weight copies, the same pools.
      if (!st) st = api->call<AddSessionConfigEntry>(so, "session.disable_prepacking", "1");
      if (!st && (s.per_session_threads || !env_global)) {
        st = api->call<SetIntraOpNumThreads>(so, s.per_session_threads ? s.intra_threads : global_intra);
        if (!st) st = api->call<SetInterOpNumThreads>(so, s.per_session_threads ? s.inter_threads : global_inter);
        if (!st && !s.affinities.empty())
          st = api->call<AddSessionConfigEntry>(so, "session.intra_op_thread_affinities", s.affinities.c_str());
      } else if (!st) {
        st = api->call<DisablePerSessionThreads>(so);
      }
      for (size_t i = 0; i < params.size() && !st; ++i)
        st = api->call<AddInitializer>(so, params[i].name.c_str(), params_[i]);
      if (!st && !s.cuda.empty()) {
        CUDAProviderOptionsV2* cuda = nullptr;
        st = api->call<CreateCUDAProviderOptions>(&cuda);
        std::vector<const char*> keys, values;
        for (const auto& kv : s.cuda) {
          keys.push_back(kv.first.c_str());
          values.push_back(kv.second.c_str());
        }
        if (!st) st = api->call<UpdateCUDAProviderOptions>(cuda, keys.data(), values.data(), keys.size());
        if (!st) st = api->call<AppendCudaV2>(so, cuda);
        if (cuda) api->call<ReleaseCUDAProviderOptions>(cuda);
      }
      Session* session = nullptr;
      if (!st) st = api->call<CreateSession>(env, model_path.c_str(), so, &session);
      api->call<ReleaseSessionOptions>(so);
      check(api, st, "CreateSession");
      sessions_.push_back(session);
    }
    for (int s : lane_session_)
      if (s < 0 || s >= int(sessions_.size())) throw std::runtime_error("lane maps to no session");
  } catch (...) {
    release();
    throw;
  }
}

Engine::~Engine() { release(); }

void Engine::release() {
  for (Session* s : sessions_) api_->call<ReleaseSession>(s);
  sessions_.clear();
  for (Value* v : params_) api_->call<ReleaseValue>(v);
  params_.clear();
  if (cpu_) api_->call<ReleaseMemoryInfo>(cpu_);
  cpu_ = nullptr;
}

Engine::Result Engine::serve(const Plan& plan, int lane, const uint8_t* data, size_t size,
                             std::string& out, std::string& error, Stamps* stamps) const {
  if (lane < 0 || lane >= lanes()) return Result::kNotTaken;
  if (stamps != nullptr) stamps->start = wall_ns();
  ParsedRequest req;
  if (!parse_request(data, size, plan, req)) return Result::kNotTaken;
  // Inputs the signature takes per row (first dimension free) must agree on their rows: a
  // request sending one of them as a single row for every row (a ranking request's context)
  // is answered by the Python path, which broadcasts it exactly (processor/context).
  int64_t rows = -1;
  for (const ParsedInput& in : req.inputs) {
    const InputSpec& spec = plan.inputs[in.spec];
    if (!spec.has_shape || spec.shape.empty() || spec.shape[0] != -1 || in.shape.empty()) continue;
    if (rows < 0) rows = in.shape[0];
    else if (in.shape[0] != rows) return Result::kNotTaken;
  }

  const size_t n_in = req.inputs.size();
  // Input buffers are the calling thread's, reused request after request: no allocation and no
  // page faults per request, and memory the cache has seen. They live until the next request on
  // this thread; ONNX Runtime reads them only inside Run below.
  // An input over kKeepBytes gets a buffer of its own instead, so that a thread does not keep
  // the memory of its largest request forever.
  constexpr size_t kKeepBytes = size_t(8) << 20;
  thread_local std::vector<std::vector<uint64_t>> scratch;
  if (scratch.size() < n_in) scratch.resize(n_in);
  std::vector<std::vector<uint64_t>> own(n_in);
  std::vector<const char*> in_names(n_in);
  Values inputs{api_, {}};
  inputs.items.reserve(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    const ParsedInput& in = req.inputs[i];
    const InputSpec& spec = plan.inputs[in.spec];
    int type = input_element_type(spec);
    if (type == 0) return Result::kNotTaken;
    size_t bytes = size_t(in.count) * value_itemsize(spec);
    std::vector<uint64_t>& buffer = bytes > kKeepBytes ? own[i] : scratch[i];  // 8-byte aligned
    if (buffer.size() < bytes / 8 + 1) buffer.resize(bytes / 8 + 1);
    if (!fill_values(plan, in, buffer.data(), data + size)) return Result::kNotTaken;
    Value* v = tensor(buffer.data(), bytes, in.shape, type);
    if (v == nullptr) return Result::kNotTaken;
    inputs.items.push_back(v);
    in_names[i] = input_names_[in.spec].c_str();
  }

  std::vector<int> fetch;
  if (!fetch_list(plan, req, fetch)) return Result::kNotTaken;
  Values outputs{api_, std::vector<Value*>(fetch.size(), nullptr)};
  if (stamps != nullptr) {
    stamps->decoded = wall_ns();
    stamps->rows = rows;
  }
  Result ran = run(lane, in_names.data(), inputs.items.data(), n_in, fetch, outputs.items, error);
  if (ran != Result::kOk) return ran;
  if (stamps != nullptr) stamps->ran = wall_ns();

  std::vector<Output> encoded(fetch.size());
  for (size_t k = 0; k < fetch.size(); ++k) {
    Output& o = encoded[k];
    o.key = output_key(plan, req, fetch, k);
    if (!describe(outputs.items[k], o)) return Result::kNotTaken;
  }
  size_t total = response_size(encoded);
  out.resize(total);
  write_response(encoded, reinterpret_cast<uint8_t*>(out.data()));
  if (stamps != nullptr) stamps->encoded = wall_ns();
  return Result::kOk;
}

Value* Engine::tensor(void* data, size_t bytes, const std::vector<int64_t>& shape, int type) const {
  Value* v = nullptr;
  Status* st = api_->call<CreateTensorWithDataAsOrtValue>(cpu_, data, bytes, shape.data(), shape.size(), type, &v);
  return succeeded(api_, st) ? v : nullptr;
}

void Engine::release(Value* v) const {
  if (v != nullptr) api_->call<ReleaseValue>(v);
}

Engine::Result Engine::run(int lane, const char* const* in_names, Value* const* inputs, size_t n_in,
                           const std::vector<int>& fetch, std::vector<Value*>& outputs,
                           std::string& error) const {
  if (lane < 0 || lane >= lanes()) return Result::kNotTaken;
  std::vector<const char*> out_names(fetch.size());
  for (size_t k = 0; k < fetch.size(); ++k) out_names[k] = output_names_[fetch[k]].c_str();
  outputs.assign(fetch.size(), nullptr);
  Status* st = api_->call<Run>(sessions_[lane_session_[lane]], nullptr, in_names, inputs, n_in,
                               out_names.data(), out_names.size(), outputs.data());
  if (st) {
    error = api_->call<GetErrorMessage>(st);
    api_->call<ReleaseStatus>(st);
    return Result::kEngineError;
  }
  return Result::kOk;
}

bool Engine::describe(Value* v, Output& o) const {
  TensorTypeAndShapeInfo* info = nullptr;
  if (!succeeded(api_, api_->call<GetTensorTypeAndShape>(v, &info))) return false;
  int type = 0;
  size_t ndim = 0, count = 0;
  bool ok = succeeded(api_, api_->call<GetTensorElementType>(info, &type)) &&
            succeeded(api_, api_->call<GetDimensionsCount>(info, &ndim));
  if (ok) {
    o.shape.resize(ndim);
    ok = succeeded(api_, api_->call<GetDimensions>(info, o.shape.data(), ndim)) &&
         succeeded(api_, api_->call<GetTensorShapeElementCount>(info, &count));
  }
  api_->call<ReleaseTensorTypeAndShapeInfo>(info);
  void* ptr = nullptr;
  if (!ok || !output_elem(type, o.elem, o.dtype) || !succeeded(api_, api_->call<GetTensorMutableData>(v, &ptr)))
    return false;
  o.data = ptr;
  o.count = count;
  return true;
}

}  // namespace sp::ort
