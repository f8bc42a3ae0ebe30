# Routing through the Redis segment index (hypic_routing cache_affinity):
# nginx asks Redis which nodes hold a request's segments and sends it to
# the node holding the most (here, or to a peer's nginx through
# hypic_peer); with Redis down, hanging or paused every request is still
# served here ("local-fallback"), with one error line per incident; A/B
# arms from split_clients. A real engine (models/test/qwen35-dense, node
# t-node) registers what it caches in a real redis-server; the peer is a
# second nginx whose node the test writes into Redis. Every wait is
# bounded and no check measures time.

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Time::HiRes qw(sleep);
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Redis;
use Hypic::Util qw(wait_until slurp);

our $MODEL = "$Hypic::Nginx::REPO/models/test/qwen35-dense";
our $SEP = '<|pic_sep|>';

my $why = Hypic::Engine->why_not || (-d $MODEL ? '' : "no $MODEL")
          || (`redis-server --version 2>&1` =~ /v=\d/ ? ''
              : 'no redis-server');
plan(skip_all => $why) if $why;

our $redis = Hypic::Redis->start;
our $engine = Hypic::Engine->start(
    args => ['--model', $MODEL, '--node', 't-node', '--slots', 8,
             '--redis', '127.0.0.1:' . $redis->port]);

