// transcode_tfs.cc -- TF Serving's Predict (transcode.h). Field numbers: TensorFlow's
// tensor.proto / tensor_shape.proto, TF Serving's predict.proto / model.proto, protos/predict.proto.
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

// --- TF Serving's TensorProto ---------------------------------------------------------------

struct Tensor {
  int dtype = 0;
  std::vector<int64_t> shape;
  Span content;
  Span typed[12];  // TensorProto fields 5 float, 6 double, 7 int, 10 int64, 11 bool
  bool seen[12] = {};
  std::vector<Span> strings;
  bool has_dtype = false, has_shape = false, has_content = false;
};

bool parse_shape(Span s, std::vector<int64_t>& dims) {
  const uint8_t* p = s.p;
  const uint8_t* end = s.p + s.n;
  while (p < end) {
    uint32_t field, wire;
    uint64_t v;
    if (!sp::read_tag(p, end, field, wire)) return false;
    if (field == 2 && wire == sp::kLen) {  // Dim {int64 size = 1; string name = 2}
      Span dim;
      if (!sp::read_len(p, end, dim)) return false;
      int64_t size = 0;
      const uint8_t* q = dim.p;
      const uint8_t* dim_end = dim.p + dim.n;
      while (q < dim_end) {
        uint32_t f, w;
        if (!sp::read_tag(q, dim_end, f, w)) return false;
        if (f == 1 && w == sp::kVarint) {
          if (!sp::read_varint(q, dim_end, v)) return false;
          size = int64_t(v);
        } else if (!sp::skip_value(q, dim_end, w)) {
          return false;
        }
      }
      dims.push_back(size);
    } else if (field == 3) {  // unknown_rank: the reference refuses it when set
      if (wire != sp::kVarint || !sp::read_varint(p, end, v) || v != 0) return false;
    } else if (!sp::skip_value(p, end, wire)) {
      return false;
    }
  }
  return true;
}

bool parse_tensor(Span t, Tensor& out) {
  const uint8_t* p = t.p;
  const uint8_t* end = t.p + t.n;
  while (p < end) {
    uint32_t field, wire;
    uint64_t v;
    Span s;
    if (!sp::read_tag(p, end, field, wire)) return false;
    switch (field) {
      case 1:  // dtype
        if (wire != sp::kVarint || out.has_dtype || !sp::read_varint(p, end, v) || v > 1000) return false;
        out.dtype = int(v), out.has_dtype = true;
        break;
      case 2:  // tensor_shape
        if (wire != sp::kLen || out.has_shape || !sp::read_len(p, end, s) || !parse_shape(s, out.shape)) return false;
        out.has_shape = true;
        break;
      case 4:  // tensor_content
        if (wire != sp::kLen || out.has_content || !sp::read_len(p, end, out.content)) return false;
        out.has_content = true;
        break;
      case 8:  // string_val
        if (wire != sp::kLen) return false;
        if (out.strings.empty() && out.has_shape) {  // one allocation; the shape comes first as written
          size_t count;
          if (element_count(out.shape, count)) out.strings.reserve(std::min(count, t.n / 2));  // 2+ bytes each
        }
        // read in place: a Span read into a local and copied in stalls on store forwarding (2 stores, 1 load)
        if (!sp::read_len(p, end, out.strings.emplace_back())) return false;
        break;
      case 5: case 6: case 7: case 10: case 11:  // packed numbers (unpacked: not taken)
        if (wire != sp::kLen || out.seen[field] || !sp::read_len(p, end, out.typed[field])) return false;
        out.seen[field] = true;
        break;
      case 3:  // version_number
        if (!sp::skip_value(p, end, wire)) return false;
        break;
      default:  // half, complex, resource, variant, unsigned 32/64-bit values; or unknown
        if (field <= 17) return false;
        if (!sp::skip_value(p, end, wire)) return false;
    }
  }
  return true;
}

// The TensorProto's value field for a dtype (typed form).
int tfs_field(int dtype) {
  switch (eas_field(dtype)) {
    case 3: return dtype == kHalf ? 13 : 5;
    case 4: return 6;
    case 5: return 7;
    case 6: return 8;
    case 7: return 10;
    case 8: return 11;
    default: return 0;
  }
}

// A TensorProto's values as our ArrayProto's (see the file comment for what is not taken).
bool tfs_values(const Tensor& t, Values& v) {
  size_t count;
  if (!element_count(t.shape, count)) return false;
  const int dtype = t.dtype;
  const bool content = t.has_content && t.content.n > 0;  // proto3: empty bytes are no content
  int typed_seen = 0;
  for (bool seen : t.seen) typed_seen += seen;
  if (dtype == kString) {
    if (content || typed_seen || t.strings.size() != count) return false;
    v.kind = Values::kStrings;
    v.strings = &t.strings;
    return true;
  }
  const size_t w = raw_width(dtype);
  if (w == 0 || dtype == kHalf || !t.strings.empty()) return false;
  if (content) {
    if (typed_seen || t.content.n != count * w) return false;
    return raw_values(dtype, t.content, count, v);
  }
  const int field = tfs_field(dtype);
  if (typed_seen > 1 || (typed_seen == 1 && !t.seen[field])) return false;
  const Span values = t.seen[field] ? t.typed[field] : Span{};
  size_t given;
  if (field == 5 || field == 6) {
    size_t fw = field == 5 ? 4 : 8;
    if (values.n % fw) return false;
    given = values.n / fw;
  } else if (!varint_count(values, given)) {
    return false;
  }
  if (given != count) return false;  // one value broadcast, or a wrong count: the reference's
  v.kind = Values::kPayload;  // the same payload under our field number
  v.data = values;
  return true;
}

}  // namespace

