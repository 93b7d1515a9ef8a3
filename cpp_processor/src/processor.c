/*
 * processor.c -- libserving_processor.so: a thin C shim over processor/abi.py.
 *
 * Each exported function checks its C arguments, converts them to Python objects, calls the
 * matching function of the Python module `processor.abi` (module name overridable with
 * SERVING_PROCESSOR_MODULE, a testing hook) and copies the result into a malloc'd buffer.
 * Every behaviour of a well-formed call comes from Python; this file only produces
 * 400 (bad C arguments) and 500 (its own failures), with messages prefixed SP_PREFIX.
 *
 * Embedding rules (see /work/shared/reference/measured-facts.md section 6 for the reasons):
 *  - libpython is promoted to RTLD_GLOBAL before Python starts, so extension modules resolve
 *    their Py* symbols even when the host dlopen()ed us with RTLD_LOCAL;
 *  - the interpreter is started only if the process has none, with PyConfig.executable set
 *    to the environment's interpreter so site.py finds pyvenv.cfg, and without signal
 *    handlers; it is never finalized;
 *  - each OS thread gets one PyThreadState on its first call, kept until the thread exits
 *    (PyGILState_Ensure/Release on a thread with no state would create and destroy one per
 *    call, about 9 us); afterwards PyGILState_Ensure/Release only move the GIL;
 *  - model handles live in a registry that is only touched with the GIL held, so a stale or
 *    foreign handle is answered with 400 instead of being dereferenced.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "processor.h"

#ifndef SP_DEFAULT_PYTHON
#define SP_DEFAULT_PYTHON ""
#endif
#ifndef SP_PROJECT_ROOT
#define SP_PROJECT_ROOT ""
#endif
#ifndef SP_LIBPYTHON_SONAME
#define SP_LIBPYTHON_SONAME ""
#endif

#define SP_PREFIX "[serving_processor] "
#define SP_DEFAULT_MODULE "processor.abi"
#define SP_ERR_LEN 4096

/* ------------------------------------------------------------------------------------ */
/* Output buffers                                                                         */
/* ------------------------------------------------------------------------------------ */

/* Copies n bytes into a fresh malloc'd buffer. Returns 0, or -1 (nothing written) on failure. */
static int copy_out(void** out, int* out_size, const void* data, size_t n) {
  if (n > (size_t)INT_MAX) return -1;
  void* buf = malloc(n > 0 ? n : 1);
  if (buf == NULL) return -1;
  if (n > 0) memcpy(buf, data, n);
  *out = buf;
  *out_size = (int)n;
  return 0;
}

/* Writes a message produced in C and returns `status`. */
static int c_error(void** out, int* out_size, int status, const char* fmt, ...) {
  char msg[SP_ERR_LEN];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof msg) n = (int)sizeof msg - 1;
  if (copy_out(out, out_size, msg, (size_t)n) != 0) {
    *out = NULL;
    *out_size = 0;
  }
  return status;
}

/* ------------------------------------------------------------------------------------ */
/* Runtime state                                                                          */
/* ------------------------------------------------------------------------------------ */

static pthread_mutex_t g_start_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_started;            /* interpreter running (ours or the host's), key created */
static int g_start_failed;       /* starting the interpreter failed; never retried */
static char g_start_error[SP_ERR_LEN];
static pthread_key_t g_tstate_key; /* PyThreadState* this library created for the thread */

/* Set once under the GIL, read with atomics; the function objects are immortal for us. */
static int g_ready;
static PyObject* g_fn_initialize;
static PyObject* g_fn_process;
static PyObject* g_fn_batch_process;
static PyObject* g_fn_info;
static PyObject* g_fn_finalize;

static int runtime_ready(void) { return __atomic_load_n(&g_ready, __ATOMIC_ACQUIRE); }

/* Last initialize() failure of this thread (fixed buffer: nothing to free at thread exit). */
static __thread char tl_last_error[SP_ERR_LEN];

