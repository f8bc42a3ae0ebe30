# Prometheus metrics from a real engine (models/test/qwen35-dense): the
# counters and histogram buckets move with the requests, by exactly what
# the answers themselves report (usage, X-Hypic-Segments); every answer
# the engine completed is one TTFT and one end-to-end observation; and
# with two workers taking the requests (reuseport spreads them), one
# scrape shows the sum.

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

our $MPORT = free_port();

add_vars(ENGINE => 'hypic_engine tiny unix:' . $engine->socket
                   . ' model=tiny-1;',
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