# nginx names segments with the fingerprint the engine publishes in its
# shared segment (engine/contract/hp_ipc.h); without it nothing is looked up
if (open my $fh, '<:raw', '/dev/shm' . $engine->shm) {
    my $n = sysread($fh, my $head, 296);
    my $fp = substr($head // '', 280, 16);
    plan(skip_all => 'the engine does not publish its model fingerprint '
                     . '(hp_ipc_server_cfg_t.fingerprint in cmd_serve.c)')
        if ($n // 0) < 296 || $fp eq "\0" x 16;
}

# Redis for the blocks that take it away; the blackhole never answers
our $gone = Hypic::Redis->start;
$gone->stop;
our $paused = Hypic::Redis->start;
our $hole = Hypic::Redis->blackhole;

add_vars(ENGINE => 'hypic_engine tiny unix:' . $engine->socket
                   . ' model=tiny-1;',
         REDIS => '127.0.0.1:' . $redis->port,
         GONE => '127.0.0.1:' . $gone->port,
         PAUSED => '127.0.0.1:' . $paused->port,
         HOLE => '127.0.0.1:' . $hole->port,
         LOG => q{log_format hypic '$hypic_route $hypic_mode $hypic_node }
                . q{$hypic_hit_segments/$hypic_miss_segments }
                . q{$hypic_ttft_ms $hypic_peer_addr $status';});

our @DOCS = (
    'The river Albe runs through the valley of Morn, where the farmers '
    . 'grow barley and rye. Every spring the water rises and floods the '
    . 'low fields near the old stone mill, and the miller opens the gates.',
    'Lanterns of the northern harbour are lit at dusk by the keeper, who '
    . 'walks the long pier with a ladder and a can of oil. Ships coming '
    . 'home from the cod banks steer between the green light on the left '
    . 'and the red light on the right, and the pilot boat waits at the '
    . 'mouth of the channel when the fog rolls in from the sea at night.',
    'A short note on owls: they hunt at night, they fly without a sound, '
    . 'and the barn owl can find a mouse under the snow by hearing alone.',
);

# a document no earlier request has cached
my $fresh = 0;
sub fresh {
    my ($i) = @_;
    return $main::DOCS[$i] . " (copy $$-" . ++$fresh . ")";
}

sub body {
    my (%f) = @_;
    return JSON::PP->new->canonical->encode(\%f);
}

sub completion {
    my ($prompt, %o) = @_;
    return "POST /v1/completions\n"
        . body(prompt => $prompt, max_tokens => 2, temperature => 0, %o);
}

# a prompt of documents and a question, as PIC segments
sub rag {
    my (@docs) = @_;
    return join('', map { "$SEP$_" } @docs) . "${SEP}Question: where?";
}

sub warm {
    my ($srv, $doc) = @_;
    my $r = http_request($srv, completion("$SEP$doc$SEP", max_tokens => 0));
    return ($r->{status} // 0) == 200;
}

# the segment keys the engine has registered so far
sub seg_keys {
    my $keys = $main::redis->command('KEYS', 'hypic:*:seg:*') || [];
    return sort @$keys;
}

# waits (bounded) until the engine has registered more than $n segments;
# returns the new keys
sub new_keys {
    my (@before) = @_;
    my %old = map { $_ => 1 } @before;
    my @new;
    wait_until(cond => sub { @new = grep { !$old{$_} } seg_keys(); @new },
               timeout => 10);
    return @new;
}

sub routes {
    my ($srv, $n) = @_;
    return map { (split ' ')[0] } log_lines($srv, 'route.log', $n);
}

sub smembers_calls {
    my $info = $main::redis->command('INFO', 'commandstats');
    return $info =~ /cmdstat_smembers:calls=(\d+)/ ? $1 : 0;
}

run_tests();

__DATA__

=== TEST 1: Redis up: the lookup is made and this node, holding the segments, is chosen
--- http_config
    @ENGINE@
    @LOG@
    hypic_redis @REDIS@;
    hypic_redis_timeout 2s;
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_routing cache_affinity;
        hypic_peer @hypic_peer;
        access_log logs/route.log hypic;
    }
    location @hypic_peer {
        proxy_pass http://$hypic_peer_addr;
    }
--- response_check
my ($res, $block, $srv) = @_;
my @before = seg_keys();
ok(warm($srv, $main::DOCS[0]), 'a document is cached');
my @keys = new_keys(@before);
is(scalar @keys, 1, 'the engine registered its segment in Redis');
is_deeply($main::redis->command('SMEMBERS', $keys[0]), ['t-node'],
          'as held by t-node');
my $calls = smembers_calls();
my $r = http_request($srv, completion(rag($main::DOCS[0])));
is($r->{status}, 200, 'a request with that document is served');
is($r->{headers}{'x-hypic-node'}[0], 't-node', 'here');
is($r->{headers}{'x-hypic-segments'}[0], '1/3',
   'with the document from the cache');
cmp_ok(smembers_calls(), '>', $calls, 'after asking Redis');
$r = http_request($srv, completion('no separator at all'));
is($r->{status}, 200, 'a prompt without segments is served');
my @log = log_lines($srv, 'route.log', 3);
like($log[0], qr/^cache-local pic t-node 0\/\d+ \d+ - 200$/,
     'the warm-up was looked up too');
like($log[1], qr/^cache-local pic t-node 1\/2 \d+ - 200$/,
     'the lookup chose this node ($hypic_* in the access log)');
like($log[2], qr/^local pic t-node 0\/\d \d+ - 200$/,
     'nothing to look up: local');
--- no_error_log
[error]
[warn]



=== TEST 2: Redis down: every request is served here, one error line, and Redis is used again once it is back
--- http_config
    @ENGINE@
    @LOG@
    hypic_redis @GONE@;
    hypic_redis_timeout 2s;
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_routing cache_affinity;
        hypic_peer @hypic_peer;
        access_log logs/route.log hypic;
    }
    location @hypic_peer {
        proxy_pass http://$hypic_peer_addr;
    }
    location = /metrics { hypic_metrics; }
--- response_check
my ($res, $block, $srv) = @_;
for my $i (0 .. 3) {
    my $r = http_request($srv, completion(rag($main::DOCS[$i % 3])));
    is($r->{status}, 200, "request $i is served with Redis down");
}
is_deeply([routes($srv, 4)], [('local-fallback') x 4],
          '$hypic_route says local-fallback');
my $m = http_request($srv, 'GET /metrics')->{body};
like($m, qr/^hypic:redis_lookup_errors_total 4$/m, 'counted as lookup errors');
like($m, qr/^hypic:routes_total\{route="local-fallback"\} 4$/m,
     'and as fallback routes');
my $log = slurp("$srv->{prefix}/logs/error.log");
my @err = $log =~ /(\[error\].*hypic: redis at.*)/g;
is(scalar @err, 1, 'one error line for the whole incident') or diag($log);
$main::gone->start_again;
my $n = 4;
my $back = wait_until(cond => sub {
    http_request($srv, completion(rag($main::DOCS[0])));
    $n++;
    (routes($srv, $n))[-1] eq 'cache-local';
}, timeout => 20);
ok($back, 'with Redis back, requests are looked up again');
--- error_log eval
[qr/\[error\] .*hypic: redis at "127\.0\.0\.1:\d+" cannot be reached \(Connection refused\), routing locally until it answers again/,
 qr/\[notice\] .*hypic: redis at "127\.0\.0\.1:\d+" answers again/]



=== TEST 3: Redis paused (CLIENT PAUSE): the lookup times out, the request is served here
--- http_config
    @ENGINE@
    @LOG@
    hypic_redis @PAUSED@;
    hypic_redis_timeout 200ms;
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_routing cache_affinity;
        hypic_peer @hypic_peer;
        access_log logs/route.log hypic;
    }
    location @hypic_peer {
        proxy_pass http://$hypic_peer_addr;
    }
--- response_check
my ($res, $block, $srv) = @_;
my $r = http_request($srv, completion(rag($main::DOCS[0])));
is($r->{status}, 200, 'a request with Redis answering');
is((routes($srv, 1))[0], 'cache-local', 'is looked up');
is($main::paused->command('CLIENT', 'PAUSE', 1500, 'ALL'), 'OK',
   'Redis pauses its clients');
for my $i (1 .. 2) {
    $r = http_request($srv, completion(rag($main::DOCS[0])));
    is($r->{status}, 200, "request $i is served while Redis hangs");
}
is_deeply([(routes($srv, 3))[1, 2]], ['local-fallback', 'local-fallback'],
          'routed locally');
my $n = 3;
ok(wait_until(cond => sub {
       http_request($srv, completion(rag($main::DOCS[0])));
       $n++;
       (routes($srv, $n))[-1] eq 'cache-local';
   }, timeout => 20), 'looked up again after the pause');
--- error_log eval
[qr/\[error\] .*hypic: redis at "127\.0\.0\.1:\d+" did not answer within hypic_redis_timeout, routing locally/]



=== TEST 4: a Redis that accepts and never answers: local, in time, and the other requests do not wait for it
--- workers: 2
--- http_config
    @ENGINE@
    @LOG@
    hypic_redis @HOLE@;
    hypic_redis_timeout 100ms;
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_routing cache_affinity;
        hypic_peer @hypic_peer;
        access_log logs/route.log hypic;
    }
    location @hypic_peer {
        proxy_pass http://$hypic_peer_addr;
    }
--- response_check
my ($res, $block, $srv) = @_;
Hypic::Engine::Client->import('concurrently');
my @r = concurrently($srv->{port},
                     map { completion(rag($main::DOCS[$_ % 3])) } 0 .. 5);
is(scalar(grep { ($_->{status} // 0) == 200 } @r), 6,
   'six requests at once, all served');
is_deeply([routes($srv, 6)], [('local-fallback') x 6], 'all locally');
--- error_log eval
[qr/hypic: redis at "127\.0\.0\.1:\d+" did not answer within hypic_redis_timeout/]



=== TEST 5: a client that goes away while Redis is asked: nothing is left behind
--- http_config
    @ENGINE@
    @LOG@
    hypic_redis @HOLE@;
    hypic_redis_timeout 3s;
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_routing cache_affinity;
        hypic_peer @hypic_peer;
        access_log logs/route.log hypic;
    }
    location @hypic_peer {
        proxy_pass http://$hypic_peer_addr;
    }
--- response_check
my ($res, $block, $srv) = @_;
Hypic::Engine::Client->import('open_request');
my $h = open_request($srv->{port}, completion(rag($main::DOCS[0])));
# the request waits for Redis (its engine link is up first)
wait_until(cond => sub { slurp("$srv->{prefix}/logs/error.log")
                         =~ /hypic: redis lookup of 1 segments/ },
           timeout => 10);
close $h->{sock};
my @log = log_lines($srv, 'route.log', 1);
like($log[0], qr/^- pic - -\/- - - 499$/,
     'the request ended when its client left, before it was routed');
--- no_error_log
[error]



=== TEST 6: Redis answers with an error: local, logged
--- http_config
    @ENGINE@
    @LOG@
    hypic_redis @REDIS@;
    hypic_redis_timeout 2s;
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_routing cache_affinity;
        hypic_peer @hypic_peer;
        access_log logs/route.log hypic;
    }
    location @hypic_peer {
        proxy_pass http://$hypic_peer_addr;
    }
--- response_check
my ($res, $block, $srv) = @_;
my $R = $main::redis;
my $doc = fresh(2);
my @before = seg_keys();
ok(warm($srv, $doc), 'a document is cached');
my ($key) = new_keys(@before);
$R->command('DEL', $key);
$R->command('SET', $key, 'not a set');
my $r = http_request($srv, completion(rag($doc)));
is($r->{status}, 200, 'a request whose segment key is no set is served');
is((routes($srv, 2))[1], 'local-fallback', 'locally');
$R->command('DEL', $key);
$R->command('SADD', $key, 't-node');
$r = http_request($srv, completion(rag($doc)));
is((routes($srv, 3))[2], 'cache-local', 'a sane key is looked up again');
--- error_log eval
[qr/\[error\] .*hypic: redis at "127\.0\.0\.1:\d+" answered with an error \(WRONGTYPE .*\), routing locally until it answers again/,
 qr/\[notice\] .*hypic: redis at "127\.0\.0\.1:\d+" answers again/]



=== TEST 7: a segment held by another node with more bytes: proxied to that node's nginx
--- http_config
    @ENGINE@
    @LOG@
    hypic_redis @REDIS@;
    hypic_redis_timeout 2s;
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_routing cache_affinity;
        hypic_peer @hypic_peer;
        access_log logs/route.log hypic;
    }
    location @hypic_peer {
        proxy_pass http://$hypic_peer_addr;
        error_page 502 504 = @hypic_here;
        access_log logs/route.log hypic;
    }
    location @hypic_here {
        hypic_pass tiny;
        access_log logs/route.log hypic;
    }
--- response_check
my ($res, $block, $srv) = @_;
my $R = $main::redis;
my @peer = map {
    start_server(config => "location /v1/ { add_header X-Peer-Saw "
                           . "\$http_x_hypic_hop; return 200 \"peer-$_ "
                           . "\$request_method \$request_uri "
                           . "\$content_length\\n\"; }")
} 1 .. 2;
my @doc = (fresh(0), fresh(1));
my @before = seg_keys();
ok(warm($srv, $doc[0]), 'a short document is cached here');
my ($k0) = new_keys(@before);
@before = seg_keys();
ok(warm($srv, $doc[1]), 'and a long one');
my ($k1) = new_keys(@before);
ok($k0 && $k1, 'both are in the index');
my ($prefix) = $k1 =~ /^(hypic:.*:)seg:/;
# the long one moves to peer-1: a node with more bytes of the prompt
$R->command('SREM', $k1, 't-node');
$R->command('SADD', $k1, 'peer-1');
$R->command('HSET', "${prefix}node:peer-1", 'addr',
            "127.0.0.1:$peer[0]{port}", 'load', '0.5', 'ts', time);
my $body = completion(rag(@doc));
my $r = http_request($srv, $body);
is($r->{status}, 200, 'the request is answered');
is($r->{body}, "peer-1 POST /v1/completions "
   . length((split /\n/, $body, 2)[1]) . "\n",
   'by peer-1\'s nginx, with the request and its body');
is($r->{headers}{'x-peer-saw'}[0], 't-node',
   'which was told where it came from (X-Hypic-Hop)');
$r = http_request($srv, completion(rag($doc[0])));
is($r->{headers}{'x-hypic-node'}[0], 't-node',
   'a prompt of what only this node holds stays here');
# peer-2 holds it too, with less load: a tie on bytes goes to it
$R->command('SADD', $k1, 'peer-2');
$R->command('HSET', "${prefix}node:peer-2", 'addr',
            "127.0.0.1:$peer[1]{port}", 'load', '0.25', 'ts', time);
$r = http_request($srv, $body);
like($r->{body}, qr/^peer-2 /, 'of two peers holding as much, the less loaded');
# both peers' heartbeats expire: dead nodes are not routed to
$R->command('DEL', "${prefix}node:peer-1", "${prefix}node:peer-2");
$r = http_request($srv, $body);
is($r->{headers}{'x-hypic-node'}[0], 't-node', 'dead peers: served here');
# a peer whose nginx is gone: error_page brings the request back here
$R->command('HSET', "${prefix}node:peer-1", 'addr',
            '127.0.0.1:' . Hypic::Util::free_port(), 'load', '0');
$r = http_request($srv, $body);
is($r->{status}, 200, 'a peer that refuses: answered all the same');
is($r->{headers}{'x-hypic-node'}[0], 't-node', 'here');
# an engine's socket path is no nginx address
$R->command('HSET', "${prefix}node:peer-1", 'addr', '/tmp/engine.sock');
$r = http_request($srv, $body);
is($r->{headers}{'x-hypic-node'}[0], 't-node', 'a socket path: here');
my @routes = map { [split ' '] } log_lines($srv, 'route.log', 8);
is_deeply([map { $_->[0] } @routes[2 .. 7]],
          [qw(cache-peer cache-local cache-peer cache-local local-fallback
              cache-local)],
          '$hypic_route of each (one line per request)');
is_deeply([@{ $routes[2] }[2, 5]], ['peer-1', "127.0.0.1:$peer[0]{port}"],
          '$hypic_node and $hypic_peer_addr of the proxied one');
$R->command('DEL', "${prefix}node:peer-1");
$R->command('SREM', $k1, 'peer-1', 'peer-2');
$R->command('SADD', $k1, 't-node');
stop_server($_) for @peer;
--- error_log eval
[qr/\[error\] .*connect\(\) failed \(111: Connection refused\) while connecting to upstream/,
 qr/\[warn\] .*hypic: node "peer-1" publishes the address "\/tmp\/engine\.sock", which is not the HOST:PORT of its nginx/]



=== TEST 8: A/B: split_clients on a request header drives hypic_mode, in proportion and sticky
--- http_config
    @ENGINE@
    @LOG@
    split_clients "$http_x_user" $hypic_arm {
        30%     full;
        30%     prefix;
        *       pic;
    }
--- config
    location /v1/ {
        hypic_pass tiny;
        hypic_mode $hypic_arm;
        access_log logs/route.log hypic;
    }
--- response_check
my ($res, $block, $srv) = @_;
my (%n, %arm);
for my $i (1 .. 200) {
    my $r = http_request($srv, completion('x', max_tokens => 1),
                         "X-User: user-$i");
    my $mode = $r->{headers}{'x-hypic-mode'}[0] // 'none';
    $n{$mode}++;
    $arm{$i} = $mode;
}
# 4.5 standard deviations of the binomial: a wrong split fails, chance
# does not (p < 1e-5)
for ([full => 0.3], [prefix => 0.3], [pic => 0.4]) {
    my ($mode, $p) = @$_;
    my $sd = sqrt(200 * $p * (1 - $p));
    my $got = $n{$mode} // 0;
    ok(abs($got - 200 * $p) <= 4.5 * $sd,
       "$mode: $got of 200, expected " . 200 * $p . " +- " . int(4.5 * $sd));
}
is($n{none} // 0, 0, 'every answer names its mode');
my $same = 0;
for my $i (1 .. 20) {
    my $r = http_request($srv, completion('x', max_tokens => 1),
                         "X-User: user-$i");
    $same++ if ($r->{headers}{'x-hypic-mode'}[0] // '') eq $arm{$i};
}
is($same, 20, 'a user keeps the arm');
my @log = log_lines($srv, 'route.log', 220);
is((split ' ', $log[$_ - 1])[1], $arm{$_}, "\$hypic_mode of user-$_")
    for 1 .. 5;
--- timeout: 30
--- no_error_log
[error]
