/*
 * processor.c -- libserving_processor.so: a thin C shim over processor/abi.py; the exported
 * functions of processor.h.
 *
 * Each exported function checks its C arguments, converts them to Python objects, calls the
 * matching function of the Python module `processor.abi` (bridge.c) and copies the result into
 * a malloc'd buffer. Every behaviour of a well-formed call comes from Python; the library only
 * produces 400 (bad C arguments) and 500 (its own failures, logged), with messages prefixed
 * SP_PREFIX, and passes on only the statuses processor.h documents.
 * How the interpreter is started or joined is in runtime.c; the handle registry in registry.c.
 */
#include "sp_internal.h" /* first: Python.h precedes the standard headers */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Last initialize() failure of this thread (fixed buffer: nothing to free at thread exit). */
static __thread char tl_last_error[SP_ERR_LEN];

static void set_last_error(const char* msg) {
  snprintf(tl_last_error, sizeof tl_last_error, "%s", msg);
}

PROCESSOR_API int processor_abi_version(void) { return PROCESSOR_ABI_VERSION; }

PROCESSOR_API void processor_free(void* buffer) { free(buffer); }

PROCESSOR_API const char* processor_last_error(void) { return tl_last_error; }

static void* initialize_failed(const char* msg) {
  set_last_error(msg);
  fprintf(stderr, "[TensorFlow] Processor initialize failed, status:%s\n", msg);
  fflush(stderr);
  return NULL;
}

PROCESSOR_API void* initialize(const char* model_entry, const char* model_config, int* state) {
  char err[SP_ERR_LEN];
  tl_last_error[0] = '\0';
  if (state == NULL) return initialize_failed(SP_PREFIX "state is NULL");
  *state = -1;
  if (model_config == NULL) return initialize_failed(SP_PREFIX "model_config is NULL");
  if (model_entry == NULL) model_entry = "";
  if (sp_ensure_started(err, sizeof err) != 0) return initialize_failed(err);

  PyGILState_STATE g = sp_gil_enter();
  sp_model* model = NULL;
  err[0] = '\0';
  if (sp_load_module(err, sizeof err) == 0) {
    PyObject* args[2];
    args[0] = PyUnicode_DecodeUTF8(model_entry, (Py_ssize_t)strlen(model_entry), "strict");
    /* surrogateescape: a config that is not UTF-8 reaches Python, which names it as such
     * (processor.config.decode_utf8) instead of failing here with a bare UnicodeDecodeError */
    args[1] = args[0] ? PyUnicode_DecodeUTF8(model_config, (Py_ssize_t)strlen(model_config),
                                             "surrogateescape")
                      : NULL;
    PyObject* handle =
        args[1] ? PyObject_Vectorcall(sp_fn(SP_FN_INITIALIZE), args, 2, NULL) : NULL;
    Py_XDECREF(args[0]);
    Py_XDECREF(args[1]);
    if (handle == NULL) {
      (void)sp_take_exception("initialize", err, sizeof err);
    } else if (handle == Py_None) {
      Py_DECREF(handle);
      snprintf(err, sizeof err, SP_PREFIX "processor.abi.initialize returned None");
    } else if ((model = sp_add_model(handle)) == NULL) {
      Py_DECREF(handle);
      snprintf(err, sizeof err, SP_PREFIX "out of memory");
    }
  }
  sp_gil_leave(g);
  if (model == NULL) return initialize_failed(err);
  fprintf(stderr, "[TensorFlow] Processor initialize success.\n");
  fflush(stderr);
  *state = 0;
  return model;
}

/*
 * The checks process() and get_serving_model_info() start with. Returns 0 when the call may go
 * on (the outputs are then cleared), else the status to return: 400 without output when the
 * output pointers are NULL, 400 with a message for a NULL handle.
 */
static int check_call(void* model_buf, void** out, int* out_size) {
  if (out == NULL || out_size == NULL) return PROCESSOR_STATUS_BAD_REQUEST;
  *out = NULL;
  *out_size = 0;
  if (model_buf == NULL)
    return sp_c_error(out, out_size, PROCESSOR_STATUS_BAD_REQUEST, SP_PREFIX "model_buf is NULL");
  return 0;
}

/*
 * A read-only memoryview of the host's request buffer: Python reads the request in place (the
 * native decoder parses it straight from the host's memory), no copy into a bytes object. Valid
 * only during the call: release_request() ends it before the host gets its buffer back.
 */
static PyObject* borrow_request(const char* input, int input_size) {
  return PyMemoryView_FromMemory((char*)input, (Py_ssize_t)input_size, PyBUF_READ);
}

/* Ends a borrow_request() view and drops it. Python code must not keep the view past the call;
 * if something still exports it, say so: the host is about to free that memory. */
static void release_request(PyObject* view) {
  if (view == NULL) return;
  PyObject* r = PyObject_CallMethod(view, "release", NULL);
  if (r == NULL) {
    char msg[SP_ERR_LEN];
    (void)sp_take_exception("memoryview.release", msg, sizeof msg);
    fprintf(stderr, SP_PREFIX "a request buffer is still in use after the call: %s\n", msg);
  }
  Py_XDECREF(r);
  Py_DECREF(view);
}

