#!/usr/bin/env bash
# One-shot set-up on a fresh Debian machine with Python 3.11: virtual environment, packages,
# generated protobuf code and the native library. Safe to re-run; each step skips what is done.
#
#   SP_PYTHON   interpreter used to create .venv (default: python3.11, else python3)
#   SP_EXTRAS   pip extras to install (default: cpu,server,dev; use gpu,server,dev on GPU machines)
set -euo pipefail
cd "$(dirname "$0")/.."

py=${SP_PYTHON:-$(command -v python3.11 || command -v python3)}
extras=${SP_EXTRAS:-cpu,server,dev}

# System packages from Debian: the native build's toolchain, redis-server + redis-cli (the
# Redis feature store's tests and benchmarks start their own servers), and gRPC's C++ library
# (libgrpc++-dev and pkg-config: the native gRPC server, grpc_server "native"; without it the build
# skips that server and grpc_server "python" serves gRPC).
missing=()
for tool in cmake:cmake g++:g++ make:make redis-server:redis-server redis-cli:redis-tools pkg-config:pkg-config; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool##*:}")
done
pkg-config --exists --maximum-traverse-depth=1 grpc++ 2>/dev/null || missing+=(libgrpc++-dev)
# The benchmarks' native load generators (benchmarks/native_load.py): wrk (HTTP/1.1) and h2load
# (gRPC over h2c). Not needed by the server or the tests: installed alongside when apt-get runs.
optional=()
for tool in wrk:wrk h2load:nghttp2-client; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || optional+=("${tool##*:}")
done
# Python's headers, for the native builds (a Debian python3.11 has them in python3.11-dev).
if ! "$py" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  missing+=("$("$py" -c 'import sys; print("python3.%d-dev" % sys.version_info[1])')")
fi
if [ ${#missing[@]} -gt 0 ] || [ ${#optional[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if [ ${#missing[@]} -gt 0 ]; then
      echo "[setup] installing ${missing[*]}"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    if [ ${#optional[@]} -gt 0 ]; then
      echo "[setup] installing ${optional[*]} (the benchmarks' load generators)"
      { [ ${#missing[@]} -gt 0 ] || apt-get update -qq; } \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${optional[@]}" >/dev/null \
        || echo "[setup] could not install ${optional[*]}; only the edge benchmarks need them" >&2
    fi
  elif [ ${#missing[@]} -gt 0 ]; then
    echo "[setup] missing system packages: ${missing[*]} (install them with apt-get as root)" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $py"
  "$py" -m venv .venv
fi
stamp=.venv/.sp-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[setup] installing packages (extras: $extras)"
  .venv/bin/pip install --quiet --disable-pip-version-check -e ".[$extras]"
  case ",$extras," in *,server,*)
    # TF Serving's API protos for the server's TF Serving gRPC services. The wheel requires the
    # full `tensorflow` wheel, which must not sit next to tensorflow-cpu: install it without
    # dependencies (it needs only grpcio, protobuf and the TensorFlow installed above).
    .venv/bin/pip install --quiet --disable-pip-version-check --no-deps "tensorflow-serving-api>=2.18,<2.22" ;;
  esac
  case ",$extras," in *,dev,*)
    # tritonclient, the Open Inference Protocol client the tests talk to the server with: its
    # metadata pins protobuf<7 and ml-dtypes<=0.5.4, which its code does not need (it runs on the
    # protobuf installed above); install it without dependencies, then the ones it uses.
    .venv/bin/pip install --quiet --disable-pip-version-check --no-deps "tritonclient>=2.50,<3"
    .venv/bin/pip install --quiet --disable-pip-version-check "geventhttpclient>=2.3,<3" "python-rapidjson>=1.10,<2" ;;
  esac
  touch "$stamp"
fi

echo "[setup] generating protobuf code"
.venv/bin/python scripts/gen_protos.py

echo "[setup] building processor._native and libserving_processor.so"
bash scripts/build_native.sh
echo "[setup] done"
