/*
 * registry.c -- the model handles initialize() gave out. Lookups from Python-side calls happen
 * with the GIL held; a direct-path call (sp_direct_serve) looks its model up without the GIL,
 * so the registry also has a read-write lock: lookups read, initialize() and finalize() write
 * (taking it with the GIL released: a direct call holding the read lock may wait for a batch
 * that needs the GIL). A stale or foreign handle is answered with 400 instead of being
 * dereferenced.
 */
#define _GNU_SOURCE
#include "sp_internal.h" /* first: Python.h precedes the standard headers */

#include <pthread.h>
#include <stdlib.h>

static sp_model* g_models;
static pthread_rwlock_t g_lock;
static pthread_once_t g_lock_once = PTHREAD_ONCE_INIT;

static void init_lock(void) {
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  /* a stream of direct calls must not starve finalize() */
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&g_lock, &attr);
  pthread_rwlockattr_destroy(&attr);
}

/* The write lock, taken with the GIL released (the caller holds the GIL). */
static void write_lock(void) {
  pthread_once(&g_lock_once, init_lock);
  Py_BEGIN_ALLOW_THREADS
  pthread_rwlock_wrlock(&g_lock);
  Py_END_ALLOW_THREADS
}

static sp_model* find(void* p) {
  for (sp_model* m = g_models; m != NULL; m = m->next)
    if ((void*)m == p) return m;
  return NULL;
}

sp_model* sp_add_model(PyObject* handle) {
  sp_model* model = (sp_model*)malloc(sizeof *model);
  if (model == NULL) return NULL;
  model->handle = handle;
  model->direct_capsule = NULL;
  model->direct_front = NULL;
  if (sp_direct_api_table() != NULL) model->direct_capsule = sp_direct_front(handle, &model->direct_front);
  write_lock();
  model->next = g_models;
  g_models = model;
  pthread_rwlock_unlock(&g_lock);
  return model;
}

sp_model* sp_find_model(void* p) { return find(p); } /* GIL held: writers hold it too */

sp_model* sp_unlink_model(void* p) {
  write_lock();
  sp_model* found = NULL;
  for (sp_model** link = &g_models; *link != NULL; link = &(*link)->next) {
    if ((void*)*link == p) {
      found = *link;
      *link = found->next;
      break;
    }
  }
  pthread_rwlock_unlock(&g_lock);
  return found;
}

int sp_direct_serve(void* p, const void* data, int size, void** out, int* out_size) {
  const sp_direct_api* api = sp_direct_api_table();
  if (api == NULL) return 0;
  pthread_once(&g_lock_once, init_lock);
  pthread_rwlock_rdlock(&g_lock);
  sp_model* model = find(p);
  int status = model != NULL && model->direct_front != NULL
                   ? api->serve(model->direct_front, data, size, out, out_size)
                   : 0;
  pthread_rwlock_unlock(&g_lock);
  return status;
}
