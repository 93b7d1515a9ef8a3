#!/usr/bin/env bash
# Builds cpp_processor/ (libserving_processor.so, the example host processor_host) into
# cpp_processor/build/ with cmake. Needs gcc/g++, cmake and a shared-libpython Python.
# Fast when nothing changed (an incremental make); safe to run concurrently (flock).
#
#   SERVING_PROCESSOR_PYTHON  interpreter of the environment the library embeds by default
#                             (default: .venv/bin/python of this checkout)
#   SP_BUILD_TYPE             CMake build type (default Release)
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
if ! cmake --build "$build" --parallel "$(nproc 2>/dev/null || echo 2)" >"$build/build.log" 2>&1; then
  cat "$build/build.log" >&2
  exit 1
fi
grep -i "warning" "$build/build.log" >&2 || true
echo "[build_native] $build/libserving_processor.so, $build/processor_host"
