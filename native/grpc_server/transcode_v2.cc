// transcode_v2.cc -- KServe v2's ModelInfer (transcode.h). Field numbers:
// protos/grpc_predict_v2.proto, protos/predict.proto.
#include "transcode.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "dtypes.h"
#include "eas_request.h"
#include "eas_response.h"
#include "fields.h"

namespace spg {

namespace {

struct V2Input {
  Span name;
  std::string datatype;
  std::vector<int64_t> shape;
};

int v2_dtype(const std::string& datatype) {
  static const struct { const char* name; int dtype; } kTypes[] = {
      {"FP32", kFloat}, {"FP64", kDouble}, {"INT32", kInt32}, {"UINT8", kUint8}, {"INT16", kInt16},
      {"INT8", kInt8}, {"BYTES", kString}, {"INT64", kInt64}, {"BOOL", kBool}, {"UINT16", kUint16},
      {"FP16", kHalf},
  };
  for (const auto& t : kTypes)
    if (datatype == t.name) return t.dtype;
  return 0;
}

const char* v2_datatype(int dtype) {
  switch (dtype) {
    case kFloat: return "FP32";
    case kDouble: return "FP64";
    case kInt32: return "INT32";
    case kUint8: return "UINT8";
    case kInt16: return "INT16";
    case kInt8: return "INT8";
    case kString: return "BYTES";
    case kInt64: return "INT64";
    case kBool: return "BOOL";
    case kUint16: return "UINT16";
    case kHalf: return "FP16";
    default: return nullptr;
  }
}

constexpr size_t kMaxRank = 32;  // open_inference.MAX_RANK

bool parse_v2_input(Span s, V2Input& in) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  bool named = false, typed = false;
  while (p < end) {
    uint32_t f, w;
    if (!sp::read_tag(p, end, f, w)) return false;
    if (f == 1) {
      if (w != sp::kLen || named || !sp::read_len(p, end, in.name) || !sp::is_ascii(in.name)) return false;
      named = true;
    } else if (f == 2) {
      if (!read_string(p, end, w, in.datatype, typed)) return false;
    } else if (f == 3) {
      if (!read_dims(p, end, w, in.shape)) return false;
    } else if (f == 4 || f == 5) {
      return false;  // parameters, typed contents: Python reads them
    } else if (!sp::skip_value(p, end, w)) {
      return false;
    }
  }
  return named && in.shape.size() <= kMaxRank;
}

}  // namespace

bool v2_infer_request(const uint8_t* data, size_t size, V2Request& out) {
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  bool named = false, versioned = false, identified = false;
  std::vector<V2Input> inputs;
  std::vector<Span> raws;
  std::string filter;
  while (p < end) {
    uint32_t field, wire;
    Span s;
    if (!sp::read_tag(p, end, field, wire)) return false;
    if (field >= 1 && field <= 7 && wire != sp::kLen) return false;
    switch (field) {
      case 1: if (!read_string(p, end, wire, out.model, named)) return false; break;
      case 2: if (!read_string(p, end, wire, out.version, versioned)) return false; break;
      case 3: if (!read_string(p, end, wire, out.id, identified)) return false; break;
      case 4: return false;  // parameters
      case 5: {
        V2Input in;
        if (!sp::read_len(p, end, s) || !parse_v2_input(s, in)) return false;
        inputs.push_back(std::move(in));
        break;
      }
      case 6: {  // outputs {name = 1, parameters = 2}
        if (!sp::read_len(p, end, s)) return false;
        std::string name;
        bool has_name = false;
        const uint8_t* q = s.p;
        while (q < s.p + s.n) {
          uint32_t f, w;
          if (!sp::read_tag(q, s.p + s.n, f, w)) return false;
          if (f == 1) {
            if (!read_string(q, s.p + s.n, w, name, has_name)) return false;
          } else if (f == 2 || !sp::skip_value(q, s.p + s.n, w)) {
            return false;
          }
        }
        if (name.empty()) return false;
        put_bytes(filter, 3, name);
        break;
      }
      case 7:
        if (!sp::read_len(p, end, s)) return false;
        raws.push_back(s);
        break;
      default:
        if (!sp::skip_value(p, end, wire)) return false;
    }
  }
  if (out.model.empty() || inputs.empty() || raws.size() != inputs.size()) return false;
  out.eas.reserve(size + size / 8 + 256);  // as tfs_predict_request's
  for (size_t i = 0; i < inputs.size(); ++i) {
    const V2Input& in = inputs[i];
    const int dtype = v2_dtype(in.datatype);
    size_t count;
    Values v;
    if (dtype == 0 || dtype == kHalf || !element_count(in.shape, count)) return false;
    if (dtype == kString) {
      v.kind = Values::kPrefixed;  // exactly `count` length-prefixed elements, ending at the end
      v.data = raws[i];
      v.count = count;
    } else if (raws[i].n != count * raw_width(dtype) || !raw_values(dtype, raws[i], count, v)) {
      return false;
    }
    if (!put_input(out.eas, in.name, dtype, in.shape, v)) return false;
  }
  out.eas += filter;
  return true;
}

bool v2_infer_response(const uint8_t* eas, size_t size, const std::string& model, const std::string& version,
                       const std::string& id, std::string& out) {
  std::vector<Array> outputs;
  if (!parse_response(eas, size, outputs)) return false;
  put_string_if(out, 1, model);
  put_string_if(out, 2, version);
  put_string_if(out, 3, id);
  std::string tensor;
  for (const Array& a : outputs) {
    const char* datatype = v2_datatype(a.dtype);
    if (datatype == nullptr) return false;
    tensor.clear();
    put_bytes(tensor, 1, a.key.p, a.key.n);
    put_bytes(tensor, 2, datatype, std::strlen(datatype));
    std::string dims = packed_dims(a.shape);
    if (!dims.empty()) put_bytes(tensor, 3, dims);
    put_bytes(out, 5, tensor);
  }
  std::string raw;
  for (const Array& a : outputs) {
    raw.clear();
    if (a.dtype == kString) {
      for (const Span& s : a.strings) {
        uint32_t n = uint32_t(s.n);
        raw.append(reinterpret_cast<const char*>(&n), 4);
        raw.append(reinterpret_cast<const char*>(s.p), s.n);
      }
    } else {
      raw_of(a, raw);
    }
    put_bytes(out, 6, raw);  // one entry per output, an empty one too
  }
  return true;
}

}  // namespace spg