static void set_last_error(const char* msg) {
  snprintf(tl_last_error, sizeof tl_last_error, "%s", msg);
}

/* Makes libpython's symbols global (see the file comment). */
static void promote_libpython(void) {
  if (SP_LIBPYTHON_SONAME[0] != '\0' &&
      dlopen(SP_LIBPYTHON_SONAME, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL) != NULL) {
    return; /* the handle is intentionally kept: libpython is never unloaded */
  }
  /* Fallback: whatever object provides Py_IsInitialized (a renamed or relocated libpython). */
  Dl_info info;
  if (dladdr((void*)&Py_IsInitialized, &info) != 0 && info.dli_fname != NULL) {
    (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
  }
}

#if PY_VERSION_HEX >= 0x030D0000
#define sp_is_finalizing() Py_IsFinalizing()
#else
#define sp_is_finalizing() _Py_IsFinalizing()
#endif

/* Thread exit: delete the thread state this library created for the thread. (Once the
 * interpreter is finalizing or finalized -- a Python host exiting -- it owns all states.) */
static void tstate_destructor(void* p) {
  PyThreadState* ts = (PyThreadState*)p;
  if (ts == NULL || !Py_IsInitialized() || sp_is_finalizing()) return;
  PyEval_RestoreThread(ts);
  PyThreadState_Clear(ts);
  PyThreadState_DeleteCurrent(); /* also releases the GIL */
}

/* Gives the calling OS thread a persistent Python thread state if it has none. */
static void ensure_thread_state(void) {
  if (PyGILState_GetThisThreadState() != NULL) return;
  (void)PyGILState_Ensure(); /* creates the state, takes the GIL, gilstate counter = 1 */
  PyThreadState* ts = PyThreadState_Get();
  (void)pthread_setspecific(g_tstate_key, ts);
  (void)PyEval_SaveThread(); /* releases the GIL; the counter stays 1, so the state lives */
}

static PyGILState_STATE gil_enter(void) {
  ensure_thread_state();
  return PyGILState_Ensure();
}

static void gil_leave(PyGILState_STATE s) { PyGILState_Release(s); }

static const char* python_executable(void) {
  const char* exe = getenv("SERVING_PROCESSOR_PYTHON");
  return (exe != NULL && exe[0] != '\0') ? exe : SP_DEFAULT_PYTHON;
}

/* Starts an interpreter for the configured environment. Caller holds g_start_mu.
 * Returns 0, -1 (nothing was started: a later call may retry) or -2 (Python failed to start
 * and cannot be started again in this process). */
static int start_interpreter(char* err, size_t errlen) {
  const char* exe = python_executable();
  if (exe[0] != '\0' && access(exe, X_OK) != 0) {
    snprintf(err, errlen,
             SP_PREFIX "Python interpreter '%s' not found or not executable (set "
                       "SERVING_PROCESSOR_PYTHON to the environment's bin/python)",
             exe);
    return -1;
  }
  /* A guest in the host's process: leave its locale, stdio and signal handlers alone. With the
   * locale untouched, UTF-8 mode keeps Python's encodings independent of the host's locale. */
  PyPreConfig pre;
  PyPreConfig_InitPythonConfig(&pre);
  pre.configure_locale = 0;
  pre.utf8_mode = 1;
  PyStatus st = Py_PreInitialize(&pre);
  if (PyStatus_Exception(st)) {
    snprintf(err, errlen, SP_PREFIX "cannot pre-initialize Python: %s",
             st.err_msg ? st.err_msg : "exit");
    return -2;
  }
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.install_signal_handlers = 0;
  config.configure_c_stdio = 0;
  config.parse_argv = 0;
  if (exe[0] != '\0') {
    /* executable (not its resolved target) so that site.py finds <venv>/pyvenv.cfg */
    st = PyConfig_SetBytesString(&config, &config.executable, exe);
    if (!PyStatus_Exception(st)) st = PyConfig_SetBytesString(&config, &config.program_name, exe);
  }
  if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(st)) {
    snprintf(err, errlen, SP_PREFIX "cannot start Python (%s): %s%s%s", exe,
             st.func ? st.func : "", st.func ? ": " : "", st.err_msg ? st.err_msg : "exit");
    return -2;
  }
  (void)PyEval_SaveThread(); /* the GIL is held only around calls */
  return 0;
}

