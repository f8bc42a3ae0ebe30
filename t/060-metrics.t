# Prometheus metrics from a real engine (models/test/qwen35-dense): the
# counters and histogram buckets move with the requests, by exactly what
# the answers themselves report (usage, X-Hypic-Segments); every answer
# the engine completed is one TTFT and one end-to-end observation; and
# with two workers taking the requests (reuseport spreads them), one
# scrape shows the sum. The engine gauges (state, running, waiting, free
# slots, pool bytes, entries and evictions) follow what a second engine
# holds: streams kept open (each running one holding a sequence of the
# sequence pool), a queue behind a batch of 2, a small public pool filled
# until it evicts; hypic:engine_info names the node, model and device.
# Requests without max_tokens on a sequence pool too small for all of
# them at their full length: sequences grow, and hypic:preemptions_total
# counts those that gave their memory back (each answer still whole).

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Util qw(free_port);

Hypic::Engine::Client->import(qw(sse_events));

our $MODEL = "$Hypic::Nginx::REPO/models/test/qwen35-dense";
our $SEP = '<|pic_sep|>';

my $why = Hypic::Engine->why_not || (-d $MODEL ? '' : "no $MODEL");
plan(skip_all => $why) if $why;

our $engine = Hypic::Engine->start(
    args => ['--model', $MODEL, '--node', 't-node', '--slots', 8]);

# G: 2 requests run at once, streams last (throttled), a small public pool
our $POOL = 128 * 1024;
our $G = Hypic::Engine->start(
    args => ['--model', $MODEL, '--node', 't-gauge', '--slots', 6,
             '--batch', 2, '--throttle-ms', 20, '--max-prompt-bytes', '4k',
             '--public-pool', $POOL, '--private-pool', '4m',
             '--seq-budget', '64m']);

# P: a sequence pool of 1200k: a segment builder of 64 positions (49 KiB
# on this model), three first extents (prompt + 512 + drafts: 284 KiB
# each) but not three sequences of the whole context (1024: 538 KiB)
our $P = Hypic::Engine->start(
    args => ['--model', $MODEL, '--node', 't-preempt', '--slots', 4,
             '--max-context', 1024, '--max-segment', 64,
             '--seq-budget', '1200k']);

our $MPORT = free_port();

add_vars(ENGINE => 'hypic_engine tiny unix:' . $engine->socket
                   . ' model=tiny-1;',
         ENGINE_G => 'hypic_engine g unix:' . $G->socket . ' model=tiny-1;',
         ENGINE_P => 'hypic_engine p unix:' . $P->socket . ' model=tiny-1;',
         MPORT => $MPORT);

our $DOC = 'The lighthouse keeper climbs one hundred and twelve steps '
           . 'every evening to light the lamp, and he counts them aloud '
           . 'so that the gulls on the rail know that the night begins.';

sub body {
    my (%f) = @_;
    return JSON::PP->new->canonical->encode(\%f);
}

# the metrics as { 'name{labels}' => value }
sub scrape {
    my ($srv) = @_;
    my $r = http_request($srv, 'GET /metrics');
    my %m = $r->{body} =~ /^(hypic:\S+) (\S+)$/mg;
    return \%m;
}

