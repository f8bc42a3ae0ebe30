/*
 * test_index.c - the Redis segment index against a real redis-server on a
 * private loopback port: registration, removal, heartbeat, Redis down
 * (the engine keeps going) and back (everything held is re-registered).
 */
#include <hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/cluster/index.h"
#include "engine/contract/hp_seg.h"
#include "t/lib/tap.h"

static pid_t start_redis(int port, const char *dir)
{
    char p[16];
    snprintf(p, sizeof(p), "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout))
            _exit(126);
        execlp("redis-server", "redis-server", "--port", p, "--bind",
               "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
               (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100; i++) { /* until it answers */
        redisContext *c = redisConnect("127.0.0.1", port);
        int up = c && !c->err;
        if (c)
            redisFree(c);
        if (up)
            return pid;
        usleep(50000);
    }
    return -1;
}

static void stop_redis(pid_t pid)
{
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* Is `node` in the set of segment i (polls up to ~10 s for `want`)? */
static int member(int port, const uint8_t id[16], int want)
{
    char hex[33], key[128];
    hp_seg_id_hex(hex, id);
    snprintf(key, sizeof(key), "hypic:m:seg:%s", hex);
    for (int i = 0; i < 200; i++) { /* up to 10 s: covers the back-off */
        redisContext *c = redisConnect("127.0.0.1", port);
        int is = 0;
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "SISMEMBER %s n1", key);
            is = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
            if (r)
                freeReplyObject(r);
        }
        if (c)
            redisFree(c);
        if (is == want)
            return is;
        usleep(50000);
    }
    return !want;
}

static int ttl_of(int port, const char *key)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    redisReply *r = c && !c->err ? redisCommand(c, "TTL %s", key) : NULL;
    int t = r && r->type == REDIS_REPLY_INTEGER ? (int)r->integer : -3;
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return t;
}

int main(void)
{
    if (system("command -v redis-server >/dev/null 2>&1") != 0) {
        tap_skip("redis-server not installed");
        return tap_done();
    }
    char dir[] = "/tmp/hypic-index-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    int port = 20000 + rand() % 20000;
    pid_t redis = start_redis(port, dir);
    if (!ok(redis > 0, "redis-server up on port %d", port))
        return tap_done();

    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    hp_index_config_t cfg = {addr, "m", "n1", "10.0.0.1:7000",
                             30,   200, NULL, NULL};
    hp_error_t err = {0};
    hp_index_t *ix = hp_index_start(&cfg, &err);
    ok(ix != NULL, "index started");

    uint8_t a[16] = {1}, b[16] = {2}, c[16] = {3};
    hp_index_add(ix, a);
    hp_index_add(ix, b);
    ok(member(port, a, 1) && member(port, b, 1),
       "added segments are registered under this node");
    char hex[33], key[128];
    hp_seg_id_hex(hex, a);
    snprintf(key, sizeof(key), "hypic:m:seg:%s", hex);
    int t = ttl_of(port, key);
    ok(t > 0 && t <= 30, "segment key expires (ttl %d)", t);
    int hb = 0;
    for (int i = 0; i < 100 && hb <= 0; i++, usleep(50000))
        hb = ttl_of(port, "hypic:m:node:n1");
    ok(hb > 0, "node heartbeat key present with expiry (ttl %d)", hb);

    hp_index_remove(ix, b);
    ok(member(port, b, 0) == 0, "removed segment is gone");

    /* Redis down: calls still return at once, nothing crashes */
    stop_redis(redis);
    hp_index_add(ix, c);
    for (int i = 0; i < 10000; i++) { /* overflow the queue on purpose */
        uint8_t x[16] = {9};
        memcpy(x + 1, &i, sizeof(i));
        hp_index_add(ix, x);
        hp_index_remove(ix, x);
    }
    hp_index_stats_t st;
    usleep(400000);
    hp_index_stats(ix, &st);
    ok(!st.connected && st.errors > 0, "redis down is noticed (%llu errors)",
       (unsigned long long)st.errors);
    ok(st.held == 2, "held set is a, c (%d)", st.held);

    /* back: every held segment is registered again */
    redis = start_redis(port, dir);
    ok(redis > 0, "redis-server restarted (empty)");
    ok(member(port, a, 1) && member(port, c, 1) && !member(port, b, 0),
       "after recovery a and c are registered again, b is not");
    hp_index_stats(ix, &st);
    ok(st.reconnects >= 1, "one reconnect counted (%llu)",
       (unsigned long long)st.reconnects);

    hp_index_stop(ix);
    stop_redis(redis);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        tap_diag("could not remove %s", dir);

    hp_index_config_t bad = cfg;
    bad.redis = "no-port";
    ok(hp_index_start(&bad, &err) == NULL && err.code == HP_EBADINPUT,
       "a bad address is refused: %s", err.msg);
    return tap_done();
}
