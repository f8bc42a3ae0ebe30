/*
 * hp_error.h - status codes and the error record of the engine library.
 *
 * Library code never prints or exits: it fills an hp_error_t with one clear
 * message (naming the file and tensor where there is one) and returns a
 * negative status. The CLI prints err.msg; the service maps the status to
 * an HTTP status, type and code once, in hp_ipc_error (hp_ipc.h).
 */
#ifndef HP_ERROR_H
#define HP_ERROR_H

#include <stddef.h>

typedef enum {
    HP_OK = 0,
    HP_EBADINPUT = -1000, /* malformed request or argument */
    HP_ETOOLARGE,         /* over a configured limit */
    HP_ENOMEM,            /* allocation or budget exhausted */
    HP_EMODEL,            /* model directory broken or inconsistent */
    HP_EIO,               /* file system or socket error */
    HP_EBUSY,             /* queue full, try later */
    HP_EUNAVAIL,          /* a dependency (engine, peer, Redis) is down */
    HP_ETIMEOUT,
    HP_ECANCELLED,
    HP_EINTERNAL /* a state that cannot happen */
} hp_status_t;

typedef struct {
    int code;      /* hp_status_t */
    char msg[512]; /* human-readable, one line */
} hp_error_t;

/* Records code and a printf-style message; returns code for tail calls. */
int hp_error_set(hp_error_t *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
