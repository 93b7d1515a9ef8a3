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
 * Thread-safe; the front must outlive the call (the shim holds its capsule).
 *
 * ABI 2 adds submit(), the same path without a waiting thread: it queues the request and
 * returns at once, 1 (queued: `done` runs exactly once later, on a batch thread) or 0 (not
 * queued: serve it through Python; `done` never runs). done(user, 200, out, out_size): the
 * PredictResponse, valid during the call only; done(user, 504, NULL, 0): its deadline passed
 * before its batch ran, so it was dropped unrun (the queue counted it as expired; answer
 * DEADLINE_EXCEEDED); done(user, 0, NULL, 0): handed back (an engine error, a form the queue
 * cannot merge): serve it through Python, which answers it exactly. `data` must stay valid until
 * `done` ran. `deadline`: a CLOCK_MONOTONIC time in seconds (<= 0: none). `done` must not block:
 * it runs on the batch thread. */
#ifndef SP_DIRECT_API_H_
#define SP_DIRECT_API_H_

#define SP_DIRECT_API_CAPSULE "processor._native.direct_api"
#define SP_DIRECT_FRONT_CAPSULE "processor._native.DirectFront"
#define SP_DIRECT_ABI 2

typedef void (*sp_direct_done)(void* user, int status, const void* out, int out_size);

typedef struct sp_direct_api {
  int abi; /* SP_DIRECT_ABI */
  int (*serve)(void* front, const void* data, int size, void** out, int* out_size);
  /* abi >= 2 */
  int (*submit)(void* front, const void* data, int size, double deadline, sp_direct_done done, void* user);
} sp_direct_api;

#endif /* SP_DIRECT_API_H_ */
