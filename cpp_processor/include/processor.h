/*
 * processor.h -- the C ABI of libserving_processor.so.
 *
 * A host (typically a custom RPC framework) dlopen()s libserving_processor.so, calls
 * initialize() once per model, then process() / batch_process() / get_serving_model_info()
 * from any number of its own threads, and finalize() when it is done with the model.
 * Requests and responses are serialized protobuf messages of protos/predict.proto
 * (package tensorflow.eas): PredictRequest in, PredictResponse / ServingModelInfo out.
 * The first three functions have exactly the signatures of DeepRec's processor.h, so a
 * host written for DeepRec's libserving_processor.so works unchanged.
 *
 * ---------------------------------------------------------------------------------------
 * Status codes (the int returned by process / batch_process / get_serving_model_info)
 *
 *   200  OK: the output buffer holds the serialized response.
 *   400  bad request: unparsable bytes, unknown input alias, wrong dtype or shape, missing
 *        input; also a bad argument at the C level (NULL pointer, negative size, NULL or
 *        unknown model handle).
 *   404  not found: the request names a signature (or version) the model does not serve.
 *   500  internal failure (in the engine, in the library, or out of memory).
 *   503  not ready: no model version loaded yet, or the model is shutting down; or the
 *        model's batching queue is full (retry later).
 *
 * These five are the only statuses the library returns. It sets no request size limit (the
 * host's transport does; input_size is an int) and takes no deadline, so it has no 413 or 504.
 * For every status other than 200 the output buffer holds a UTF-8 message (not
 * NUL-terminated; its length is *output_size). All behaviour of a well-formed call
 * (which status, which message) is decided by the Python processor (processor/abi.py, whose
 * statuses are the c_abi column of processor/errors.py's STATUS_TABLE); the library itself
 * only produces 400 for bad C arguments and 500 for its own failures -- including a status
 * outside the list above coming from Python -- and those messages start with
 * "[serving_processor]". Every 500 is logged once, through Python's logging (plain stderr when
 * Python cannot log), with the Python traceback when there is one (cpp_processor/README.md,
 * "Errors and logs"); 400, 404 and 503 are the caller's or expected, and not logged.
 *
 * ---------------------------------------------------------------------------------------
 * Ownership
 *
 *   Every buffer returned through an output_data pointer was allocated with malloc() and
 *   belongs to the caller: release it with processor_free() (or free(); both are correct).
 *   Input buffers are only read during the call and may be reused as soon as it returns.
 *   The handle returned by initialize() is owned by the library; release it with
 *   finalize(), never with free().
 *
 * Thread safety
 *
 *   process, batch_process and get_serving_model_info may be called concurrently from any
 *   number of threads on the same handle. initialize may be called from any thread, also
 *   concurrently (each call loads its own model). finalize(h) must be called once, after
 *   every other call on h has returned; afterwards h is invalid. Calls made with a
 *   finalized handle are detected and answered with 400 (as long as the address has not
 *   been reused by a later initialize).
 *
 * Embedded Python
 *
 *   The library runs the Python processor in an embedded CPython 3.11 (it links libpython).
 *   - If the host process has no Python interpreter, the first initialize() starts one, for
 *     the Python environment (virtualenv) the library was built for. Override it with the
 *     environment variable SERVING_PROCESSOR_PYTHON=/path/to/venv/bin/python (must be the
 *     same Python version). SERVING_PROCESSOR_ROOT overrides the project directory that is
 *     put on sys.path so that the `processor` package imports. The interpreter is a polite
 *     guest: no Python signal handlers (the host keeps its own), the host's locale and C stdio
 *     are left as they are (Python runs in UTF-8 mode instead).
 *   - If the host already runs Python (e.g. it loaded the library with ctypes), the library
 *     joins that interpreter. That Python must be the shared-libpython build the library was
 *     linked against.
 *   - libpython's symbols are made global (dlopen RTLD_NOLOAD|RTLD_GLOBAL) so that Python
 *     extension modules load even when the host dlopen()ed this library with RTLD_LOCAL.
 *   - Each host thread gets one Python thread state on its first call, kept until the thread
 *     exits; the GIL is held only while the Python entry point runs (the native codec and the
 *     engine release it while they work), never while the thread is idle.
 *   - The request is not copied: Python reads it through a read-only view of input_data,
 *     ended before process() / batch_process() return. The host's buffer must stay unchanged
 *     during the call (it is the host's until then anyway).
 *   - No Python exception crosses the ABI: it becomes state = -1 or a non-200 status.
 *   - The interpreter is never finalized; the library cannot be unloaded (dlclose() keeps it).
 *
 * Compatible with C and C++ hosts.
 */
