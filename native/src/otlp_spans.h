// otlp_spans.h -- finished OpenTelemetry spans encoded as OTLP protobuf (the Span message of
// opentelemetry/proto/trace/v1/trace.proto) the moment they end, and queued as bytes for the
// exporter's thread (server/otel_export.py; its Python twin, the reference this is tested
// against, is server.otel_export.PySpanQueue).
//
// Each queued span is framed as a ScopeSpans.spans field (tag 2, length, Span), so a batch taken
// from the queue is the tail of a ScopeSpans message as it is: the exporter prefixes the scope.
//
// Thread-safe (one mutex); never blocks on anything but that mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace sp::otlp {

// An attribute's value, as OTLP's AnyValue carries it.
struct Value {
  enum Kind { kString, kBool, kInt, kDouble, kBytes, kArray } kind = kString;
  std::string_view text;  // kString, kBytes
  int64_t integer = 0;    // kInt, kBool
  double real = 0;        // kDouble
  std::vector<Value> items;  // kArray
};

struct Attribute {
  std::string_view key;
  Value value;
};

struct Link {
  uint64_t trace_hi = 0, trace_lo = 0, span_id = 0;
  uint32_t flags = 0;
};

// One finished span; the views point into the caller's objects for the call.
struct Span {
  uint64_t trace_hi = 0, trace_lo = 0, span_id = 0, parent_id = 0;  // parent 0: a root
  uint32_t flags = 0;  // Span.flags: the W3C trace flags and the SpanFlags remote bits
  int kind = 1;        // SpanKind: 1 internal, 2 server, ...
  uint64_t start_ns = 0, end_ns = 0;
  std::string_view name, trace_state;
  std::vector<Attribute> attributes;
  std::vector<Link> links;
  int status_code = 0;  // 0 unset, 1 ok, 2 error
  std::string_view status_message;
};

// Appends `span`, framed as ScopeSpans field 2, to `out`.
void encode_framed(const Span& span, std::string& out);

// Encoded spans waiting for export, at most `capacity` of them.
class SpanQueue {
 public:
  explicit SpanQueue(size_t capacity) : capacity_(capacity) {}
  // How many spans the queue holds with `span`; 0 (the span dropped) when it held `capacity`.
  size_t add(const Span& span);
  // The first `max_spans` queued spans' bytes (concatenated frames), removed from the queue;
  // `taken` set to how many.
  std::string take(size_t max_spans, size_t& taken);
  size_t size();

 private:
  std::mutex mu_;
  size_t capacity_;
  std::string bytes_;
  std::vector<size_t> ends_;  // each queued span's end offset in bytes_
};

}  // namespace sp::otlp
