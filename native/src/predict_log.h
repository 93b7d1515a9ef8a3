// predict_log.h -- a served wire call to the tail of a tensorflow.serving.PredictionLog record:
// the native twin of processor/prediction_log/transcode.py (the reference it is tested against;
// that module's doc says what is copied and why). No Python, thread-safe.
#pragma once

#include <string>
#include <unordered_map>

#include "wire.h"

namespace sp {

// Appends to `out` the PredictionLog field 6 (predict_log) holding `request`'s inputs (keys
// renamed through `aliases`; a key not in it fails) and output filter and `response`'s outputs,
// as TensorProto map entries. False (out unspecified) when the call holds anything the
// transcoder does not copy: the caller then writes the record through the decoding path.
bool predict_log_tail(Span request, Span response,
                      const std::unordered_map<std::string, std::string>& aliases, std::string& out);

}  // namespace sp
