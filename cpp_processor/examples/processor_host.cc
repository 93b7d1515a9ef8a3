// processor_host: an example host for libserving_processor.so -- copy it into your RPC server.
//
// It does what a serving framework does with the library: dlopen() it (RTLD_LOCAL, the usual
// way a plugin is loaded), initialize() a model from a model_config JSON file, then call
// process() (or batch_process()) with a serialized tensorflow.eas.PredictRequest from several
// threads. Every response is compared with the first one (or with --expect), and the latency
// percentiles and throughput are printed.
//
//   processor_host --config model_config.json --request request.pb [options]
//
//   --lib PATH          libserving_processor.so (default: next to this program)
//   --config FILE       model_config JSON passed to initialize()
//   --entry STR         model_entry passed to initialize() (default "")
//   --request FILE      serialized PredictRequest sent by every call
//   --threads N         host threads (default 1)
//   --calls M           calls per thread (default 1000)
//   --seconds S         call for S seconds per phase instead of --calls times
//   --warmup K          untimed calls per thread before the timed ones (default 0)
//   --sweep 1,2,4       run one timed phase per thread count (prints a PHASE {json} line each)
//   --repeat R          run the phase(s) R times (default 1)
//   --stdin-phases      print READY, then run one phase per "THREADS SECONDS" line read from
//                       stdin (PHASE {json} each) until EOF: lets a script interleave runs
//   --batch K           use batch_process() with K copies of the request per call
//   --expect FILE       expected serialized PredictResponse (default: the first response)
//   --write-first FILE  write the first response to FILE
//   --ping              also call process() with an empty request and print the signature JSON
//   --no-compare        do not compare responses byte for byte (batched floats may differ in
//                       their last bits from an unbatched answer: compare those with a tolerance)
//   --no-finalize       skip finalize() at the end
//   --no-free           do not free the responses of the timed calls (a deliberate leak, to
//                       check that a leak checker run over this host does see leaks)
//
// Last line of output: RESULT {json} with the figures, for scripts. Each phase also reports what
// its timed calls cost the whole process (getrusage: every thread, the library's included): CPU
// microseconds and voluntary / involuntary context switches per call.
// Exit status: 0 all calls returned 200 and identical responses; 1 otherwise; 2 initialize
// failed; 3 bad usage or unreadable files.
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "processor.h"

namespace {

// The C ABI, resolved with dlsym.
struct Api {
  void* (*initialize)(const char*, const char*, int*);
  int (*process)(void*, const void*, int, void**, int*);
  int (*batch_process)(void*, int, const void* const*, const int*, void**, int*, int*);
  int (*get_serving_model_info)(void*, void**, int*);
  void (*finalize)(void*);
  void (*processor_free)(void*);
  int (*processor_abi_version)(void);
};

struct Options {
  std::string lib, config, entry, request, expect, write_first;
  int threads = 1, calls = 1000, warmup = 0, batch = 0, repeat = 1;
  double seconds = 0;
  bool stdin_phases = false;
  std::vector<int> sweep;
  bool ping = false, finalize = true, free_outputs = true, compare = true;
};

[[noreturn]] void die(int code, const std::string& msg) {
  std::fprintf(stderr, "processor_host: %s\n", msg.c_str());
  std::exit(code);
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

std::string default_lib() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "libserving_processor.so";
  std::string exe(buf, static_cast<size_t>(n));
  return exe.substr(0, exe.rfind('/') + 1) + "libserving_processor.so";
}

Options parse(int argc, char** argv) {
  Options o;
  o.lib = default_lib();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(3, "missing value for " + a);
      return argv[++i];
    };
    if (a == "--lib") o.lib = value();
    else if (a == "--config") o.config = value();
    else if (a == "--entry") o.entry = value();
    else if (a == "--request") o.request = value();
    else if (a == "--expect") o.expect = value();
    else if (a == "--write-first") o.write_first = value();
    else if (a == "--threads") o.threads = std::atoi(value().c_str());
    else if (a == "--calls") o.calls = std::atoi(value().c_str());
    else if (a == "--warmup") o.warmup = std::atoi(value().c_str());
    else if (a == "--batch") o.batch = std::atoi(value().c_str());
    else if (a == "--seconds") o.seconds = std::atof(value().c_str());
    else if (a == "--repeat") o.repeat = std::atoi(value().c_str());
    else if (a == "--sweep") {
      std::stringstream ss(value());
      std::string item;
      while (std::getline(ss, item, ','))
        if (std::atoi(item.c_str()) > 0) o.sweep.push_back(std::atoi(item.c_str()));
    }
    else if (a == "--ping") o.ping = true;
    else if (a == "--no-compare") o.compare = false;
    else if (a == "--no-finalize") o.finalize = false;
    else if (a == "--no-free") o.free_outputs = false;
    else if (a == "--stdin-phases") o.stdin_phases = true;
    else die(3, "unknown option " + a + " (see the comment at the top of processor_host.cc)");
  }
  if (o.config.empty() || o.request.empty()) die(3, "--config and --request are required");
  if (o.threads < 1 || o.calls < 0 || o.warmup < 0 || o.batch < 0 || o.repeat < 1 || o.seconds < 0)
    die(3, "bad numbers");
  return o;
}

