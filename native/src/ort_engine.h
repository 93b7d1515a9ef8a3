// ort_engine.h -- whole requests on ONNX Runtime without Python: wire bytes in, wire bytes out.
//
// An Engine owns one ONNX Runtime session per lane, created through the C API of the runtime
// library the onnxruntime package ships (ort_api.h), over parameters the caller owns (numpy
// arrays of the Python backend, added as initializers: no copy, and in-place updates reach every
// session). serve() parses and checks a PredictRequest (request.h), runs it on a lane and writes
// the PredictResponse (response.h), all without touching Python, so the caller releases the GIL
// for the whole request. Thread-safe: any number of threads may serve on any lanes at once.
//
// GPU sessions get the CUDA execution provider with the options given
// (processor/engine/onnx/native_engine.py decides whether GPU lanes use the engine).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ort_api.h"
#include "request.h"
#include "response.h"

namespace sp::ort {

// dlopen()s the runtime library and takes its API table; once per process (later calls return
// the first result). nullptr with `err` set when it cannot.
const Api* load_api(const std::string& library, std::string& err);

// The ONNX Runtime element type an input is fed as (0: not one this path feeds, a plain string).
int input_element_type(const InputSpec& spec);

struct SessionSpec {
  bool per_session_threads = true;
  int intra_threads = 0;
  int inter_threads = 0;
  std::string affinities;  // session.intra_op_thread_affinities ("" = none)
  // CUDA execution provider options (key, value) for a GPU session; empty: CPU only.
  std::vector<std::pair<std::string, std::string>> cuda;
};

struct Parameter {
  std::string name;
  void* data = nullptr;  // owned by the caller, alive as long as the engine
  size_t bytes = 0;
  std::vector<int64_t> shape;
  int element_type = 0;  // ElementType
};

class Engine {
 public:
  enum class Result { kOk, kNotTaken, kEngineError };

  // Throws std::runtime_error naming what failed. `global_intra` / `global_inter`: the sizes of
  // the process-wide pools, used if this is the first engine and a session wants them.
  Engine(const Api* api, const std::string& model_path, const std::vector<Parameter>& params,
         const std::vector<SessionSpec>& sessions, std::vector<int> lane_session,
         std::vector<std::string> input_names, std::vector<std::string> output_names,
         int global_intra, int global_inter);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // kOk: `out` holds the PredictResponse. kNotTaken: the request is not one this path takes
  // (invalid, rare wire forms, outputs of other types): the caller runs the reference path.
  // kEngineError: ONNX Runtime refused it (`error` says why); the caller's reference path
  // reports it. `plan` is the request plan of the same signature (inputs and outputs in the
  // order of input_names / output_names).
  // `stamps` (optional, for a traced request's spans): when its stages ended, in nanoseconds
  // since the epoch (CLOCK_REALTIME, OpenTelemetry's clock), and the request's rows.
  struct Stamps {
    int64_t start = 0, decoded = 0, ran = 0, encoded = 0;
    int64_t rows = -1;  // -1: no input is per row
  };
  Result serve(const Plan& plan, int lane, const uint8_t* data, size_t size, std::string& out,
               std::string& error, Stamps* stamps = nullptr) const;

  int lanes() const { return int(lane_session_.size()); }
  int inputs() const { return int(input_names_.size()); }
  int outputs() const { return int(output_names_.size()); }

  // The pieces of serve(), for the batcher (batcher.h). A tensor over caller memory (nullptr
  // on failure; release() it); a run of the outputs `fetch` (indices into output_names) on a
  // lane, the outputs released by the caller; an output described for the response writer (false
  // for a type the writer does not take).
  Value* tensor(void* data, size_t bytes, const std::vector<int64_t>& shape, int type) const;
  void release(Value* v) const;
  Result run(int lane, const char* const* in_names, Value* const* inputs, size_t n_in,
             const std::vector<int>& fetch, std::vector<Value*>& outputs, std::string& error) const;
  bool describe(Value* v, Output& o) const;
  const std::string& input_name(int spec) const { return input_names_[spec]; }

 private:
  void release();

  const Api* api_;
  std::vector<Value*> params_;
  std::vector<Session*> sessions_;
  std::vector<int> lane_session_;
  std::vector<std::string> input_names_, output_names_;
  MemoryInfo* cpu_ = nullptr;
};

}  // namespace sp::ort
