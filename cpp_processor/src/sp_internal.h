/*
 * sp_internal.h -- what the modules of libserving_processor.so share; not installed.
 *
 *   outputs.c   malloc'd output buffers and the messages the library writes itself
 *   runtime.c   the embedded interpreter (start or join) and per-thread Python states
 *   bridge.c    processor.abi's functions, Python results / exceptions turned into C, and
 *               the log record of every 500 the library makes
 *   registry.c  the model handles given out by initialize()
 *   processor.c the exported functions of processor.h
 *
 * Every symbol here is hidden (-fvisibility=hidden): only processor.h's functions are exported.
 */
#ifndef SP_INTERNAL_H_
#define SP_INTERNAL_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

#include "direct_api.h" /* processor._native's direct path (native/src/direct_api.h) */
#include "processor.h"

#define SP_PREFIX "[serving_processor] "
#define SP_ERR_LEN 4096

/* --- outputs.c ------------------------------------------------------------------------ */

/* Copies n bytes into a fresh malloc'd buffer. Returns 0, or -1 (nothing written) on failure. */
int sp_copy_out(void** out, int* out_size, const void* data, size_t n);

/* Writes a message produced in C and returns `status`. */
int sp_c_error(void** out, int* out_size, int status, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Gives every slot in [0, count) not marked in `skip` (may be NULL) the same C-made error;
 * returns `code`. */
int sp_fill_error(int count, const int* skip, void** out, int* out_size, int* status, int code,
                  const char* msg);

/* --- runtime.c ------------------------------------------------------------------------ */

/* Ensures an interpreter exists (starting one, or joining the host's) and this library's
 * per-thread key is set up. Returns 0, or non-zero with a message in err. */
int sp_ensure_started(char* err, size_t errlen);

/* Takes the GIL for the calling thread, giving it a persistent thread state on first use. */
PyGILState_STATE sp_gil_enter(void);
void sp_gil_leave(PyGILState_STATE s);

/* --- bridge.c (all but sp_runtime_ready called with the GIL held) ----------------------- */

typedef enum {
  SP_FN_INITIALIZE,
  SP_FN_PROCESS,
  SP_FN_BATCH_PROCESS,
  SP_FN_INFO,
  SP_FN_FINALIZE,
  SP_FN_COUNT
} sp_fn_id;

/* Whether processor.abi is imported and its functions cached (an atomic read). */
int sp_runtime_ready(void);

/* Imports processor.abi and caches its functions. Returns 0, or -1 with a message in err. */
int sp_load_module(char* err, size_t errlen);

/* A cached function of processor.abi; only once sp_runtime_ready(). */
PyObject* sp_fn(sp_fn_id id);

/* Whether processor.h documents `status` (PROCESSOR_STATUS_*): the only ones a host sees. */
int sp_status_documented(long status);

/* Logs one ERROR record on the Python logger "serving_processor", with exc's traceback when
 * exc is an exception (may be NULL); plain stderr if Python cannot log. Leaves any pending
 * Python error as it was. */
void sp_log_error(const char* msg, PyObject* exc);

/* Takes the pending Python exception and turns it into a status and a message (a ProcessorError
 * keeps its STATUS_TABLE c_abi status when processor.h documents it; anything else is a 500,
 * logged with its traceback). */
int sp_take_exception(const char* where, char* msg, size_t len);

/* A 500 made by this library: logs the message (sp_log_error), then writes it (sp_c_error). */
int sp_internal_error(void** out, int* out_size, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Turns one (status, payload) result of processor.abi into the C outputs (res may be NULL: the
 * pending exception). Does not consume `res`. */
int sp_take_result(PyObject* res, const char* fn, void** out, int* out_size);

/* The direct path's table (processor._native.direct_api), or NULL: the module or the table is
 * missing or of another SP_DIRECT_ABI (every call then goes through processor.abi). */
const sp_direct_api* sp_direct_api_table(void);

/* processor.abi.direct_front(handle): the model's direct-path front as a capsule (a new
 * reference) and its address in *front; NULL (nothing set) where the model has none. */
PyObject* sp_direct_front(PyObject* handle, void** front);

/* --- registry.c (GIL held, but for sp_direct_serve) ----------------------------------------- */

typedef struct sp_model {
  PyObject* handle;         /* what processor.abi.initialize returned */
  PyObject* direct_capsule; /* the direct path's front (keeps it alive), or NULL */
  void* direct_front;       /* its address, for sp_direct_api_table()->serve */
  struct sp_model* next;
} sp_model;

/* Registers a model owning `handle` (a new reference it takes over); NULL if out of memory,
 * and then `handle` is still the caller's. */
sp_model* sp_add_model(PyObject* handle);

/* The registered model at address p, or NULL (never initialized, or finalized). */
sp_model* sp_find_model(void* p);

/* Removes the model at address p from the registry and returns it (NULL if unknown); waits
 * (without the GIL) for the direct calls on it to end. */
sp_model* sp_unlink_model(void* p);

/* A process() call on the direct path, without the GIL: 200 with the response in *out, or 0
 * (not taken: no such model, no direct front, or the front did not take it; serve it through
 * processor.abi). The registry's read lock is held for the call, so finalize() waits for it. */
int sp_direct_serve(void* p, const void* data, int size, void** out, int* out_size);

#endif /* SP_INTERNAL_H_ */