/*
 * Calls processor.abi's `fn` on the model behind model_buf -- fn(handle, view of input), or
 * fn(handle) when input is NULL; with `direct_tried`, fn(handle, view, True): the direct path
 * did not take it, so Python does not try it again -- and turns its (status, payload) into the
 * outputs. An unknown handle is answered with 400. The caller has checked its arguments
 * (check_call).
 */
static int call_model(void* model_buf, sp_fn_id fn, const char* fn_name, const char* input,
                      int input_size, int direct_tried, void** out, int* out_size) {
  if (!sp_runtime_ready())
    return sp_c_error(out, out_size, PROCESSOR_STATUS_BAD_REQUEST,
                      SP_PREFIX "unknown model handle (no model was initialized)");
  PyGILState_STATE g = sp_gil_enter();
  int status;
  sp_model* model = sp_find_model(model_buf);
  if (model == NULL) {
    status = sp_c_error(out, out_size, PROCESSOR_STATUS_BAD_REQUEST,
                        SP_PREFIX "unknown or finalized model handle");
  } else {
    PyObject* args[3] = {model->handle, NULL, Py_True};
    Py_INCREF(args[0]); /* a concurrent finalize() cannot free it under us */
    size_t nargs = 1;
    if (input != NULL) {
      args[1] = borrow_request(input, input_size);
      nargs = direct_tried ? 3 : 2;
    }
    PyObject* res = NULL;
    if (input == NULL || args[1] != NULL) res = PyObject_Vectorcall(sp_fn(fn), args, nargs, NULL);
    status = sp_take_result(res, fn_name, out, out_size);
    Py_XDECREF(res);
    release_request(args[1]);
    Py_DECREF(args[0]);
  }
  sp_gil_leave(g);
  return status;
}

PROCESSOR_API int process(void* model_buf, const void* input_data, int input_size,
                          void** output_data, int* output_size) {
  int rc = check_call(model_buf, output_data, output_size);
  if (rc != 0) return rc;
  if (input_size < 0)
    return sp_c_error(output_data, output_size, PROCESSOR_STATUS_BAD_REQUEST,
                      SP_PREFIX "input_size is negative (%d)", input_size);
  if (input_data == NULL && input_size > 0)
    return sp_c_error(output_data, output_size, PROCESSOR_STATUS_BAD_REQUEST,
                      SP_PREFIX "input_data is NULL but input_size is %d", input_size);
  /* A batching model's requests first try the direct path: queued on the native batching
   * queue without the GIL (processor/processor.py); what it does not take goes to Python. */
  int direct = input_size > 0 && sp_runtime_ready() && sp_direct_api_table() != NULL;
  if (direct && sp_direct_serve(model_buf, input_data, input_size, output_data, output_size) ==
                    PROCESSOR_STATUS_OK)
    return PROCESSOR_STATUS_OK;
  return call_model(model_buf, SP_FN_PROCESS, "processor.abi.process",
                    input_size > 0 ? (const char*)input_data : "", input_size, direct, output_data,
                    output_size);
}