/* Ensures an interpreter exists and this library's per-thread key is set up. */
static int ensure_started(char* err, size_t errlen) {
  pthread_mutex_lock(&g_start_mu);
  int rc = 0;
  if (g_start_failed) {
    snprintf(err, errlen, "%s", g_start_error);
    rc = -1;
  } else if (!g_started) {
    promote_libpython();
    if (!Py_IsInitialized()) rc = start_interpreter(err, errlen); /* else: join the host's */
    if (rc == 0 && pthread_key_create(&g_tstate_key, tstate_destructor) != 0) {
      snprintf(err, errlen, SP_PREFIX "pthread_key_create failed");
      rc = -2;
    }
    if (rc == 0) {
      g_started = 1;
    } else if (rc == -2) {
      g_start_failed = 1;
      snprintf(g_start_error, sizeof g_start_error, "%s", err);
    }
  }
  pthread_mutex_unlock(&g_start_mu);
  return rc;
}

/* ------------------------------------------------------------------------------------ */
/* Python helpers (all called with the GIL held)                                          */
/* ------------------------------------------------------------------------------------ */

/* Copies a str into buf (UTF-8); clears any error str() raised. */
static void str_into(PyObject* s, char* buf, size_t len, const char* fallback) {
  const char* u = NULL;
  if (s != NULL && PyUnicode_Check(s)) u = PyUnicode_AsUTF8(s);
  if (u == NULL) {
    PyErr_Clear();
    u = fallback;
  }
  snprintf(buf, len, "%s", u);
}

/*
 * Takes the pending Python exception and turns it into a status and a message.
 * A ProcessorError (anything with an int .code in 400..599 and a str .message) keeps its code
 * and message; any other exception is 500 with "<Type>: <str(exc)>".
 */
static int take_exception(const char* where, char* msg, size_t len) {
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  PyErr_Fetch(&type, &value, &tb);
  if (type == NULL) {
    snprintf(msg, len, SP_PREFIX "%s failed without an exception", where);
    return PROCESSOR_STATUS_INTERNAL;
  }
  PyErr_NormalizeException(&type, &value, &tb);
  int status = PROCESSOR_STATUS_INTERNAL;
  int done = 0;
  if (value != NULL) {
    PyObject* code = PyObject_GetAttrString(value, "code");
    PyObject* message = code ? PyObject_GetAttrString(value, "message") : NULL;
    PyErr_Clear();
    if (code != NULL && PyLong_Check(code) && message != NULL && PyUnicode_Check(message)) {
      long c = PyLong_AsLong(code);
      PyErr_Clear();
      if (c >= 400 && c <= 599) {
        status = (int)c;
        str_into(message, msg, len, "(unprintable message)");
        done = 1;
      }
    }
    Py_XDECREF(code);
    Py_XDECREF(message);
  }
  if (!done) {
    const char* tname = ((PyTypeObject*)type)->tp_name;
    PyObject* s = value ? PyObject_Str(value) : NULL;
    char text[SP_ERR_LEN];
    str_into(s, text, sizeof text, "(unprintable exception)");
    Py_XDECREF(s);
    if (text[0] != '\0')
      snprintf(msg, len, "%s: %s", tname, text);
    else
      snprintf(msg, len, "%s", tname);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
  return status;
}

/*
 * Turns one (status, payload) result of processor.abi into the C outputs.
 * Does not consume `res`. A malformed result is a 500 produced here.
 */
static int take_result(PyObject* res, const char* fn, void** out, int* out_size) {
  char msg[SP_ERR_LEN];
  if (res == NULL) {
    int status = take_exception(fn, msg, sizeof msg);
    return c_error(out, out_size, status, "%s", msg);
  }
  if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2) {
    return c_error(out, out_size, PROCESSOR_STATUS_INTERNAL,
                   SP_PREFIX "%s returned %s, expected a (status, payload) tuple", fn,
                   Py_TYPE(res)->tp_name);
  }
  PyObject* code = PyTuple_GET_ITEM(res, 0);
  PyObject* payload = PyTuple_GET_ITEM(res, 1);
  long status = PyLong_Check(code) ? PyLong_AsLong(code) : -1;
  if (status < 100 || status > 999) {
    PyErr_Clear();
    return c_error(out, out_size, PROCESSOR_STATUS_INTERNAL,
                   SP_PREFIX "%s returned an invalid status", fn);
  }
  const char* data = NULL;
  Py_ssize_t n = 0;
  if (PyBytes_Check(payload)) {
    data = PyBytes_AS_STRING(payload);
    n = PyBytes_GET_SIZE(payload);
  } else if (PyByteArray_Check(payload)) {
    data = PyByteArray_AS_STRING(payload);
    n = PyByteArray_GET_SIZE(payload);
  } else if (PyUnicode_Check(payload)) {
    data = PyUnicode_AsUTF8AndSize(payload, &n);
  }
  if (data == NULL) {
    PyErr_Clear();
    return c_error(out, out_size, PROCESSOR_STATUS_INTERNAL,
                   SP_PREFIX "%s returned a payload of type %s, expected bytes", fn,
                   Py_TYPE(payload)->tp_name);
  }
  if (copy_out(out, out_size, data, (size_t)n) != 0) {
    return c_error(out, out_size, PROCESSOR_STATUS_INTERNAL,
                   SP_PREFIX "cannot allocate a %zd-byte output buffer", n);
  }
  return (int)status;
}

