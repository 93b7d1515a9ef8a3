/*
 * bridge.c -- the Python side of each call: imports processor.abi, caches its functions, and
 * turns what they return or raise into a status and a malloc'd output. Everything but
 * sp_runtime_ready() is called with the GIL held.
 *
 * The module is fixed at build time (SP_ABI_MODULE): the library always loads processor.abi.
 * Only the test build (CMake target serving_processor_testing, build/testing/) is compiled
 * with the stand-in tests/e2e/c_abi_fake_abi.py instead; no environment variable changes it.
 */
#include "sp_internal.h" /* first: Python.h precedes the standard headers */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef SP_PROJECT_ROOT
#define SP_PROJECT_ROOT ""
#endif

#ifndef SP_ABI_MODULE
#define SP_ABI_MODULE "processor.abi"
#endif

/* Python logger of the 500s this library makes itself (see sp_log_error). */
#define SP_LOGGER "serving_processor"

/* Set once under the GIL, read with atomics; the function objects are immortal for us. */
static int g_ready;
static PyObject* g_fns[SP_FN_COUNT];
/* The direct path (native/src/direct_api.h), optional: processor.abi.direct_front, and the table
 * of processor._native (whose module is kept imported, so the table stays valid). */
static PyObject* g_direct_front_fn;
static const sp_direct_api* g_direct_api;

static const char* const g_fn_names[SP_FN_COUNT] = {
    [SP_FN_INITIALIZE] = "initialize",
    [SP_FN_PROCESS] = "process",
    [SP_FN_BATCH_PROCESS] = "batch_process",
    [SP_FN_INFO] = "get_serving_model_info",
    [SP_FN_FINALIZE] = "finalize",
};

int sp_runtime_ready(void) { return __atomic_load_n(&g_ready, __ATOMIC_ACQUIRE); }

PyObject* sp_fn(sp_fn_id id) { return g_fns[id]; }

int sp_status_documented(long status) {
  switch (status) {
    case PROCESSOR_STATUS_OK:
    case PROCESSOR_STATUS_BAD_REQUEST:
    case PROCESSOR_STATUS_NOT_FOUND:
    case PROCESSOR_STATUS_INTERNAL:
    case PROCESSOR_STATUS_UNAVAILABLE:
      return 1;
    default:
      return 0;
  }
}

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

void sp_log_error(const char* msg, PyObject* exc) {
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  PyErr_Fetch(&type, &value, &tb); /* keep whatever is pending out of the way */
  int ok = 0;
  PyObject* logging = PyImport_ImportModule("logging");
  PyObject* logger = logging ? PyObject_CallMethod(logging, "getLogger", "s", SP_LOGGER) : NULL;
  PyObject* error = logger ? PyObject_GetAttrString(logger, "error") : NULL;
  PyObject* args = error ? Py_BuildValue("(ss)", "%s", msg) : NULL;
  PyObject* kwargs = args ? PyDict_New() : NULL;
  if (kwargs != NULL && exc != NULL && PyExceptionInstance_Check(exc) &&
      PyDict_SetItemString(kwargs, "exc_info", exc) != 0) {
    Py_CLEAR(kwargs);
  }
  if (kwargs != NULL) {
    PyObject* r = PyObject_Call(error, args, kwargs);
    ok = r != NULL;
    Py_XDECREF(r);
  }
  Py_XDECREF(kwargs);
  Py_XDECREF(args);
  Py_XDECREF(error);
  Py_XDECREF(logger);
  Py_XDECREF(logging);
  if (!ok) { /* no logging (the interpreter is shutting down, out of memory): plain stderr */
    PyErr_Clear();
    fprintf(stderr, "%s\n", msg);
    fflush(stderr);
  }
  PyErr_Restore(type, value, tb);
}

/*
 * A ProcessorError -- a str .message and an int .edge.c_abi, processor/errors.py's STATUS_TABLE
 * row -- keeps its status and message when processor.h documents that status; otherwise the
 * status is 500: "<message> (status N, which processor.h does not define)" for a
 * ProcessorError, "<Type>: <str(exc)>" for any other exception. Those 500s are logged here, with
 * the traceback; a ProcessorError was answered (and, when internal, logged) by Python's edge.
 */
