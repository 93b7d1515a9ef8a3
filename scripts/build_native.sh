#!/usr/bin/env bash
# Builds the native parts with cmake:
#   native/         -> processor/_native.*.so, the request path's codec (nanobind extension), and
#                      server/grpc/_native_grpc.*.so, the native gRPC server (issue 50; only with gRPC's
#                      C++ library, Debian's libgrpc++-dev: without it grpc_server "python" serves gRPC)
#   cpp_processor/  -> cpp_processor/build/ (libserving_processor.so, the example host processor_host)
# Needs gcc/g++, cmake, nanobind and numpy in the environment, and for the C ABI a
# shared-libpython Python. Fast when nothing changed (an incremental make); safe to run
# concurrently (flock).
#
#   SERVING_PROCESSOR_PYTHON  interpreter of the environment (default: .venv/bin/python of this
#                             checkout); the C ABI library embeds it by default
#   SP_BUILD_TYPE             CMake build type (default Release)
#   SP_NATIVE_ONLY=1          build only the extension (e.g. for another interpreter, with no
#                             shared libpython: a GPU machine's system Python)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${SERVING_PROCESSOR_PYTHON:-$root/.venv/bin/python}
build=cpp_processor/build
build_type=${SP_BUILD_TYPE:-Release}

case "$py" in /*) ;; *) py=$root/$py ;; esac   # baked into the library: must be absolute
if [ ! -x "$py" ]; then
  echo "[build_native] no interpreter at $py (run scripts/setup.sh first)" >&2
  exit 1
fi
command -v cmake >/dev/null || { echo "[build_native] cmake not found (apt-get install cmake)" >&2; exit 1; }

jobs=$(nproc 2>/dev/null || echo 2)

# The extension: one build tree per interpreter (its file name carries the ABI tag).
tag=$("$py" -c 'import sys; print("%s%d%d" % (sys.implementation.name, *sys.version_info[:2]))')
ext_build=native/build/$tag
mkdir -p "$ext_build"
# The native gRPC server needs gRPC's C++ library (pkg-config grpc++); a tree configured before it
# was installed is configured again so that it builds it.
grpc=0
pkg-config --exists --maximum-traverse-depth=1 grpc++ 2>/dev/null && grpc=1  # depth 1: 2 ms, not 2 s
if ! (exec 8>"$ext_build/.build.lock"; flock 8
      if [ -f "$ext_build/CMakeCache.txt" ] && [ $grpc = 1 ] \
          && ! grep -q "^SP_GRPCPP_FOUND:INTERNAL=1" "$ext_build/CMakeCache.txt"; then
        cmake -S native -B "$ext_build" >"$ext_build/configure.log" 2>&1 \
          || { cat "$ext_build/configure.log" >&2; exit 1; }
      fi
      if [ ! -f "$ext_build/CMakeCache.txt" ]; then
        cmake -S native -B "$ext_build" -DPython_EXECUTABLE="$py" -DCMAKE_BUILD_TYPE="$build_type" \
          >"$ext_build/configure.log" 2>&1 || { cat "$ext_build/configure.log" >&2; exit 1; }
      fi
      cmake --build "$ext_build" --parallel "$jobs" >"$ext_build/build.log" 2>&1 \
        || { cat "$ext_build/build.log" >&2; exit 1; }); then
  exit 1
fi
grep -i "warning" "$ext_build/build.log" | grep -v nanobind >&2 || true
echo "[build_native] processor/_native ($tag)"
if [ $grpc = 1 ]; then
  echo "[build_native] server/grpc/_native_grpc ($tag, gRPC $(pkg-config --modversion --maximum-traverse-depth=1 grpc++))"
else
  echo "[build_native] gRPC's C++ library is not installed (pkg-config grpc++): the native gRPC server," \
       "server/grpc/_native_grpc, is not built and grpc_server \"native\" is unavailable (grpc_server" \
       "\"python\" serves gRPC). Install it with scripts/setup.sh as root, or apt-get install libgrpc++-dev" >&2
fi
[ "${SP_NATIVE_ONLY:-0}" = 1 ] && exit 0

mkdir -p "$build"
exec 9>"$build/.build.lock"
flock 9

# Configure only when the build tree is new or was made for another interpreter / build type;
# otherwise the build step re-runs cmake by itself if CMakeLists.txt changed.
want="$py|$build_type"
if [ ! -f "$build/CMakeCache.txt" ] || [ "$(cat "$build/.configured-for" 2>/dev/null)" != "$want" ]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  if [ -f "$build/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${gen[1]:-Unix Makefiles}" "$build/CMakeCache.txt"; then
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  fi
  if ! cmake -S cpp_processor -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE="$build_type" \
      -DSERVING_PROCESSOR_PYTHON="$py" >"$build/configure.log" 2>&1; then
    cat "$build/configure.log" >&2
    exit 1
  fi
  echo "$want" > "$build/.configured-for"
fi
if ! cmake --build "$build" --parallel "$jobs" >"$build/build.log" 2>&1; then
  cat "$build/build.log" >&2
  exit 1
fi
grep -i "warning" "$build/build.log" >&2 || true
# The test library (testing/libserving_processor_testing.so) once had the production file name; a
# build tree from then keeps that file, which a look-up by name could load: remove it.
rm -f "$build/testing/libserving_processor.so"
echo "[build_native] $build/libserving_processor.so, $build/processor_host"
