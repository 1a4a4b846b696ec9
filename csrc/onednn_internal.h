/* Shared by the oneDNN sources (onednn_conv.c, onednn_region.c), not part of the cffi API. */
#ifndef ONEDNN_INTERNAL_H
#define ONEDNN_INTERNAL_H

/* The library onednn_open loaded (a dlopen handle), or NULL before that. */
void *onednn_library(void);

#endif