#ifndef SERVING_PROCESSOR_H_
#define SERVING_PROCESSOR_H_

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define PROCESSOR_API __attribute__((visibility("default")))
#else
#define PROCESSOR_API
#endif

/* Version of this ABI; processor_abi_version() returns the value the library was built with. */
#define PROCESSOR_ABI_VERSION 1

/* Status codes, see above. */
#define PROCESSOR_STATUS_OK 200
#define PROCESSOR_STATUS_BAD_REQUEST 400
#define PROCESSOR_STATUS_NOT_FOUND 404
#define PROCESSOR_STATUS_INTERNAL 500
#define PROCESSOR_STATUS_UNAVAILABLE 503

/*
 * Loads the model described by model_config (the DeepRec model_config JSON, NUL-terminated
 * UTF-8) and blocks until it is ready to serve. model_entry is passed to the processor
 * unchanged (DeepRec ignores it; pass ""; NULL is treated as "").
 * On success: *state = 0 and a non-NULL handle.
 * On failure: *state = -1, NULL, and the line
 *   "[TensorFlow] Processor initialize failed, status:<message>"
 * on stderr; the message is also available from processor_last_error() on this thread.
 * state must not be NULL (if it is, the call fails and returns NULL).
 */
PROCESSOR_API void* initialize(const char* model_entry, const char* model_config, int* state);

/*
 * Runs one serialized PredictRequest of input_size bytes.
 * Returns the status; *output_data / *output_size receive a malloc'd buffer holding the
 * serialized PredictResponse (200) or the error message (otherwise).
 * input_size == 0 (input_data may then be NULL) is a ping: 200 and a JSON description of
 * the serving signature, as in DeepRec.
 * If output_data or output_size is NULL the call returns 400 and writes nothing.
 */
PROCESSOR_API int process(void* model_buf, const void* input_data, int input_size,
                          void** output_data, int* output_size);

/*
 * Runs `count` independent requests in one call (the processor may execute them together).
 * For every i in [0, count): status[i] is the status of request i and output_data[i] /
 * output_size[i] its malloc'd response or message, exactly as process() would give them;
 * the caller frees every output_data[i].
 * Returns 200 when every request succeeded, otherwise the first non-200 status[i].
 * If count < 0, or count > 0 and input_data, input_size, output_data, output_size or status
 * is NULL, nothing is written and 400 is returned. count == 0 returns 200.
 * A single bad entry (input_data[i] NULL with input_size[i] > 0, or input_size[i] < 0) gets
 * status[i] = 400 with a message; the other entries are still processed.
 * (DeepRec declared a batch_process whose batch size could not be known; this one takes the
 * count explicitly and returns one status per request.)
 */
PROCESSOR_API int batch_process(void* model_buf, int count, const void* const* input_data,
                                const int* input_size, void** output_data, int* output_size,
                                int* status);

/*
 * Returns 200 and a serialized ServingModelInfo{model_path}: the prefix of the full
 * checkpoint being served (e.g. ".../model.ckpt-100"), or an error status and message.
 */
PROCESSOR_API int get_serving_model_info(void* model_buf, void** output_data, int* output_size);

/*
 * Releases the model. Call once, after all other calls on model_buf have returned; NULL
 * and already finalized handles are ignored.
 */
PROCESSOR_API void finalize(void* model_buf);

/* Frees a buffer returned by this library (same as free()). NULL is ignored. */
PROCESSOR_API void processor_free(void* buffer);

/* Returns PROCESSOR_ABI_VERSION of the library. Needs no initialize() and no Python. */
PROCESSOR_API int processor_abi_version(void);

/*
 * Message of the last failed initialize() on the calling thread ("" if none). The pointer
 * stays valid until the next initialize() on the same thread.
 */
PROCESSOR_API const char* processor_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* SERVING_PROCESSOR_H_ */