PROCESSOR_API int batch_process(void* model_buf, int count, const void* const* input_data,
                                const int* input_size, void** output_data, int* output_size,
                                int* status) {
  if (count < 0) return PROCESSOR_STATUS_BAD_REQUEST;
  if (count == 0) return PROCESSOR_STATUS_OK;
  if (input_data == NULL || input_size == NULL || output_data == NULL || output_size == NULL ||
      status == NULL)
    return PROCESSOR_STATUS_BAD_REQUEST;
  for (int i = 0; i < count; ++i) {
    output_data[i] = NULL;
    output_size[i] = 0;
    status[i] = PROCESSOR_STATUS_INTERNAL;
  }
  if (model_buf == NULL)
    return sp_fill_error(count, NULL, output_data, output_size, status,
                         PROCESSOR_STATUS_BAD_REQUEST, SP_PREFIX "model_buf is NULL");
  if (!sp_runtime_ready())
    return sp_fill_error(count, NULL, output_data, output_size, status,
                         PROCESSOR_STATUS_BAD_REQUEST,
                         SP_PREFIX "unknown model handle (no model was initialized)");

  /* Entries with bad C arguments are answered here; the rest go to Python. */
  int* bad = (int*)calloc((size_t)count, sizeof(int));
  int* index = (int*)malloc((size_t)count * sizeof(int));
  if (bad == NULL || index == NULL) {
    free(bad);
    free(index);
    fprintf(stderr, SP_PREFIX "batch_process: out of memory\n"); /* no GIL here: not logged */
    return sp_fill_error(count, NULL, output_data, output_size, status, PROCESSOR_STATUS_INTERNAL,
                         SP_PREFIX "out of memory");
  }
  int nvalid = 0;
  for (int i = 0; i < count; ++i) {
    if (input_size[i] < 0) {
      bad[i] = 1;
      status[i] = sp_c_error(&output_data[i], &output_size[i], PROCESSOR_STATUS_BAD_REQUEST,
                             SP_PREFIX "input_size[%d] is negative (%d)", i, input_size[i]);
    } else if (input_data[i] == NULL && input_size[i] > 0) {
      bad[i] = 1;
      status[i] = sp_c_error(&output_data[i], &output_size[i], PROCESSOR_STATUS_BAD_REQUEST,
                             SP_PREFIX "input_data[%d] is NULL but input_size[%d] is %d", i, i,
                             input_size[i]);
    } else {
      index[nvalid++] = i;
    }
  }

  if (nvalid > 0) {
    PyGILState_STATE g = sp_gil_enter();
    sp_model* model = sp_find_model(model_buf);
    PyObject* list = NULL;
    if (model == NULL) {
      sp_fill_error(count, bad, output_data, output_size, status, PROCESSOR_STATUS_BAD_REQUEST,
                    SP_PREFIX "unknown or finalized model handle");
    } else if ((list = PyList_New(nvalid)) == NULL) {
      PyErr_Clear();
      sp_log_error(SP_PREFIX "batch_process: out of memory", NULL);
      sp_fill_error(count, bad, output_data, output_size, status, PROCESSOR_STATUS_INTERNAL,
                    SP_PREFIX "out of memory");
    } else {
      int ok = 1;
      for (int j = 0; j < nvalid && ok; ++j) {
        int i = index[j];
        PyObject* b =
            borrow_request(input_size[i] > 0 ? (const char*)input_data[i] : "", input_size[i]);
        if (b == NULL) ok = 0;
        else PyList_SET_ITEM(list, j, b);
      }
      PyObject* res = NULL;
      if (ok) {
        PyObject* args[2] = {model->handle, list};
        Py_INCREF(args[0]);
        res = PyObject_Vectorcall(sp_fn(SP_FN_BATCH_PROCESS), args, 2, NULL);
        Py_DECREF(args[0]);
      }
      if (res == NULL) {
        char msg[SP_ERR_LEN];
        int code = sp_take_exception("processor.abi.batch_process", msg, sizeof msg);
        sp_fill_error(count, bad, output_data, output_size, status, code, msg);
      } else {
        PyObject* seq = PySequence_Fast(res, "");
        if (seq == NULL || PySequence_Fast_GET_SIZE(seq) != nvalid) {
          PyErr_Clear();
          char msg[SP_ERR_LEN];
          snprintf(msg, sizeof msg,
                   SP_PREFIX "processor.abi.batch_process returned %s, expected a list of %d "
                             "(status, payload) tuples",
                   Py_TYPE(res)->tp_name, nvalid);
          sp_log_error(msg, NULL);
          sp_fill_error(count, bad, output_data, output_size, status, PROCESSOR_STATUS_INTERNAL,
                        msg);
        } else {
          PyObject** items = PySequence_Fast_ITEMS(seq);
          for (int j = 0; j < nvalid; ++j) {
            int i = index[j];
            status[i] = sp_take_result(items[j], "processor.abi.batch_process", &output_data[i],
                                       &output_size[i]);
          }
        }
        Py_XDECREF(seq);
        Py_DECREF(res);
      }
      for (int j = 0; j < nvalid; ++j) {
        PyObject* view = PyList_GET_ITEM(list, j);
        if (view != NULL) {
          Py_INCREF(view); /* release_request() drops one reference; the list keeps its own */
          release_request(view);
        }
      }
      Py_DECREF(list);
    }
    sp_gil_leave(g);
  }
  free(bad);
  free(index);
  for (int i = 0; i < count; ++i)
    if (status[i] != PROCESSOR_STATUS_OK) return status[i];
  return PROCESSOR_STATUS_OK;
}

PROCESSOR_API int get_serving_model_info(void* model_buf, void** output_data, int* output_size) {
  int rc = check_call(model_buf, output_data, output_size);
  if (rc != 0) return rc;
  return call_model(model_buf, SP_FN_INFO, "processor.abi.get_serving_model_info", NULL, 0, 0,
                    output_data, output_size);
}

PROCESSOR_API void finalize(void* model_buf) {
  if (model_buf == NULL || !sp_runtime_ready()) return;
  PyGILState_STATE g = sp_gil_enter();
  sp_model* model = sp_unlink_model(model_buf);
  if (model != NULL) {
    PyObject* res = PyObject_Vectorcall(sp_fn(SP_FN_FINALIZE), &model->handle, 1, NULL);
    if (res == NULL) {
      char msg[SP_ERR_LEN];
      (void)sp_take_exception("finalize", msg, sizeof msg);
      fprintf(stderr, SP_PREFIX "finalize failed: %s\n", msg);
    }
    Py_XDECREF(res);
    Py_XDECREF(model->direct_capsule);
    Py_DECREF(model->handle);
    free(model);
  }
  sp_gil_leave(g);
}