int sp_take_exception(const char* where, char* msg, size_t len) {
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  PyErr_Fetch(&type, &value, &tb);
  if (type == NULL) {
    snprintf(msg, len, SP_PREFIX "%s failed without an exception", where);
    sp_log_error(msg, NULL);
    return PROCESSOR_STATUS_INTERNAL;
  }
  PyErr_NormalizeException(&type, &value, &tb);
  if (value != NULL && tb != NULL) (void)PyException_SetTraceback(value, tb);
  int status = PROCESSOR_STATUS_INTERNAL;
  int done = 0;
  if (value != NULL) {
    PyObject* edge = PyObject_GetAttrString(value, "edge");
    PyObject* c_abi = edge ? PyObject_GetAttrString(edge, "c_abi") : NULL;
    PyObject* message = c_abi ? PyObject_GetAttrString(value, "message") : NULL;
    PyErr_Clear();
    if (c_abi != NULL && PyLong_Check(c_abi) && message != NULL && PyUnicode_Check(message)) {
      long c = PyLong_AsLong(c_abi);
      PyErr_Clear();
      str_into(message, msg, len, "(unprintable message)");
      done = 1;
      if (c != PROCESSOR_STATUS_OK && sp_status_documented(c)) {
        status = (int)c;
      } else {
        char text[SP_ERR_LEN];
        snprintf(text, sizeof text, "%s", msg);
        snprintf(msg, len, SP_PREFIX "%s: %s (status %ld, which processor.h does not define)",
                 where, text, c);
        sp_log_error(msg, value);
      }
    }
    Py_XDECREF(edge);
    Py_XDECREF(c_abi);
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
    char line[SP_ERR_LEN];
    snprintf(line, sizeof line, SP_PREFIX "%s raised %s", where, msg);
    sp_log_error(line, value);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
  return status;
}

int sp_internal_error(void** out, int* out_size, const char* fmt, ...) {
  char msg[SP_ERR_LEN];
  va_list ap;
  va_start(ap, fmt);
  (void)vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  sp_log_error(msg, NULL);
  return sp_c_error(out, out_size, PROCESSOR_STATUS_INTERNAL, "%s", msg);
}

/* A malformed result is a 500 produced (and logged) here. */
int sp_take_result(PyObject* res, const char* fn, void** out, int* out_size) {
  char msg[SP_ERR_LEN];
  if (res == NULL) {
    int status = sp_take_exception(fn, msg, sizeof msg);
    return sp_c_error(out, out_size, status, "%s", msg);
  }
  if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2) {
    return sp_internal_error(out, out_size,
                             SP_PREFIX "%s returned %s, expected a (status, payload) tuple", fn,
                             Py_TYPE(res)->tp_name);
  }
  PyObject* code = PyTuple_GET_ITEM(res, 0);
  PyObject* payload = PyTuple_GET_ITEM(res, 1);
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
  if (data == NULL) PyErr_Clear();
  if (!PyLong_Check(code)) {
    return sp_internal_error(out, out_size, SP_PREFIX "%s returned an invalid status", fn);
  }
  long status = PyLong_AsLong(code);
  if (status == -1 && PyErr_Occurred()) PyErr_Clear();
  if (!sp_status_documented(status)) {
    /* Only the statuses processor.h lists reach the host; the 500 keeps the message. */
    int shown = data == NULL ? 0 : n > 1024 ? 1024 : (int)n;
    return sp_internal_error(out, out_size,
                             SP_PREFIX "%s returned status %ld, which processor.h does not "
                                       "define: %.*s",
                             fn, status, shown, data == NULL ? "" : data);
  }
  if (data == NULL) {
    return sp_internal_error(out, out_size,
                             SP_PREFIX "%s returned a payload of type %s, expected bytes", fn,
                             Py_TYPE(payload)->tp_name);
  }
  if (sp_copy_out(out, out_size, data, (size_t)n) != 0) {
    return sp_internal_error(out, out_size, SP_PREFIX "cannot allocate a %zd-byte output buffer",
                             n);
  }
  return (int)status;
}

