// reactor.h -- one gRPC call of the native server (grpc_server.h's file comment tells its path):
// once its request message has arrived, the call takes the direct path (decoded, run on the
// model's native batching queue and answered without Python) or is bridged to the Python
// handlers as a BridgeCall. BridgeCall's methods are defined here, beside the reactor they drive.
//
// A reactor deletes itself in OnDone; gRPC calls its callbacks on its own threads, and the
// direct path's completion on the batch thread that ran the call's batch.
#pragma once

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/support/server_callback.h>

#include "grpc_server.h"

namespace spg {

// A new call's reactor (owned by itself: deleted when gRPC is done with the call).
grpc::ServerGenericBidiReactor* new_reactor(Server* server, grpc::GenericCallbackServerContext* ctx);

}  // namespace spg
