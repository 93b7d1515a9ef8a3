// otlp_spans.cc -- see otlp_spans.h.
#include "otlp_spans.h"

#include <cstring>

namespace sp::otlp {
namespace {

enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kLength = 2, kFixed32 = 5 };

void varint(std::string& out, uint64_t v) {
  char buf[10];
  size_t n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out.append(buf, n);
}

void tag(std::string& out, uint32_t field, Wire wire) { varint(out, (field << 3) | wire); }

void fixed64(std::string& out, uint32_t field, uint64_t v) {
  tag(out, field, kFixed64);
  char buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = static_cast<char>(v >> (8 * i));  // little-endian
  out.append(buf, 8);
}

void fixed32(std::string& out, uint32_t field, uint32_t v) {
  tag(out, field, kFixed32);
  char buf[4];
  for (int i = 0; i < 4; ++i) buf[i] = static_cast<char>(v >> (8 * i));
  out.append(buf, 4);
}

void bytes(std::string& out, uint32_t field, std::string_view v) {
  tag(out, field, kLength);
  varint(out, v.size());
  out.append(v.data(), v.size());
}

// A trace or span id: big-endian bytes, as W3C and OTLP write them.
void id(std::string& out, uint32_t field, const uint64_t* words, int count) {
  char buf[16];
  for (int w = 0; w < count; ++w)
    for (int i = 0; i < 8; ++i) buf[8 * w + i] = static_cast<char>(words[w] >> (56 - 8 * i));
  bytes(out, field, std::string_view(buf, 8 * count));
}

void trace_id(std::string& out, uint32_t field, uint64_t hi, uint64_t lo) {
  const uint64_t words[2] = {hi, lo};
  id(out, field, words, 2);
}

void span_id(std::string& out, uint32_t field, uint64_t v) { id(out, field, &v, 1); }

void message(std::string& out, uint32_t field, const std::string& body) { bytes(out, field, body); }

void any_value(std::string& out, const Value& v) {  // AnyValue's fields
  switch (v.kind) {
    case Value::kString: bytes(out, 1, v.text); break;
    case Value::kBool: tag(out, 2, kVarint); varint(out, v.integer ? 1 : 0); break;
    case Value::kInt: tag(out, 3, kVarint); varint(out, static_cast<uint64_t>(v.integer)); break;
    case Value::kDouble: {
      uint64_t bits;
      std::memcpy(&bits, &v.real, 8);
      fixed64(out, 4, bits);
      break;
    }
    case Value::kArray: {  // ArrayValue { repeated AnyValue values = 1; }
      std::string array, item;
      for (const Value& each : v.items) {
        item.clear();
        any_value(item, each);
        message(array, 1, item);
      }
      message(out, 5, array);
      break;
    }
    case Value::kBytes: bytes(out, 7, v.text); break;
  }
}

void encode(const Span& s, std::string& out) {
  trace_id(out, 1, s.trace_hi, s.trace_lo);
  span_id(out, 2, s.span_id);
  if (!s.trace_state.empty()) bytes(out, 3, s.trace_state);
  if (s.parent_id != 0) span_id(out, 4, s.parent_id);
  bytes(out, 5, s.name);
  if (s.kind != 0) {
    tag(out, 6, kVarint);
    varint(out, static_cast<uint64_t>(s.kind));
  }
  fixed64(out, 7, s.start_ns);
  fixed64(out, 8, s.end_ns);
  std::string kv, value;
  for (const Attribute& a : s.attributes) {  // KeyValue { key = 1; AnyValue value = 2; }
    kv.clear();
    value.clear();
    bytes(kv, 1, a.key);
    any_value(value, a.value);
    message(kv, 2, value);
    message(out, 9, kv);
  }
  for (const Link& l : s.links) {  // Link { trace_id = 1; span_id = 2; flags = 6; }
    kv.clear();
    trace_id(kv, 1, l.trace_hi, l.trace_lo);
    span_id(kv, 2, l.span_id);
    if (l.flags != 0) fixed32(kv, 6, l.flags);
    message(out, 13, kv);
  }
  if (s.status_code != 0 || !s.status_message.empty()) {  // Status { message = 2; code = 3; }
    kv.clear();
    if (!s.status_message.empty()) bytes(kv, 2, s.status_message);
    if (s.status_code != 0) {
      tag(kv, 3, kVarint);
      varint(kv, static_cast<uint64_t>(s.status_code));
    }
    message(out, 15, kv);
  }
  if (s.flags != 0) fixed32(out, 16, s.flags);
}

}  // namespace

void encode_framed(const Span& span, std::string& out) {
  std::string body;
  body.reserve(256);
  encode(span, body);
  message(out, 2, body);
}

size_t SpanQueue::add(const Span& span) {
  std::string framed;
  encode_framed(span, framed);  // outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (ends_.size() >= capacity_) return 0;
  bytes_.append(framed);
  ends_.push_back(bytes_.size());
  return ends_.size();
}

std::string SpanQueue::take(size_t max_spans, size_t& taken) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  if (max_spans >= ends_.size()) {
    taken = ends_.size();
    out.swap(bytes_);
    ends_.clear();
    return out;
  }
  taken = max_spans;
  if (taken == 0) return out;
  const size_t cut = ends_[taken - 1];
  out.assign(bytes_, 0, cut);
  bytes_.erase(0, cut);
  ends_.erase(ends_.begin(), ends_.begin() + static_cast<std::ptrdiff_t>(taken));
  for (size_t& end : ends_) end -= cut;
  return out;
}

size_t SpanQueue::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return ends_.size();
}

}  // namespace sp::otlp
