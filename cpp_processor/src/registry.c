/*
 * registry.c -- the model handles initialize() gave out. The registry is only touched with the
 * GIL held, so a stale or foreign handle is answered with 400 instead of being dereferenced.
 */
#include "sp_internal.h" /* first: Python.h precedes the standard headers */

#include <stdlib.h>

static sp_model* g_models;

sp_model* sp_add_model(PyObject* handle) {
  sp_model* model = (sp_model*)malloc(sizeof *model);
  if (model == NULL) return NULL;
  model->handle = handle;
  model->next = g_models;
  g_models = model;
  return model;
}

sp_model* sp_find_model(void* p) {
  for (sp_model* m = g_models; m != NULL; m = m->next)
    if ((void*)m == p) return m;
  return NULL;
}

sp_model* sp_unlink_model(void* p) {
  for (sp_model** link = &g_models; *link != NULL; link = &(*link)->next) {
    if ((void*)*link == p) {
      sp_model* m = *link;
      *link = m->next;
      return m;
    }
  }
  return NULL;
}
