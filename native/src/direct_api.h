/* direct_api.h -- the C ABI's direct path into a model's native batching queue, in plain C: the
 * C shim (cpp_processor/src) calls it without the GIL.
 *
 * processor._native exports one table of this type as the capsule SP_DIRECT_API_CAPSULE, and
 * each DirectFront (a model's current direct lane: direct_front.h) gives its address out as a
 * capsule named SP_DIRECT_FRONT_CAPSULE. serve() queues a serialized PredictRequest on the
 * current version's batching queue and waits for its batch, with no Python and no GIL:
 *   200: *out (malloc'd: the caller frees it) holds the PredictResponse, *out_size its size;
 *   0:   not taken (nothing published, the lane paused for an update or retired, a request the
 *        queue does not take or hands back, a refusal): serve it through Python, which answers
 *        it exactly, its errors included.
 * Thread-safe; the front must outlive the call (the shim holds its capsule). */
#ifndef SP_DIRECT_API_H_
#define SP_DIRECT_API_H_

#define SP_DIRECT_API_CAPSULE "processor._native.direct_api"
#define SP_DIRECT_FRONT_CAPSULE "processor._native.DirectFront"
#define SP_DIRECT_ABI 1

typedef struct sp_direct_api {
  int abi; /* SP_DIRECT_ABI */
  int (*serve)(void* front, const void* data, int size, void** out, int* out_size);
} sp_direct_api;

#endif /* SP_DIRECT_API_H_ */