/* Imports processor.abi and caches its functions. GIL held. */
static int load_module(char* err, size_t errlen) {
  if (runtime_ready()) return 0;
  const char* root = getenv("SERVING_PROCESSOR_ROOT");
  if (root == NULL || root[0] == '\0') root = SP_PROJECT_ROOT;
  if (root[0] != '\0') {
    PyObject* path = PySys_GetObject("path"); /* borrowed */
    PyObject* entry = PyUnicode_DecodeFSDefault(root);
    if (path != NULL && PyList_Check(path) && entry != NULL) {
      int has = PySequence_Contains(path, entry);
      if (has == 0) (void)PyList_Append(path, entry);
    }
    Py_XDECREF(entry);
    PyErr_Clear();
  }
  const char* modname = getenv("SERVING_PROCESSOR_MODULE");
  if (modname == NULL || modname[0] == '\0') modname = SP_DEFAULT_MODULE;
  char msg[SP_ERR_LEN];
  PyObject* mod = PyImport_ImportModule(modname);
  if (mod == NULL) {
    (void)take_exception("import", msg, sizeof msg);
    snprintf(err, errlen, SP_PREFIX "cannot import %s: %s", modname, msg);
    return -1;
  }
  int rc = -1;
  PyObject* version = PyObject_GetAttrString(mod, "ABI_VERSION");
  long v = version && PyLong_Check(version) ? PyLong_AsLong(version) : -1;
  Py_XDECREF(version);
  PyErr_Clear();
  const char* names[5] = {"initialize", "process", "batch_process", "get_serving_model_info",
                          "finalize"};
  PyObject* fns[5] = {NULL, NULL, NULL, NULL, NULL};
  if (v != PROCESSOR_ABI_VERSION) {
    snprintf(err, errlen, SP_PREFIX "%s.ABI_VERSION is %ld, this library implements %d",
             modname, v, PROCESSOR_ABI_VERSION);
    goto done;
  }
  for (int i = 0; i < 5; ++i) {
    fns[i] = PyObject_GetAttrString(mod, names[i]);
    if (fns[i] == NULL || !PyCallable_Check(fns[i])) {
      PyErr_Clear();
      snprintf(err, errlen, SP_PREFIX "%s has no function %s", modname, names[i]);
      goto done;
    }
  }
  if (!runtime_ready()) { /* another thread may have finished first while the GIL was free */
    g_fn_initialize = fns[0];
    g_fn_process = fns[1];
    g_fn_batch_process = fns[2];
    g_fn_info = fns[3];
    g_fn_finalize = fns[4];
    for (int i = 0; i < 5; ++i) fns[i] = NULL;
    __atomic_store_n(&g_ready, 1, __ATOMIC_RELEASE);
  }
  rc = 0;
done:
  for (int i = 0; i < 5; ++i) Py_XDECREF(fns[i]);
  Py_DECREF(mod);
  return rc;
}