template <typename F>
void load(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) die(3, std::string("symbol not found: ") + name);
}

// ServingModelInfo{string model_path = 1}: decoded by hand so the host needs no protobuf.
std::string decode_model_path(const std::string& msg) {
  size_t i = 0;
  while (i < msg.size()) {
    uint64_t key = 0, len = 0;
    int shift = 0;
    while (i < msg.size()) {
      uint8_t b = static_cast<uint8_t>(msg[i++]);
      key |= static_cast<uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if (!(b & 0x80)) break;
    }
    if ((key & 7) != 2) return "";  // only length-delimited fields expected
    shift = 0;
    while (i < msg.size()) {
      uint8_t b = static_cast<uint8_t>(msg[i++]);
      len |= static_cast<uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if (!(b & 0x80)) break;
    }
    if (len > msg.size() - i) return "";
    if ((key >> 3) == 1) return msg.substr(i, len);
    i += len;
  }
  return "";
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += static_cast<char>(c);
    else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else o += static_cast<char>(c);
  }
  return o;
}

struct Stats {
  int threads = 0;
  std::vector<double> lat;  // microseconds, sorted
  double mean = 0, wall = 0, rps = 0;
  double cpu_s = 0, vcsw = 0, ivcsw = 0;  // the process's, over the timed calls
};

// The whole process's CPU seconds and context switches so far (every thread, ended ones too).
struct Usage {
  double cpu_s = 0, vcsw = 0, ivcsw = 0;
};

Usage usage_now() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto seconds = [](const timeval& tv) { return double(tv.tv_sec) + double(tv.tv_usec) * 1e-6; };
  return {seconds(ru.ru_utime) + seconds(ru.ru_stime), double(ru.ru_nvcsw), double(ru.ru_nivcsw)};
}

long rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  size_t k = static_cast<size_t>(p / 100.0 * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(k, sorted.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse(argc, argv);
  std::string config, request, expect;
  if (!read_file(opt.config, &config)) die(3, "cannot read " + opt.config);
  if (!read_file(opt.request, &request)) die(3, "cannot read " + opt.request);
  if (!opt.expect.empty() && !read_file(opt.expect, &expect)) die(3, "cannot read " + opt.expect);

  // RTLD_LOCAL: the library makes libpython global itself, the host need not care.
  void* lib = dlopen(opt.lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) die(3, std::string("dlopen failed: ") + dlerror());
  Api api{};
  load(lib, "initialize", &api.initialize);
  load(lib, "process", &api.process);
  load(lib, "batch_process", &api.batch_process);
  load(lib, "get_serving_model_info", &api.get_serving_model_info);
  load(lib, "finalize", &api.finalize);
  load(lib, "processor_free", &api.processor_free);
  load(lib, "processor_abi_version", &api.processor_abi_version);
  if (api.processor_abi_version() != PROCESSOR_ABI_VERSION)
    die(3, "library ABI version " + std::to_string(api.processor_abi_version()) +
               ", host built for " + std::to_string(PROCESSOR_ABI_VERSION));

  auto t_init = std::chrono::steady_clock::now();
  int state = -1;
  void* model = api.initialize(opt.entry.c_str(), config.c_str(), &state);
  double init_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_init).count();
  if (state != 0 || model == nullptr) {
    std::printf("RESULT {\"initialized\": false, \"state\": %d}\n", state);
    return 2;
  }
  std::printf("initialized in %.2f s\n", init_s);

  if (opt.ping) {
    void* out = nullptr;
    int n = 0;
    int st = api.process(model, nullptr, 0, &out, &n);
    std::printf("ping: status %d, %.*s\n", st, n, static_cast<const char*>(out));
    api.processor_free(out);
  }

  // One call that every other response is compared with.
  const int batch = opt.batch;
  std::vector<const void*> batch_in(std::max(batch, 1), request.data());
  std::vector<int> batch_in_size(std::max(batch, 1), static_cast<int>(request.size()));
  auto call = [&](std::string* first_out, int* first_status) -> void {
    void* out = nullptr;
    int n = 0;
    *first_status = api.process(model, request.data(), static_cast<int>(request.size()), &out, &n);
    first_out->assign(static_cast<const char*>(out), static_cast<size_t>(n));
    api.processor_free(out);
  };
  std::string reference;
  int first_status = 0;
  call(&reference, &first_status);
  if (first_status != 200)
    std::fprintf(stderr, "processor_host: first call returned %d: %s\n", first_status,
                 reference.c_str());
  if (!opt.write_first.empty()) {
    std::ofstream f(opt.write_first, std::ios::binary);
    f.write(reference.data(), static_cast<std::streamsize>(reference.size()));
  }
  bool expect_ok = expect.empty() || expect == reference;
  if (!expect.empty() && !expect_ok)
    std::fprintf(stderr, "processor_host: first response differs from --expect\n");

  // Timed phases: each runs `threads` threads; a thread makes `warmup` untimed calls, waits
  // for the others, then makes `calls` calls or calls until `seconds` have passed.
  std::atomic<long> mismatches{0}, errors{0};
  auto run_phase = [&](int nthreads, double seconds) -> Stats {
    std::vector<std::vector<double>> lat(nthreads);
    std::mutex mu;
    std::condition_variable cv;
    int ready = 0;
    bool go = false;
    std::chrono::steady_clock::time_point t_start, deadline;
    Usage u_start;
    auto check = [&](int st, void* out, int n, bool timed) {
      if (st != 200) errors.fetch_add(1, std::memory_order_relaxed);
      else if (opt.compare && (static_cast<size_t>(n) != reference.size() ||
               std::memcmp(out, reference.data(), reference.size()) != 0))
        mismatches.fetch_add(1, std::memory_order_relaxed);
      if (opt.free_outputs || !timed) api.processor_free(out);
    };
    auto worker = [&](int t) {
      const int k = std::max(batch, 1);
      std::vector<void*> out(k);
      std::vector<int> out_size(k), status(k);
      auto one = [&](bool timed) {
        auto t0 = std::chrono::steady_clock::now();
        if (batch > 0)
          (void)api.batch_process(model, batch, batch_in.data(), batch_in_size.data(), out.data(),
                                  out_size.data(), status.data());
        else
          status[0] = api.process(model, request.data(), static_cast<int>(request.size()),
                                  &out[0], &out_size[0]);
        auto t1 = std::chrono::steady_clock::now();
        if (timed) lat[t].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        for (int i = 0; i < k; ++i) check(status[i], out[i], out_size[i], timed);
        return t1;
      };
      for (int c = 0; c < opt.warmup; ++c) one(false);
      {
        std::unique_lock<std::mutex> lock(mu);
        if (++ready == nthreads) {
          u_start = usage_now();
          t_start = std::chrono::steady_clock::now();
          deadline = t_start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(seconds));
          go = true;
          cv.notify_all();
        }
        cv.wait(lock, [&] { return go; });
      }
      lat[t].reserve(seconds > 0 ? 1024 : static_cast<size_t>(opt.calls));
      if (seconds > 0) {
        while (one(true) < deadline) {
        }
      } else {
        for (int c = 0; c < opt.calls; ++c) one(true);
      }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < nthreads; ++t) threads.emplace_back(worker, t);
    for (auto& th : threads) th.join();
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    const Usage u_end = usage_now();
    Stats st;
    st.threads = nthreads;
    st.cpu_s = u_end.cpu_s - u_start.cpu_s;
    st.vcsw = u_end.vcsw - u_start.vcsw;
    st.ivcsw = u_end.ivcsw - u_start.ivcsw;
    for (auto& v : lat) st.lat.insert(st.lat.end(), v.begin(), v.end());
    std::sort(st.lat.begin(), st.lat.end());
    for (double x : st.lat) st.mean += x;
    st.mean = st.lat.empty() ? 0 : st.mean / static_cast<double>(st.lat.size());
    st.wall = wall;
    st.rps = wall > 0 ? static_cast<double>(st.lat.size()) / wall : 0;
    return st;
  };
  auto stats_json = [&](const Stats& st) {
    char buf[768];
    const double calls = st.lat.empty() ? 1.0 : double(st.lat.size());
    std::snprintf(buf, sizeof buf,
                  "\"threads\": %d, \"batch\": %d, \"total\": %zu, \"p50_us\": %.2f, \"p90_us\": %.2f, "
                  "\"p99_us\": %.2f, \"mean_us\": %.2f, \"max_us\": %.2f, \"wall_s\": %.4f, "
                  "\"calls_per_s\": %.1f, \"cpu_us_per_call\": %.2f, \"vcsw_per_call\": %.3f, "
                  "\"ivcsw_per_call\": %.3f",
                  st.threads, batch, st.lat.size(), percentile(st.lat, 50), percentile(st.lat, 90),
                  percentile(st.lat, 99), st.mean, st.lat.empty() ? 0.0 : st.lat.back(), st.wall,
                  st.rps, st.cpu_s * 1e6 / calls, st.vcsw / calls, st.ivcsw / calls);
    return std::string(buf);
  };

  long rss_before = rss_kb();
  Stats last;
  long total = 0;
  std::vector<int> sweep = opt.sweep.empty() ? std::vector<int>{opt.threads} : opt.sweep;
  if (opt.stdin_phases) {
    // Driven by a script: one "THREADS SECONDS" line per phase, answered by a PHASE line.
    std::printf("READY\n");
    std::fflush(stdout);
    std::string line;
    for (int r = 0; std::getline(std::cin, line); ++r) {
      int nthreads = 0;
      double seconds = 0;
      std::istringstream in(line);
      if (!(in >> nthreads >> seconds) || nthreads < 1 || seconds <= 0) break;
      last = run_phase(nthreads, seconds);
      total += static_cast<long>(last.lat.size());
      std::printf("PHASE {\"repeat\": %d, %s}\n", r, stats_json(last).c_str());
      std::fflush(stdout);
    }
  } else {
    for (int r = 0; r < opt.repeat; ++r) {
      for (int nthreads : sweep) {
        last = run_phase(nthreads, opt.seconds);
        total += static_cast<long>(last.lat.size());
        if (!opt.sweep.empty())
          std::printf("PHASE {\"repeat\": %d, %s}\n", r, stats_json(last).c_str());
        std::fflush(stdout);
      }
    }
  }
  long rss_after = rss_kb();

  void* info = nullptr;
  int info_size = 0;
  int info_status = api.get_serving_model_info(model, &info, &info_size);
  std::string info_bytes(static_cast<const char*>(info), static_cast<size_t>(info_size));
  api.processor_free(info);
  std::string model_path = info_status == 200 ? decode_model_path(info_bytes) : info_bytes;

  std::printf("model_path: %s (status %d)\n", model_path.c_str(), info_status);
  std::printf("%ld calls%s: %ld errors, %ld mismatches\n", total,
              batch > 0 ? (" (batch_process x" + std::to_string(batch) + ")").c_str() : "",
              errors.load(), mismatches.load());
  std::printf("last phase, %d threads: latency us: p50 %.1f  p90 %.1f  p99 %.1f  mean %.1f  max %.1f\n",
              last.threads, percentile(last.lat, 50), percentile(last.lat, 90),
              percentile(last.lat, 99), last.mean, last.lat.empty() ? 0.0 : last.lat.back());
  std::printf("throughput: %.0f calls/s (%.3f s)\n", last.rps, last.wall);

  if (opt.finalize) api.finalize(model);
  std::printf(
      "RESULT {\"initialized\": true, \"init_s\": %.3f, \"calls_per_thread\": %d, %s, "
      "\"all_calls\": %ld, \"errors\": %ld, \"mismatches\": %ld, \"first_status\": %d, "
      "\"expect_ok\": %s, \"info_status\": %d, \"model_path\": \"%s\", \"rss_before_kb\": %ld, "
      "\"rss_after_kb\": %ld}\n",
      init_s, opt.calls, stats_json(last).c_str(), total, errors.load(), mismatches.load(),
      first_status, expect_ok ? "true" : "false", info_status, json_escape(model_path).c_str(),
      rss_before, rss_after);
  std::fflush(stdout);
  bool ok = first_status == 200 && expect_ok && errors.load() == 0 && mismatches.load() == 0;
  return ok ? 0 : 1;
}