bool tfs_predict_request(const uint8_t* data, size_t size, TfsRequest& out) {
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  bool has_spec = false;
  std::string filter;
  out.eas.reserve(size + size / 8 + 256);  // raw int64 ids grow by ~1/8 as varints; one allocation
  while (p < end) {
    uint32_t field, wire;
    Span s;
    if (!sp::read_tag(p, end, field, wire)) return false;
    if (field >= 1 && field <= 3 && wire != sp::kLen) return false;
    if (field == 1) {  // model_spec
      if (has_spec || !sp::read_len(p, end, s)) return false;
      has_spec = true;
      bool named = false, signed_ = false;
      const uint8_t* q = s.p;
      const uint8_t* spec_end = s.p + s.n;
      while (q < spec_end) {
        uint32_t f, w;
        if (!sp::read_tag(q, spec_end, f, w)) return false;
        if (f == 1) {
          if (!read_string(q, spec_end, w, out.model, named)) return false;
        } else if (f == 3) {
          if (!read_string(q, spec_end, w, out.signature, signed_)) return false;
        } else if (f == 2 || f == 4) {
          return false;  // a version or label: Python resolves it
        } else if (!sp::skip_value(q, spec_end, w)) {
          return false;
        }
      }
    } else if (field == 2) {  // inputs: map<string, TensorProto>
      if (!sp::read_len(p, end, s)) return false;
      Span key, value;
      bool has_key = false, has_value = false;
      const uint8_t* q = s.p;
      const uint8_t* entry_end = s.p + s.n;
      while (q < entry_end) {
        uint32_t f, w;
        if (!sp::read_tag(q, entry_end, f, w) || w != sp::kLen || (f != 1 && f != 2)) return false;
        if ((f == 1 ? has_key : has_value)) return false;
        if (!sp::read_len(q, entry_end, f == 1 ? key : value)) return false;
        (f == 1 ? has_key : has_value) = true;
      }
      Tensor t;
      Values v;
      if (!has_key || !sp::is_ascii(key) || !parse_tensor(value, t) || !tfs_values(t, v) ||
          !put_input(out.eas, key, t.dtype, t.shape, v)) {
        return false;
      }
    } else if (field == 3) {  // output_filter
      if (!sp::read_len(p, end, s) || !sp::is_ascii(s)) return false;
      put_bytes(filter, 3, s.p, s.n);
    } else if (!sp::skip_value(p, end, wire)) {
      return false;
    }
  }
  if (out.model.empty()) return false;
  out.eas += filter;
  return true;
}

bool tfs_predict_response(const uint8_t* eas, size_t size, const std::string& model, int64_t version,
                          const std::string& signature, bool tensor_content, std::string& out) {
  std::vector<Array> outputs;
  if (!parse_response(eas, size, outputs)) return false;
  std::string tensor, shape, raw, entry;
  for (const Array& a : outputs) {
    tensor.clear();
    put_tag(tensor, 1, sp::kVarint);
    put_varint(tensor, uint64_t(a.dtype));
    if (!a.shape.empty()) {  // from_numpy adds no dim for a scalar: no tensor_shape then
      shape.clear();
      for (int64_t d : a.shape) {
        std::string dim;
        if (d != 0) {
          put_tag(dim, 1, sp::kVarint);
          put_varint(dim, uint64_t(d));
        }
        put_bytes(shape, 2, dim);
      }
      put_bytes(tensor, 2, shape);
    }
    if (a.dtype == kString) {
      for (const Span& s : a.strings) put_bytes(tensor, 8, s.p, s.n);
    } else if (tensor_content) {
      raw.clear();
      raw_of(a, raw);
      put_string_if(tensor, 4, raw);
    } else if (a.count) {
      if (a.dtype == kHalf) {  // half_val: each element's bits as an int32
        raw.clear();
        raw_of(a, raw);
        std::string bits;
        for (size_t i = 0; i < a.count; ++i) {
          uint16_t h;
          std::memcpy(&h, raw.data() + 2 * i, 2);
          put_varint(bits, h);
        }
        put_bytes(tensor, 13, bits);
      } else {
        put_bytes(tensor, uint32_t(tfs_field(a.dtype)), a.values.p, a.values.n);  // same payload
      }
    }
    entry.clear();
    put_bytes(entry, 1, a.key.p, a.key.n);
    put_bytes(entry, 2, tensor);
    put_bytes(out, 1, entry);
  }
  std::string spec, number;
  put_string_if(spec, 1, model);
  if (version != 0) {
    put_tag(number, 1, sp::kVarint);
    put_varint(number, uint64_t(version));
  }
  put_bytes(spec, 2, number);  // set (Int64Value), even when 0
  put_string_if(spec, 3, signature);
  put_bytes(out, 2, spec);
  return true;
}

}  // namespace spg