/* Puts the project root (SERVING_PROCESSOR_ROOT, else the build's) on sys.path. */
static void add_project_root(void) {
  const char* root = getenv("SERVING_PROCESSOR_ROOT");
  if (root == NULL || root[0] == '\0') root = SP_PROJECT_ROOT;
  if (root[0] == '\0') return;
  PyObject* path = PySys_GetObject("path"); /* borrowed */
  PyObject* entry = PyUnicode_DecodeFSDefault(root);
  if (path != NULL && PyList_Check(path) && entry != NULL) {
    int has = PySequence_Contains(path, entry);
    if (has == 0) (void)PyList_Append(path, entry);
  }
  Py_XDECREF(entry);
  PyErr_Clear();
}

/* The direct path's parts, where both exist (a stand-in module has none): every call then goes
 * through processor.abi. Nothing here fails the load. */
static void load_direct_path(PyObject* abi) {
  PyObject* fn = PyObject_GetAttrString(abi, "direct_front");
  PyObject* native = fn != NULL ? PyImport_ImportModule("processor._native") : NULL;
  PyObject* table = native != NULL ? PyObject_GetAttrString(native, "direct_api") : NULL;
  const sp_direct_api* api =
      table != NULL ? (const sp_direct_api*)PyCapsule_GetPointer(table, SP_DIRECT_API_CAPSULE) : NULL;
  PyErr_Clear();
  Py_XDECREF(table);
  if (fn != NULL && api != NULL && api->abi >= 1 && PyCallable_Check(fn)) {
    g_direct_front_fn = fn; /* both kept for the life of the process */
    __atomic_store_n(&g_direct_api, api, __ATOMIC_RELEASE);
  } else {
    Py_XDECREF(fn);
    Py_XDECREF(native);
  }
}

const sp_direct_api* sp_direct_api_table(void) { return __atomic_load_n(&g_direct_api, __ATOMIC_ACQUIRE); }

PyObject* sp_direct_front(PyObject* handle, void** front) {
  if (g_direct_front_fn == NULL) return NULL;
  PyObject* capsule = PyObject_CallOneArg(g_direct_front_fn, handle);
  if (capsule == NULL || !PyCapsule_IsValid(capsule, SP_DIRECT_FRONT_CAPSULE)) {
    PyErr_Clear(); /* None (no direct path for this model), or something else: not used */
    Py_XDECREF(capsule);
    return NULL;
  }
  *front = PyCapsule_GetPointer(capsule, SP_DIRECT_FRONT_CAPSULE);
  return capsule;
}

int sp_load_module(char* err, size_t errlen) {
  if (sp_runtime_ready()) return 0;
  add_project_root();
  const char* modname = SP_ABI_MODULE;
  char msg[SP_ERR_LEN];
  PyObject* mod = PyImport_ImportModule(modname);
  if (mod == NULL) {
    (void)sp_take_exception("import", msg, sizeof msg);
    snprintf(err, errlen, SP_PREFIX "cannot import %s: %s", modname, msg);
    return -1;
  }
  int rc = -1;
  PyObject* version = PyObject_GetAttrString(mod, "ABI_VERSION");
  long v = version && PyLong_Check(version) ? PyLong_AsLong(version) : -1;
  Py_XDECREF(version);
  PyErr_Clear();
  PyObject* fns[SP_FN_COUNT] = {NULL};
  if (v != PROCESSOR_ABI_VERSION) {
    snprintf(err, errlen, SP_PREFIX "%s.ABI_VERSION is %ld, this library implements %d",
             modname, v, PROCESSOR_ABI_VERSION);
    goto done;
  }
  for (int i = 0; i < SP_FN_COUNT; ++i) {
    fns[i] = PyObject_GetAttrString(mod, g_fn_names[i]);
    if (fns[i] == NULL || !PyCallable_Check(fns[i])) {
      PyErr_Clear();
      snprintf(err, errlen, SP_PREFIX "%s has no function %s", modname, g_fn_names[i]);
      goto done;
    }
  }
  if (!sp_runtime_ready()) { /* another thread may have finished first while the GIL was free */
    for (int i = 0; i < SP_FN_COUNT; ++i) {
      g_fns[i] = fns[i];
      fns[i] = NULL;
    }
    load_direct_path(mod);
    __atomic_store_n(&g_ready, 1, __ATOMIC_RELEASE);
  }
  rc = 0;
done:
  for (int i = 0; i < SP_FN_COUNT; ++i) Py_XDECREF(fns[i]);
  Py_DECREF(mod);
  return rc;
}