# [le, count] of each bucket, by le
sub histogram {
    my ($m, $name) = @_;
    my @b = map { [$_ =~ /le="([^"]+)"/, $m->{$_}] }
            grep { /^\Q$name\E_bucket\{/ } keys %$m;
    return sort { ($a->[0] eq '+Inf' ? 9e99 : $a->[0])
                  <=> ($b->[0] eq '+Inf' ? 9e99 : $b->[0]) } @b;
}

run_tests();

__DATA__

=== TEST 1: counters and histograms move with the requests, summed across two workers
--- workers: 2
--- http_config
    @ENGINE@
    hypic_engine dead unix:/tmp/hypic-t-no-such-engine.sock model=m0;
    log_format pids '$pid $status';
    server {
        listen 127.0.0.1:@MPORT@ reuseport;
        location /v1/ {
            hypic_pass tiny;
            access_log logs/pids.log pids;
        }
        location /dead/ {
            hypic_pass dead;
            access_log logs/pids.log pids;
        }
        location = /metrics { hypic_metrics; }
    }
--- response_check
my ($res, $block, $srv) = @_;
my $m = { port => $main::MPORT, prefix => $srv->{prefix} };
my $before = scrape($m);
is($before->{'hypic:time_to_first_token_seconds_count'}, 0,
   'no TTFT observed yet');
is($before->{'hypic:prompt_tokens_total'}, 0, 'no tokens yet');
my ($n, $prompt, $gen, $cached, $hit, $total) = (0) x 6;
for my $i (1 .. 20) {
    my $stream = $i % 4 == 0;
    my $r = http_request($m, "POST /v1/completions\n"
                         . body(prompt => "$main::SEP$main::DOC${main::SEP}Question $i?",
                                max_tokens => 1 + $i % 3, temperature => 0,
                                ($stream ? (stream => JSON::PP::true,
                                            stream_options =>
                                            { include_usage =>
                                              JSON::PP::true })
                                         : ())));
    next unless ($r->{status} // 0) == 200;
    $n++;
    my $usage = $stream
        ? (grep { ref && $_->{usage} } sse_events($r->{body}))[-1]{usage}
        : JSON::PP->new->decode($r->{body})->{usage};
    $prompt += $usage->{prompt_tokens};
    $gen += $usage->{completion_tokens};
    $cached += $usage->{prompt_tokens_details}{cached_tokens};
    my ($h, $t) = split m{/}, $r->{headers}{'x-hypic-segments'}[0];
    $hit += $h;
    $total += $t;
}
is($n, 20, 'twenty answers');
my $bad = http_request($m, "POST /v1/completions\n{bad json");
is($bad->{status}, 400, 'a bad request');
my $dead = http_request($m, "POST /dead/v1/completions\n"
                        . body(prompt => 'x'));
is($dead->{status}, 503, 'a request for an engine that is down');
my %pids = map { (split ' ')[0] => 1 } log_lines($m, 'pids.log', 22);
is(scalar keys %pids, 2, 'both workers took requests');
my $after = scrape($m);
is($after->{'hypic:requests_total{code="2xx"}'}, 20, '2xx summed');
is($after->{'hypic:requests_total{code="4xx"}'}, 1, '4xx');
is($after->{'hypic:requests_total{code="5xx"}'}, 1, '5xx');
is($after->{'hypic:mode_requests_total{mode="pic",code="2xx"}'}, 20,
   'by mode');
is($after->{'hypic:mode_requests_total{mode="none",code="4xx"}'}, 1,
   'a request refused before its mode was chosen');
is($after->{'hypic:mode_requests_total{mode="pic",code="5xx"}'}, 1,
   'the engine that is down');
is($after->{'hypic:engine_errors_total'}, 1, 'is an engine error');
is($after->{'hypic:routes_total{route="local"}'}, 21, 'routes');
is($after->{'hypic:redis_lookup_errors_total'}, 0, 'no Redis, no errors');
is($after->{'hypic:prompt_tokens_total'}, $prompt,
   "prompt tokens: $prompt, as the answers' usage says");
is($after->{'hypic:generation_tokens_total'}, $gen,
   "generation tokens: $gen");
is($after->{'hypic:cached_tokens_total'}, $cached, "cached tokens: $cached");
ok($cached > 0, 'the document was reused');
is($after->{'hypic:segment_hits_total'}, $hit,
   "segment hits: $hit, as X-Hypic-Segments says");
is($after->{'hypic:segment_misses_total'}, $total - $hit,
   'segment misses: ' . ($total - $hit));
for my $name (qw(hypic:time_to_first_token_seconds
                 hypic:e2e_request_latency_seconds))
{
    is($after->{"${name}_count"}, 20, "$name: one observation per answer");
    my @b = histogram($after, $name);
    is(scalar @b, $name =~ /first/ ? 17 : 20, "$name: its buckets");
    is($b[-1][0], '+Inf', "$name: the last bucket is +Inf");
    is($b[-1][1], 20, "$name: holding every observation");
    ok(!grep({ $b[$_][1] < $b[$_ - 1][1] } 1 .. $#b),
       "$name: buckets are cumulative");
    ok(!grep({ $_->[1] != 0 } histogram($before, $name)),
       "$name: every bucket was empty before");
    like($after->{"${name}_sum"}, qr/^\d+\.\d{3}$/, "$name: a sum");
}
like(http_request($m, 'GET /metrics')->{body},
     qr/^# TYPE hypic:time_to_first_token_seconds histogram$/m,
     'typed as a histogram');
--- error_log
hypic: engine "dead" at "unix:/tmp/hypic-t-no-such-engine.sock" is unavailable



=== TEST 2: engine gauges: state, running and waiting requests, free slots, pool bytes, entries and evictions
--- http_config
    @ENGINE_G@
    hypic_engine dead unix:/tmp/hypic-t-no-such-engine.sock model=m0;
--- config
    location /v1/ { hypic_pass g; }
    location = /metrics { hypic_metrics; }
    location = /health { hypic_health; }
--- timeout: 60
--- response_check
my ($res, $block, $srv) = @_;
my $m;
# a worker's first scrape connects to the engine and does not wait
ok(Hypic::Util::wait_until(
       cond => sub { $m = scrape($srv);
                     ($m->{'hypic:engine_state{engine="g",state="up"}'}
                      // 0) == 1 },
       timeout => 20),
   'engine g is up');
is($m->{'hypic:engine_state{engine="dead",state="down"}'}, 1,
   'engine dead is down');
is($m->{'hypic:engine_state{engine="dead",state="up"}'}, 0, 'not up');
ok(!exists $m->{'hypic:num_requests_running{engine="dead"}'},
   'an engine that is down has no load gauges');
ok($m->{'hypic:engine_generation{engine="g"}'} >= 1, 'a generation');
like($m->{'hypic:engine_heartbeat_age_seconds{engine="g"}'},
     qr/^\d+\.\d{3}$/, 'a heartbeat age');
is($m->{'hypic:slots{engine="g"}'}, 6, '6 slots');
is($m->{'hypic:slots_free{engine="g"}'}, 6, 'all free');
is($m->{'hypic:num_requests_running{engine="g"}'}, 0, 'none running');
is($m->{'hypic:num_requests_waiting{engine="g"}'}, 0, 'none waiting');
is($m->{'hypic:pool_budget_bytes{engine="g",pool="public"}'}, $main::POOL,
   'the public pool\'s budget');
is($m->{'hypic:pool_budget_bytes{engine="g",pool="private"}'}, 4 << 20,
   'the private pool\'s budget');
is($m->{'hypic:pool_used_bytes{engine="g",pool="public"}'}, 0,
   'the public pool is empty');
my $seq_budget = $m->{'hypic:pool_budget_bytes{engine="g",pool="sequence"}'};
ok($seq_budget > 0 && $seq_budget < 64 << 20,
   "the sequence pool leaves $seq_budget bytes to requests (64m less the "
   . 'segment builder)');
is($m->{'hypic:pool_used_bytes{engine="g",pool="sequence"}'}, 0,
   'no request holds a sequence');
is($m->{'hypic:pool_entries{engine="g",pool="sequence"}'}, 0, 'none held');
my @info = grep { /^hypic:engine_info\{engine="g",/ } keys %$m;
is(scalar @info, 1, 'one engine_info line for g');
like($info[0] // '',
     qr/^hypic:engine_info\{engine="g",node="t-gauge",model="[^"]+",device="cpu",device_name=""\}$/,
     'engine_info: node, model, device cpu');
is($m->{$info[0] // ''}, 1, 'engine_info is 1');
ok(!grep({ /^hypic:engine_info\{engine="dead"/ } keys %$m),
   'an engine that is down has no engine_info');
my $health = JSON::PP::decode_json(http_request($srv, 'GET /health')->{body});
my ($hg) = grep { $_->{name} eq 'g' } @{ $health->{engines} };
is_deeply([$hg->{device}, $hg->{device_name}], ['cpu', ''],
          '/health names the device too');
my $text = http_request($srv, 'GET /metrics')->{body};
for my $g (qw(engine_state engine_generation num_requests_running
              num_requests_waiting slots_free pool_used_bytes
              pool_entries)) {
    like($text, qr/^# HELP hypic:$g \S.*\n# TYPE hypic:$g gauge$/m,
         "hypic:$g has HELP and TYPE gauge");
}
like($text, qr/^# TYPE hypic:pool_evictions_total counter$/m,
     'evictions are a counter');

# two streams run (batch 2), a third waits
my $stream = "POST /v1/completions\n"
    . body(prompt => 'Hello', max_tokens => 4000, temperature => 0,
           ignore_eos => JSON::PP::true, stream => JSON::PP::true);
my @h = map { Hypic::Engine::Client::open_request($srv->{port}, $stream) }
        1 .. 3;
my $want = sub {
    my ($run, $wait, $free) = @_;
    return Hypic::Util::wait_until(
        cond => sub {
            $m = scrape($srv);
            $m->{'hypic:num_requests_running{engine="g"}'} == $run
                && $m->{'hypic:num_requests_waiting{engine="g"}'} == $wait
                && $m->{'hypic:slots_free{engine="g"}'} == $free;
        }, timeout => 60);
};
ok($want->(2, 1, 3), 'three streams: 2 running, 1 waiting, 3 slots free')
    or diag(join ' ', map { "$_=$m->{$_}" }
                      grep { /engine="g"/ && /requests|slots_free/ }
                      sort keys %$m);
is($m->{'hypic:pool_entries{engine="g",pool="sequence"}'}, 2,
   'the two running streams hold a sequence each, the waiting one none');
my $seq_used = $m->{'hypic:pool_used_bytes{engine="g",pool="sequence"}'};
ok($seq_used > 0 && $seq_used <= $seq_budget,
   "they hold $seq_used bytes of the sequence pool");
close $_->{sock} for @h;
ok($want->(0, 0, 6), 'closed: none running or waiting, 6 slots free')
    or diag(join ' ', map { "$_=$m->{$_}" }
                      grep { /engine="g"/ && /requests|slots_free/ }
                      sort keys %$m);
ok(Hypic::Util::wait_until(
       cond => sub { $m = scrape($srv);
                     $m->{'hypic:pool_used_bytes{engine="g",pool="sequence"}'}
                     == 0 }, timeout => 10),
   'the sequences went back to the pool');

# a pic request fills the public pool; distinct documents overflow it
my $pic = sub {
    my ($i) = @_;
    my $doc = "Document $i: the harbour of town $i keeps $i boats, and "
              . "every boat of town $i carries nets for herring and cod.";
    return http_request($srv, "POST /v1/completions\n"
                        . body(prompt => "${main::SEP}$doc${main::SEP}"
                                         . "How many boats?",
                               max_tokens => 1), undef, 20);
};
is($pic->(0)->{status}, 200, 'a pic request');
# the engine publishes its pool gauges after the step that wrote the
# answer, which can reach the client first
Hypic::Util::wait_until(
    cond => sub { $m = scrape($srv);
                  $m->{'hypic:pool_used_bytes{engine="g",pool="public"}'} },
    timeout => 10);
my $used = $m->{'hypic:pool_used_bytes{engine="g",pool="public"}'};
ok($used > 0, "the public pool holds $used bytes");
ok($m->{'hypic:pool_entries{engine="g",pool="public"}'} > 0,
   'in ' . $m->{'hypic:pool_entries{engine="g",pool="public"}'}
   . ' entries');
is($m->{'hypic:pool_evictions_total{engine="g",pool="public"}'}, 0,
   'nothing evicted yet');
my $i = 0;
while (++$i <= 40) {
    $pic->($i);
    $m = scrape($srv);
    last if $m->{'hypic:pool_evictions_total{engine="g",pool="public"}'};
}
ok($m->{'hypic:pool_evictions_total{engine="g",pool="public"}'} > 0,
   "evictions once the pool is full ($i more documents, "
   . $m->{'hypic:pool_evictions_total{engine="g",pool="public"}'}
   . ' evicted)');
cmp_ok($m->{'hypic:pool_used_bytes{engine="g",pool="public"}'}, '<=',
       $main::POOL, 'within the budget');



=== TEST 3: preemptions: requests that omit max_tokens on a small sequence pool
--- http_config
    @ENGINE_P@
--- config
    location /v1/ { hypic_pass p; }
    location = /metrics { hypic_metrics; }
--- timeout: 120
--- response_check
my ($res, $block, $srv) = @_;
my $m;
ok(Hypic::Util::wait_until(
       cond => sub { $m = scrape($srv);
                     ($m->{'hypic:engine_state{engine="p",state="up"}'}
                      // 0) == 1 },
       timeout => 20),
   'engine p is up');
is($m->{'hypic:preemptions_total{engine="p"}'}, 0, 'no preemption yet');
like(http_request($srv, 'GET /metrics')->{body},
     qr/^# TYPE hypic:preemptions_total counter$/m,
     'preemptions are a counter');
# a chat request without max_tokens runs to the context's end (a
# completions request's default is 16)
my $req = "POST /v1/chat/completions\n"
    . body(messages => [{role => 'user', content => 'Hello'}],
           temperature => 0, ignore_eos => JSON::PP::true);
my @r = Hypic::Engine::Client::concurrently($srv->{port}, ($req) x 3);
my @j = map { Hypic::Engine::Client::json_of($_) } @r;
my @ok = grep { $_->{status} == 200 } @r;
is(scalar @ok, 3, 'three answers');
my $n = $j[0]{usage}{prompt_tokens} // 0;
is_deeply([map { $_->{usage}{completion_tokens} // -1 } @j],
          [(1024 - $n) x 3], 'each to the end of the context')
    or diag(join ' ', map { $_->{status} . ': ' . substr($_->{body}, 0, 300) }
                      @r);
is_deeply([map { $_->{choices}[0]{finish_reason} // '' } @j],
          [('length') x 3], 'finish length');
my @text = map { $_->{choices}[0]{message}{content} // '' } @j;
ok(length($text[0]) > 0 && !grep({ $_ ne $text[0] } @text),
   'the three greedy texts are the same');
Hypic::Util::wait_until(
    cond => sub { $m = scrape($srv);
                  $m->{'hypic:preemptions_total{engine="p"}'} },
    timeout => 10);
my $pre = $m->{'hypic:preemptions_total{engine="p"}'};
ok($pre > 0, "$pre preemptions counted");
is($m->{'hypic:pool_evictions_total{engine="p",pool="sequence"}'}, $pre,
   'as the sequence pool\'s evictions');
like($main::P->log_text, qr/sequence pool: 1 requests preempted/,
     'the engine logs its first preemption');
