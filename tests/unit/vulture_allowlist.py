"""Names the dead-code check (tests/unit/test_dead_code.py) counts as used: code that frameworks,
C and generated protocol objects reach without a Python call site vulture could see.

vulture's whitelist format: this file is parsed, never imported or run; every name written
here is "used". Keep it small: a name belongs here only when something outside our Python
calls or reads it. Routes and validators need no entry (the test ignores functions decorated
``@app.*``, ``@router.*``, ``@field_validator``, ``@model_validator``).
"""
# ruff: noqa
# fmt: off
_ = object()

# C ABI: cpp_processor/src/bridge.c looks these up on processor.abi by name.
ABI_VERSION
initialize, process, batch_process, get_serving_model_info, finalize, direct_front

# Keys of the model config accepted for DeepRec compatibility and validated, never read
# (processor/config.py: IGNORED_KEYS, the sharding and serialize_protocol keys).
_.serialize_protocol
_.model_update_intra_threads
_.embedding_names
_.shard_instance_count
_.id_type

# TensorFlow's DataType enum, written out whole (processor/dtypes.py mirrors types.proto).
DT_INVALID
DT_VARIANT

# Attributes of objects other libraries read: ONNX Runtime SessionOptions, the onnx and
# TensorFlow protocol buffers (RunOptions, GPUOptions, descriptor options, timestamps).
_.intra_op_num_threads
_.inter_op_num_threads
_.log_severity_level
_.enable_profiling
_.profile_file_prefix
_.data_location
_.trace_level
_.allow_growth
_.timestamp_micros
_.map_entry

# uvicorn, asyncio and logging hooks we override or set (server/app.py, server/http/protocol.py,
# server/logs.py).
_.should_exit
_.capture_signals
_.install_signal_handlers
_.timeout_graceful_shutdown
_.timeout_keep_alive
_.total_requests
_.data_received
_.disabled
_.openapi  # FastAPI calls app.openapi() for /openapi.json (our patched schema)
_.route_class  # FastAPI makes every route the app adds with its router's route_class (JsonDepthRoute)

# Parameters a protocol fixes: __exit__'s traceback, ssl's SNI callback's server name.
tb
server_name

# grpc.aio calls a server interceptor's hook for every call (server/grpc/interceptor.py).
_.intercept_service

# tools/otlp_receiver.py: grpcio calls the TraceService servicer's method by its name; http.server
# calls and reads the request handler's hooks and flags.
_.Export
_.do_POST
_.log_message
_.protocol_version
_.close_connection
_.daemon_threads

# server/otel_export.py: the SDK's gRPC OTLP exporter calls its subclass's hooks for each export.
_._translate_data
_._count_data
