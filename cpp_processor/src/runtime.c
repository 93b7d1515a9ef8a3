/*
 * runtime.c -- the embedded interpreter and the Python thread states of the host's threads.
 *
 * Embedding rules (what a host sees of them is include/processor.h's "Embedded Python"; the
 * reason for each is given with it):
 *  - libpython is promoted to RTLD_GLOBAL before Python starts, so extension modules resolve
 *    their Py* symbols even when the host dlopen()ed us with RTLD_LOCAL;
 *  - the interpreter is started only if the process has none, with PyConfig.executable set
 *    to the environment's interpreter so site.py finds pyvenv.cfg, and without signal
 *    handlers; it is never finalized;
 *  - each OS thread gets one PyThreadState on its first call, kept until the thread exits
 *    (PyGILState_Ensure/Release on a thread with no state would create and destroy one per
 *    call, about 9 us); afterwards PyGILState_Ensure/Release only move the GIL.
 */
#include "sp_internal.h" /* first: Python.h precedes the standard headers */

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#ifndef SP_DEFAULT_PYTHON
#define SP_DEFAULT_PYTHON ""
#endif
#ifndef SP_LIBPYTHON_SONAME
#define SP_LIBPYTHON_SONAME ""
#endif

static pthread_mutex_t g_start_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_started;            /* interpreter running (ours or the host's), key created */
static int g_start_failed;       /* starting the interpreter failed; never retried */
static char g_start_error[SP_ERR_LEN];
static pthread_key_t g_tstate_key; /* PyThreadState* this library created for the thread */

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

PyGILState_STATE sp_gil_enter(void) {
  ensure_thread_state();
  return PyGILState_Ensure();
}

void sp_gil_leave(PyGILState_STATE s) { PyGILState_Release(s); }

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

int sp_ensure_started(char* err, size_t errlen) {
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
