/*
 * bridge.c -- the Python side of each call: imports processor.abi (module name overridable with
 * SERVING_PROCESSOR_MODULE, a testing hook), caches its functions, and turns what they return
 * or raise into a status and a malloc'd output. Everything but sp_runtime_ready() is called
 * with the GIL held.
 */
#include "sp_internal.h" /* first: Python.h precedes the standard headers */

#include <stdio.h>
#include <stdlib.h>

#ifndef SP_PROJECT_ROOT
#define SP_PROJECT_ROOT ""
#endif

#define SP_DEFAULT_MODULE "processor.abi"

/* Set once under the GIL, read with atomics; the function objects are immortal for us. */
static int g_ready;
static PyObject* g_fns[SP_FN_COUNT];

static const char* const g_fn_names[SP_FN_COUNT] = {
    [SP_FN_INITIALIZE] = "initialize",
    [SP_FN_PROCESS] = "process",
    [SP_FN_BATCH_PROCESS] = "batch_process",
    [SP_FN_INFO] = "get_serving_model_info",
    [SP_FN_FINALIZE] = "finalize",
};

int sp_runtime_ready(void) { return __atomic_load_n(&g_ready, __ATOMIC_ACQUIRE); }

PyObject* sp_fn(sp_fn_id id) { return g_fns[id]; }

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
 * A ProcessorError (anything with an int .code in 400..599 and a str .message) keeps its code
 * and message; any other exception is 500 with "<Type>: <str(exc)>".
 */
int sp_take_exception(const char* where, char* msg, size_t len) {
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

/* A malformed result is a 500 produced here. */
int sp_take_result(PyObject* res, const char* fn, void** out, int* out_size) {
  char msg[SP_ERR_LEN];
  if (res == NULL) {
    int status = sp_take_exception(fn, msg, sizeof msg);
    return sp_c_error(out, out_size, status, "%s", msg);
  }
  if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2) {
    return sp_c_error(out, out_size, PROCESSOR_STATUS_INTERNAL,
                      SP_PREFIX "%s returned %s, expected a (status, payload) tuple", fn,
                      Py_TYPE(res)->tp_name);
  }
  PyObject* code = PyTuple_GET_ITEM(res, 0);
  PyObject* payload = PyTuple_GET_ITEM(res, 1);
  long status = PyLong_Check(code) ? PyLong_AsLong(code) : -1;
  if (status < 100 || status > 999) {
    PyErr_Clear();
    return sp_c_error(out, out_size, PROCESSOR_STATUS_INTERNAL,
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
    return sp_c_error(out, out_size, PROCESSOR_STATUS_INTERNAL,
                      SP_PREFIX "%s returned a payload of type %s, expected bytes", fn,
                      Py_TYPE(payload)->tp_name);
  }
  if (sp_copy_out(out, out_size, data, (size_t)n) != 0) {
    return sp_c_error(out, out_size, PROCESSOR_STATUS_INTERNAL,
                      SP_PREFIX "cannot allocate a %zd-byte output buffer", n);
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

int sp_load_module(char* err, size_t errlen) {
  if (sp_runtime_ready()) return 0;
  add_project_root();
  const char* modname = getenv("SERVING_PROCESSOR_MODULE");
  if (modname == NULL || modname[0] == '\0') modname = SP_DEFAULT_MODULE;
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
    __atomic_store_n(&g_ready, 1, __ATOMIC_RELEASE);
  }
  rc = 0;
done:
  for (int i = 0; i < SP_FN_COUNT; ++i) Py_XDECREF(fns[i]);
  Py_DECREF(mod);
  return rc;
}
