/* hp_error.c - the error record shared by every engine subsystem. */
#include "engine/hp_error.h"

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

const char *hp_status_str(int code)
{
    switch (code) {
    case HP_OK:
        return "ok";
    case HP_EBADINPUT:
        return "bad input";
    case HP_ETOOLARGE:
        return "too large";
    case HP_ENOMEM:
        return "out of memory";
    case HP_EMODEL:
        return "model error";
    case HP_EIO:
        return "i/o error";
    case HP_EBUSY:
        return "busy";
    case HP_EUNAVAIL:
        return "unavailable";
    case HP_ETIMEOUT:
        return "timeout";
    case HP_ECANCELLED:
        return "cancelled";
    default:
        return "internal error";
    }
}
