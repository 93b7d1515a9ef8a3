#!/usr/bin/env bash
# The entry point of the TF Serving image variant (docker/Dockerfile.tfserving), as tensorflow/serving's
# /usr/bin/tf_serving_entrypoint.sh: TF Serving's command line (tensorflow_model_server, the console
# script of this project: docs/tfserving-dropin.md) on gRPC 8500 and REST 8501, every interface.
#
#   MODEL_NAME       the model's name (default: model)
#   MODEL_BASE_PATH  the directory that holds the model's directory (default: /models); the model is
#                    served from ${MODEL_BASE_PATH}/${MODEL_NAME}: /models/${MODEL_NAME} by default
#   arguments        more tensorflow_model_server flags (--model_config_file=..., --enable_batching,
#                    ...). A flag given again wins, so --port=N / --rest_api_port=N move the ports.
#
# exec: the server is the container's process and gets its SIGTERM (it drains in-flight requests).
set -euo pipefail
MODEL_NAME="${MODEL_NAME:-model}"
MODEL_BASE_PATH="${MODEL_BASE_PATH:-/models}"
exec tensorflow_model_server --port=8500 --rest_api_port=8501 \
  --model_name="${MODEL_NAME}" --model_base_path="${MODEL_BASE_PATH}/${MODEL_NAME}" "$@"
