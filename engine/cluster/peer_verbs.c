/*
 * peer_verbs.c - RDMA verbs for the peer transport: a probe only.
 *
 * NOT a working transport. Where <infiniband/verbs.h> exists at build
 * time, hp_peer_verbs_probe loads libibverbs at run time (no link-time
 * dependency) and counts the devices ibv_get_device_list reports;
 * elsewhere it says it was built without verbs. Segment transfer over
 * RDMA (registered pool arena, one-sided reads) needs hardware to write
 * and test against, and is left for a machine that has it; TCP
 * (peer_tcp.c) is the transport in every case.
 */
#include "engine/cluster/peer.h"

#include <errno.h>
#include <string.h>

/* cppcheck cannot evaluate __has_include: it checks the stub */
#if defined(__has_include) && !defined(__CPPCHECK__)
#if __has_include(<infiniband/verbs.h>)
#define HP_HAVE_VERBS 1
#endif
#endif

#ifdef HP_HAVE_VERBS
#include <dlfcn.h>
#include <infiniband/verbs.h>

typedef struct ibv_device **(*get_list_fn)(int *);
typedef void (*free_list_fn)(struct ibv_device **);

int hp_peer_verbs_probe(hp_error_t *err)
{
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return hp_error_set(err, HP_EUNAVAIL, "rdma: libibverbs: %s",
                            dlerror());
    get_list_fn get = (get_list_fn)dlsym(lib, "ibv_get_device_list");
    free_list_fn put = (free_list_fn)dlsym(lib, "ibv_free_device_list");
    if (!get || !put) {
        dlclose(lib);
        return hp_error_set(err, HP_EUNAVAIL,
                            "rdma: libibverbs lacks the device list calls");
    }
    int n = 0;
    errno = 0;
    struct ibv_device **list = get(&n);
    int e = errno;
    if (list)
        put(list);
    dlclose(lib);
    if (!list || n <= 0)
        return hp_error_set(err, HP_EUNAVAIL, "rdma: no devices (%s)",
                            list ? "empty list"
                            : e  ? strerror(e)
                                 : "no list");
    return n;
}

#else

int hp_peer_verbs_probe(hp_error_t *err)
{
    return hp_error_set(err, HP_EUNAVAIL,
                        "rdma: built without <infiniband/verbs.h>");
}

#endif
