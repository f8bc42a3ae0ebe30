/* hp_error.c - the error record shared by every engine subsystem. */
#include "engine/contract/hp_error.h"

#include <stdarg.h>
#include <stdio.h>

int hp_error_set(hp_error_t *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->code = code;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
    }
    return code;
}
