/*
 * outputs.c -- output buffers: the malloc'd copies handed to the caller, and the 400 / 500
 * messages this library writes itself (prefixed SP_PREFIX). Needs no Python.
 */
#include "sp_internal.h" /* first: Python.h precedes the standard headers */

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sp_copy_out(void** out, int* out_size, const void* data, size_t n) {
  if (n > (size_t)INT_MAX) return -1;
  void* buf = malloc(n > 0 ? n : 1);
  if (buf == NULL) return -1;
  if (n > 0) memcpy(buf, data, n);
  *out = buf;
  *out_size = (int)n;
  return 0;
}

int sp_c_error(void** out, int* out_size, int status, const char* fmt, ...) {
  char msg[SP_ERR_LEN];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n >= sizeof msg) n = (int)sizeof msg - 1;
  if (sp_copy_out(out, out_size, msg, (size_t)n) != 0) {
    *out = NULL;
    *out_size = 0;
  }
  return status;
}

int sp_fill_error(int count, const int* skip, void** out, int* out_size, int* status, int code,
                  const char* msg) {
  for (int i = 0; i < count; ++i) {
    if (skip != NULL && skip[i]) continue;
    status[i] = sp_c_error(&out[i], &out_size[i], code, "%s", msg);
  }
  return code;
}