/* ------------------------------------------------------------------------------------ */
/* Model handles: a registry touched only with the GIL held                              */
/* ------------------------------------------------------------------------------------ */

typedef struct sp_model {
  PyObject* handle; /* what processor.abi.initialize returned */
  struct sp_model* next;
} sp_model;

static sp_model* g_models;

static sp_model* find_model(void* p) {
  for (sp_model* m = g_models; m != NULL; m = m->next)
    if ((void*)m == p) return m;
  return NULL;
}

static sp_model* unlink_model(void* p) {
  for (sp_model** link = &g_models; *link != NULL; link = &(*link)->next) {
    if ((void*)*link == p) {
      sp_model* m = *link;
      *link = m->next;
      return m;
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------------------------ */
/* Exported functions                                                                     */
/* ------------------------------------------------------------------------------------ */

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
  if (ensure_started(err, sizeof err) != 0) return initialize_failed(err);

  PyGILState_STATE g = gil_enter();
  sp_model* model = NULL;
  err[0] = '\0';
  if (load_module(err, sizeof err) == 0) {
    PyObject* args[2];
    args[0] = PyUnicode_DecodeUTF8(model_entry, (Py_ssize_t)strlen(model_entry), "strict");
    args[1] = args[0] ? PyUnicode_DecodeUTF8(model_config, (Py_ssize_t)strlen(model_config),
                                             "strict")
                      : NULL;
    PyObject* handle = args[1] ? PyObject_Vectorcall(g_fn_initialize, args, 2, NULL) : NULL;
    Py_XDECREF(args[0]);
    Py_XDECREF(args[1]);
    if (handle == NULL) {
      (void)take_exception("initialize", err, sizeof err);
    } else if (handle == Py_None) {
      Py_DECREF(handle);
      snprintf(err, sizeof err, SP_PREFIX "processor.abi.initialize returned None");
    } else if ((model = (sp_model*)malloc(sizeof *model)) == NULL) {
      Py_DECREF(handle);
      snprintf(err, sizeof err, SP_PREFIX "out of memory");
    } else {
      model->handle = handle;
      model->next = g_models;
      g_models = model;
    }
  }
  gil_leave(g);
  if (model == NULL) return initialize_failed(err);
  fprintf(stderr, "[TensorFlow] Processor initialize success.\n");
  fflush(stderr);
  *state = 0;
  return model;
}

PROCESSOR_API int process(void* model_buf, const void* input_data, int input_size,
                          void** output_data, int* output_size) {
  if (output_data == NULL || output_size == NULL) return PROCESSOR_STATUS_BAD_REQUEST;
  *output_data = NULL;
  *output_size = 0;
  if (model_buf == NULL)
    return c_error(output_data, output_size, PROCESSOR_STATUS_BAD_REQUEST,
                   SP_PREFIX "model_buf is NULL");
  if (input_size < 0)
    return c_error(output_data, output_size, PROCESSOR_STATUS_BAD_REQUEST,
                   SP_PREFIX "input_size is negative (%d)", input_size);
  if (input_data == NULL && input_size > 0)
    return c_error(output_data, output_size, PROCESSOR_STATUS_BAD_REQUEST,
                   SP_PREFIX "input_data is NULL but input_size is %d", input_size);
  if (!runtime_ready())
    return c_error(output_data, output_size, PROCESSOR_STATUS_BAD_REQUEST,
                   SP_PREFIX "unknown model handle (no model was initialized)");

  PyGILState_STATE g = gil_enter();
  int status;
  sp_model* model = find_model(model_buf);
  if (model == NULL) {
    status = c_error(output_data, output_size, PROCESSOR_STATUS_BAD_REQUEST,
                     SP_PREFIX "unknown or finalized model handle");
  } else {
    PyObject* args[2];
    args[0] = model->handle;
    Py_INCREF(args[0]); /* a concurrent finalize() cannot free it under us */
    args[1] = PyBytes_FromStringAndSize(input_size > 0 ? (const char*)input_data : "",
                                        (Py_ssize_t)input_size);
    PyObject* res = args[1] ? PyObject_Vectorcall(g_fn_process, args, 2, NULL) : NULL;
    status = take_result(res, "processor.abi.process", output_data, output_size);
    Py_XDECREF(res);
    Py_XDECREF(args[1]);
    Py_DECREF(args[0]);
  }
  gil_leave(g);
  return status;
}

/* Gives every slot in [0, count) the same C-made error. */
static int fill_error(int count, const int* skip, void** out, int* out_size, int* status,
                      int code, const char* msg) {
  for (int i = 0; i < count; ++i) {
    if (skip != NULL && skip[i]) continue;
    status[i] = c_error(&out[i], &out_size[i], code, "%s", msg);
  }
  return code;
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
    return fill_error(count, NULL, output_data, output_size, status, PROCESSOR_STATUS_BAD_REQUEST,
                      SP_PREFIX "model_buf is NULL");
  if (!runtime_ready())
    return fill_error(count, NULL, output_data, output_size, status, PROCESSOR_STATUS_BAD_REQUEST,
                      SP_PREFIX "unknown model handle (no model was initialized)");

  /* Entries with bad C arguments are answered here; the rest go to Python. */
  int* bad = (int*)calloc((size_t)count, sizeof(int));
  int* index = (int*)malloc((size_t)count * sizeof(int));
  if (bad == NULL || index == NULL) {
    free(bad);
    free(index);
    return fill_error(count, NULL, output_data, output_size, status, PROCESSOR_STATUS_INTERNAL,
                      SP_PREFIX "out of memory");
  }
  int nvalid = 0;
  for (int i = 0; i < count; ++i) {
    if (input_size[i] < 0) {
      bad[i] = 1;
      status[i] = c_error(&output_data[i], &output_size[i], PROCESSOR_STATUS_BAD_REQUEST,
                          SP_PREFIX "input_size[%d] is negative (%d)", i, input_size[i]);
    } else if (input_data[i] == NULL && input_size[i] > 0) {
      bad[i] = 1;
      status[i] = c_error(&output_data[i], &output_size[i], PROCESSOR_STATUS_BAD_REQUEST,
                          SP_PREFIX "input_data[%d] is NULL but input_size[%d] is %d", i, i,
                          input_size[i]);
    } else {
      index[nvalid++] = i;
    }
  }

  if (nvalid > 0) {
    PyGILState_STATE g = gil_enter();
    sp_model* model = find_model(model_buf);
    PyObject* list = NULL;
    if (model == NULL) {
      fill_error(count, bad, output_data, output_size, status, PROCESSOR_STATUS_BAD_REQUEST,
                 SP_PREFIX "unknown or finalized model handle");
    } else if ((list = PyList_New(nvalid)) == NULL) {
      PyErr_Clear();
      fill_error(count, bad, output_data, output_size, status, PROCESSOR_STATUS_INTERNAL,
                 SP_PREFIX "out of memory");
    } else {
      int ok = 1;
      for (int j = 0; j < nvalid && ok; ++j) {
        int i = index[j];
        PyObject* b = PyBytes_FromStringAndSize(
            input_size[i] > 0 ? (const char*)input_data[i] : "", (Py_ssize_t)input_size[i]);
        if (b == NULL) ok = 0;
        else PyList_SET_ITEM(list, j, b);
      }
      PyObject* res = NULL;
      if (ok) {
        PyObject* args[2] = {model->handle, list};
        Py_INCREF(args[0]);
        res = PyObject_Vectorcall(g_fn_batch_process, args, 2, NULL);
        Py_DECREF(args[0]);
      }
      if (res == NULL) {
        char msg[SP_ERR_LEN];
        int code = take_exception("processor.abi.batch_process", msg, sizeof msg);
        fill_error(count, bad, output_data, output_size, status, code, msg);
      } else {
        PyObject* seq = PySequence_Fast(res, "");
        if (seq == NULL || PySequence_Fast_GET_SIZE(seq) != nvalid) {
          PyErr_Clear();
          char msg[SP_ERR_LEN];
          snprintf(msg, sizeof msg,
                   SP_PREFIX "processor.abi.batch_process returned %s, expected a list of %d "
                             "(status, payload) tuples",
                   Py_TYPE(res)->tp_name, nvalid);
          fill_error(count, bad, output_data, output_size, status, PROCESSOR_STATUS_INTERNAL,
                     msg);
        } else {
          PyObject** items = PySequence_Fast_ITEMS(seq);
          for (int j = 0; j < nvalid; ++j) {
            int i = index[j];
            status[i] = take_result(items[j], "processor.abi.batch_process", &output_data[i],
                                    &output_size[i]);
          }
        }
        Py_XDECREF(seq);
        Py_DECREF(res);
      }
      Py_DECREF(list);
    }
    gil_leave(g);
  }
  free(bad);
  free(index);
  for (int i = 0; i < count; ++i)
    if (status[i] != PROCESSOR_STATUS_OK) return status[i];
  return PROCESSOR_STATUS_OK;
}

PROCESSOR_API int get_serving_model_info(void* model_buf, void** output_data, int* output_size) {
  if (output_data == NULL || output_size == NULL) return PROCESSOR_STATUS_BAD_REQUEST;
  *output_data = NULL;
  *output_size = 0;
  if (model_buf == NULL)
    return c_error(output_data, output_size, PROCESSOR_STATUS_BAD_REQUEST,
                   SP_PREFIX "model_buf is NULL");
  if (!runtime_ready())
    return c_error(output_data, output_size, PROCESSOR_STATUS_BAD_REQUEST,
                   SP_PREFIX "unknown model handle (no model was initialized)");
  PyGILState_STATE g = gil_enter();
  int status;
  sp_model* model = find_model(model_buf);
  if (model == NULL) {
    status = c_error(output_data, output_size, PROCESSOR_STATUS_BAD_REQUEST,
                     SP_PREFIX "unknown or finalized model handle");
  } else {
    PyObject* handle = model->handle;
    Py_INCREF(handle);
    PyObject* res = PyObject_Vectorcall(g_fn_info, &handle, 1, NULL);
    status = take_result(res, "processor.abi.get_serving_model_info", output_data, output_size);
    Py_XDECREF(res);
    Py_DECREF(handle);
  }
  gil_leave(g);
  return status;
}

PROCESSOR_API void finalize(void* model_buf) {
  if (model_buf == NULL || !runtime_ready()) return;
  PyGILState_STATE g = gil_enter();
  sp_model* model = unlink_model(model_buf);
  if (model != NULL) {
    PyObject* res = PyObject_Vectorcall(g_fn_finalize, &model->handle, 1, NULL);
    if (res == NULL) {
      char msg[SP_ERR_LEN];
      (void)take_exception("finalize", msg, sizeof msg);
      fprintf(stderr, SP_PREFIX "finalize failed: %s\n", msg);
    }
    Py_XDECREF(res);
    Py_DECREF(model->handle);
    free(model);
  }
  gil_leave(g);
}
