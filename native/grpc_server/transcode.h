// transcode.h -- TF Serving's Predict and KServe v2's ModelInfer, byte for byte into our
// PredictRequest (tensorflow.eas, protos/predict.proto) and our PredictResponse back, so that the
// native gRPC server queues them on the direct path as it queues our own Predict (issue 50).
//
// The request side takes the plain form only and answers false ("not taken": the call goes to
// the Python handlers, which give the answer or the exact error) for anything else: a version or
// label named, request parameters, typed v2 contents, a TensorProto whose values do not fill its
// shape (TensorFlow's broadcast of one value included), dtypes the direct path does not run
// (half, bfloat16, complex, unsigned 32/64-bit, resources, variants), unknown rank, repeated
// singular fields, malformed wire data. What it takes it converts exactly: raw little-endian
// numbers (tensor_content, raw_input_contents) become packed fields, typed TensorProto fields
// keep their payload under our field numbers; it checks nothing against the signature (the queue's
// own decoder does, and hands a request it cannot take back: then Python answers it).
//
// The response side writes what the Python handlers write for the same outputs
// (server/tfserving/grpc_service.py and tensor_proto.from_numpy; server/kserve/grpc_service.py
// and open_inference.raw_bytes), from the PredictResponse the queue encoded
// (native/src/response.cc: one packed field per numeric output, float16 widened to float_val).
//
// Pure functions of their arguments: thread-safe, no Python, no allocation beyond `out`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace spg {

// A TF Serving PredictRequest (tensorflow.serving, predict.proto) of the plain form.
struct TfsRequest {
  std::string model;      // model_spec.name
  std::string signature;  // model_spec.signature_name ("": the default)
  std::string eas;        // the same request as our PredictRequest
};
bool tfs_predict_request(const uint8_t* data, size_t size, TfsRequest& out);

// Our PredictResponse `eas` as TF Serving's PredictResponse: outputs in their typed fields, or,
// with `tensor_content` (the model's enable_serialization_as_tensor_content), numbers as
// tensor_content; model_spec {name, version, signature_name}. False: a form the queue's encoder
// does not write.
bool tfs_predict_response(const uint8_t* eas, size_t size, const std::string& model, int64_t version,
                          const std::string& signature, bool tensor_content, std::string& out);

// A KServe v2 ModelInferRequest (grpc_predict_v2.proto) of raw contents.
struct V2Request {
  std::string model, version, id;  // model_name, model_version ("": the default), id
  std::string eas;
};
bool v2_infer_request(const uint8_t* data, size_t size, V2Request& out);

// Our PredictResponse as a ModelInferResponse of raw_output_contents.
bool v2_infer_response(const uint8_t* eas, size_t size, const std::string& model, const std::string& version,
                       const std::string& id, std::string& out);

}  // namespace spg
