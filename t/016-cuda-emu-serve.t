# The serving path on the CUDA backend, end to end, without a GPU: real
# nginx with the module in front of `hypic-engine serve --device cuda`
# linked against the host emulator (kernels/cuda/emu/run.sh), beside the
# same engine on the CPU. The module never knows where the model runs:
# completions and chat, streamed and not, greedy and sampled (the device
# sending the sampler's candidates only), full, pic (cold then warm) and
# prefix, give the CPU engine's greedy text; log-probabilities (the device
# sending the candidates' raw logits and the row's log-sum-exp, not the
# row) the CPU engine's tokens and alternatives, their values to the
# backends' logits tolerance; a refused request is the
# same clean 400 and the engine serves the next; /metrics and /health
# name the device and show the device's sequence pool; the prefill chunk
# defaults to the device's (4096 tokens a step, 256 on the CPU), and the
# device engine logs where the device's memory went at start. A device
# that faults (a sticky error, as an illegal address on a GPU) ends the
# request in flight with a clean 503, and its engine exits with status 1
# for a supervisor to restart it, while nginx and the other engine serve
# on. A device too small for the configured pools stops the start with
# an error naming the setting. The device engine runs with the kernel
# tuners (HYPIC_CUDA_TUNE=1) and logs their choices at a SIGHUP.

use strict;
use warnings;
use lib 't/lib';

use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Util qw(build_dir private_dir);

Hypic::Engine::Client->import(qw(json_body json_of text_of cached_of
                                 sse_events sse_text));

our $MODEL = Hypic::Engine->test_model;
my $lib = build_dir() . '/libhk_cpu.a';
my $hypic = build_dir() . '/libhypic.a';
my $why = Hypic::Engine->why_not
    || (-d $MODEL ? '' : "no $MODEL")
    || (-f $lib && -f $hypic ? '' : "no $lib or $hypic (make first)")
    || (grep({ -x "$_/g++" } split /:/, $ENV{PATH}) ? '' : 'no g++')
    # ASan and the emulator's ucontext stack switching do not mix
    || ($ENV{HYPIC_ASAN} ? 'not under the sanitizers' : '');
plan(skip_all => $why) if $why;

# hypic-engine linked against the emulated device (build only: no order)
my $work = private_dir('cuda-emu-serve');
my $log = `HK_EMU_BUILD=$work HK_EMU_ORDERS= HK_EMU_ENGINE=$hypic kernels/cuda/emu/run.sh $lib 2>&1`;
if ($? != 0 || !-x "$work/hypic-engine") {
    plan(tests => 1);
    fail('hypic-engine builds against the CUDA emulator');
    diag($log);
    exit;
}

my @common = ('--model', $MODEL, '--slots', 4, '--batch', 2,
              '--max-context', 256,
              '--public-pool', '16m', '--private-pool', '16m');
# with the kernel tuners (their kernels give the same bits: the CPU's
# text still)
our $gpu = Hypic::Engine->start(
    bin => "$work/hypic-engine",
    env => { HK_EMU_ORDER => 'forward', HYPIC_CUDA_TUNE => 1 },
    timeout => 120,
    args => [@common, '--device', 'cuda', '--node', 'emu-node']);
our $cpu = Hypic::Engine->start(args => [@common, '--node', 'cpu-node']);
# a device that faults on demand: once $FAULT exists, its next launch is an
# illegal address (sticky, as on a GPU)
our $FAULT = "$work/fault";
our $faulty = Hypic::Engine->start(
    bin => "$work/hypic-engine", timeout => 120,
    env => { HK_EMU_ORDER => 'forward', HK_EMU_FAULT_FILE => $FAULT },
    args => [@common, '--device', 'cuda', '--node', 'faulty-node']);
add_vars(ENGINES => 'hypic_engine gpu unix:' . $gpu->socket
                    . " model=tiny-1;\n"
                    . 'hypic_engine cpu unix:' . $cpu->socket
                    . " model=tiny-1;\n"
                    . 'hypic_engine faulty unix:' . $faulty->socket
                    . ' model=tiny-1;');

# a device too small for the pools: a start error naming the setting
{
    my $dir = private_dir('cuda-emu-small');
    my $out = `HK_EMU_MEM_MB=64 HK_EMU_ORDER=forward $work/hypic-engine serve --model $MODEL --device cuda --max-context 256 --public-pool 512m --socket $dir/s --shm /hypic-t-$$-small 2>&1`;
    my $st = $? >> 8;
    ok($st == 1 && $out =~ /cuda:0: no memory for a public pool of 512\.0 MiB \(public_pool\)/,
       "a 64 MiB device refuses a 512 MiB public pool at start, naming it (exit $st)")
        or diag($out);
}

our $SEP = '<|pic_sep|>';
our $PROMPT = join($SEP, 'You answer from the documents.',
                   'The capital of Zorvia is Quellam, by the sea.',
                   'Water boils at one hundred degrees at sea level.',
                   'What is the capital of Zorvia?');

sub body { json_body(@_) }

# The same request through both engines: [gpu answer, cpu answer].
sub both {
    my ($srv, $mode, $path, $body) = @_;
    return map { http_request($srv, "POST /$_/$mode$path\n$body", undef, 120) }
               qw(gpu cpu);
}

# A response's log-probability entries, streamed or not, chat or
# completions, as [token, logprob, [[alternative, logprob]...]].
sub lp_entries {
    my ($r) = @_;
    my @j = $r->{body} =~ /^data: / ? grep { ref $_ } sse_events($r->{body})
                                    : (json_of($r));
    my @e;
    for my $c (map { @{ $_->{choices} || [] } } @j) {
        my $lp = $c->{logprobs} or next;
        if ($lp->{content}) {
            push @e, map { [$_->{token}, $_->{logprob},
                            [map { [$_->{token}, $_->{logprob}] }
                             @{ $_->{top_logprobs} || [] }]] }
                     @{ $lp->{content} };
            next;
        }
        for my $i (0 .. $#{ $lp->{tokens} || [] }) {
            my $d = $lp->{top_logprobs}[$i] || {};
            push @e, [$lp->{tokens}[$i], $lp->{token_logprobs}[$i],
                      [map { [$_, $d->{$_}] }
                       sort { $d->{$b} <=> $d->{$a} || $a cmp $b } keys %$d]];
        }
    }
    return @e;
}

# The device's entries against the CPU's: the same tokens and alternatives
# in the same order, every value within $TOL (the two backends' logits
# differ by f32 rounding, ~1e-5 on the tiny model; the device's own
# normalizer, summed in another order, adds ~1e-7).
our $TOL = 1e-3;
sub same_lp {
    my ($g, $c, $what) = @_;
    my @g = lp_entries($g);
    my @c = lp_entries($c);
    my ($why, $worst) = ('', 0);
    $why = scalar(@g) . ' entries, the CPU ' . scalar(@c) if @g != @c || !@g;
    for my $i (0 .. $#c) {
        last if $why;
        my @p = ([$g[$i][0], $g[$i][1]], @{ $g[$i][2] });
        my @q = ([$c[$i][0], $c[$i][1]], @{ $c[$i][2] });
        $why = "entry $i: " . scalar(@p) . ' values, the CPU ' . scalar(@q)
            if @p != @q;
        for my $j (0 .. $#q) {
            last if $why;
            my $d = abs($p[$j][1] - $q[$j][1]);
            $worst = $d if $d > $worst;
            $why = "entry $i, value $j: '$p[$j][0]' $p[$j][1], the CPU "
                   . "'$q[$j][0]' $q[$j][1]"
                if $p[$j][0] ne $q[$j][0] || $d > $TOL;
        }
    }
    ok(!$why, "$what: the CPU engine's tokens and alternatives, values "
       . "within $TOL (" . scalar(@c) . " entries, worst $worst) $why");
}

run_tests();

__DATA__

=== TEST 1: full: completions, chat, streamed or not, the CPU engine's text
--- http_config
    @ENGINES@
--- config
    location /gpu/full/ { hypic_pass gpu; hypic_mode full; }
    location /cpu/full/ { hypic_pass cpu; hypic_mode full; }
--- timeout: 180
--- response_check
my (undef, undef, $srv) = @_;
my $b = main::body(prompt => 'The capital of Zorvia is', max_tokens => 8,
                   temperature => 0);
my ($g, $c) = main::both($srv, 'full', '/v1/completions', $b);
is($g->{status}, 200, 'completions on the emulated device: 200');
ok(length main::text_of($c), 'the CPU engine says something');
is(main::text_of($g), main::text_of($c), 'the same greedy text');
is(main::json_of($g)->{usage}{completion_tokens}, 8, '8 tokens');

# sampled: the device sends the sampler's 256 candidates a token and the
# engine draws from them (top_k, top_p within them), or fetches the row
# when they cannot decide (plain temperature); either way the CPU's draw
for my $f ([top_k => 20], [top_p => 0.9], []) {
    my $sb = main::body(prompt => 'The capital of Zorvia is', max_tokens => 8,
                        temperature => 0.8, seed => 7, @$f);
    my ($gs, $cs) = main::both($srv, 'full', '/v1/completions', $sb);
    is($gs->{status}, 200, "sampled (@$f) on the device: 200");
    is(main::text_of($gs), main::text_of($cs),
       "sampled (@$f): the CPU engine's text, seed for seed");
}

my $chat = main::body(messages => [{ role => 'user', content => 'Hello!' }],
                      max_tokens => 6, temperature => 0);
my ($gc, $cc) = main::both($srv, 'full', '/v1/chat/completions', $chat);
is($gc->{status}, 200, 'chat on the emulated device: 200');
is(main::json_of($gc)->{choices}[0]{message}{content},
   main::json_of($cc)->{choices}[0]{message}{content},
   'chat: the same greedy text');

my $st = main::body(messages => [{ role => 'user', content => 'Hello!' }],
                    max_tokens => 6, temperature => 0,
                    stream => JSON::PP::true);
my $gs = http_request($srv, "POST /gpu/full/v1/chat/completions\n$st",
                      undef, 120);
my @ev = main::sse_events($gs->{body});
is($ev[-1], '[DONE]', 'the stream ends with [DONE]');
my $want = main::json_of($cc)->{choices}[0]{message}{content};
utf8::encode($want);
is(main::sse_text(@ev), $want, 'streamed: the same text as the CPU');

# log-probabilities: the device sends the candidates' raw logits and the
# row's log-sum-exp, not the row
my $msg = [{ role => 'user', content => 'Hello!' }];
for my $t (
    ['greedy chat, top_logprobs 5', '/v1/chat/completions',
     messages => $msg, temperature => 0, logprobs => JSON::PP::true,
     top_logprobs => 5],
    ['sampled chat streamed, top_logprobs 20', '/v1/chat/completions',
     messages => $msg, temperature => 0.8, seed => 7, top_k => 40,
     logprobs => JSON::PP::true, top_logprobs => 20,
     stream => JSON::PP::true],
    ['greedy completions streamed, logprobs 3', '/v1/completions',
     prompt => 'The capital of Zorvia is', temperature => 0, logprobs => 3,
     stream => JSON::PP::true],
    ['sampled completions, logprobs 0', '/v1/completions',
     prompt => 'The capital of Zorvia is', temperature => 0.8, seed => 3,
     logprobs => 0]) {
    my ($what, $path, @f) = @$t;
    my ($g, $c) = main::both($srv, 'full', $path,
                             main::body(max_tokens => 6, @f));
    is($g->{status}, 200, "$what on the device: 200");
    main::same_lp($g, $c, $what);
}
--- no_error_log
[error]



=== TEST 2: pic: cold then warm on the device, the CPU engine's text
--- http_config
    @ENGINES@
--- config
    location /gpu/pic/ { hypic_pass gpu; hypic_mode pic; hypic_seam 4; }
    location /cpu/pic/ { hypic_pass cpu; hypic_mode pic; hypic_seam 4; }
--- timeout: 180
--- response_check
my (undef, undef, $srv) = @_;
my $b = main::body(prompt => $main::PROMPT, max_tokens => 6,
                   temperature => 0);
my $cold = http_request($srv, "POST /gpu/pic/v1/completions\n$b", undef, 120);
my $warm = http_request($srv, "POST /gpu/pic/v1/completions\n$b", undef, 120);
my $ref = http_request($srv, "POST /cpu/pic/v1/completions\n$b", undef, 120);
is($cold->{status}, 200, 'cold pic on the device: 200');
is($cold->{headers}{'x-hypic-segments'}[0], '0/4', 'cold: no segment cached');
is($warm->{headers}{'x-hypic-segments'}[0], '3/4',
   'warm: the three cacheable segments spliced from the device pool');
ok(main::cached_of($warm) > 0,
   'warm: cached tokens reported (' . main::cached_of($warm) . ')');
is(main::text_of($cold), main::text_of($ref), 'cold: the CPU engine\'s text');
is(main::text_of($warm), main::text_of($ref), 'warm: the CPU engine\'s text');
--- no_error_log
[error]



=== TEST 3: prefix: a resume on the device continues exactly
--- http_config
    @ENGINES@
--- config
    location /gpu/prefix/ { hypic_pass gpu; hypic_mode prefix; }
    location /cpu/full/ { hypic_pass cpu; hypic_mode full; }
--- timeout: 180
--- response_check
my (undef, undef, $srv) = @_;
my @b = map { main::body(prompt => $_, max_tokens => 6, temperature => 0) }
        ($main::PROMPT, "$main::PROMPT$main::SEP And of its population?");
my @r = map { http_request($srv, "POST /gpu/prefix/v1/completions\n$_",
                           undef, 120) } @b;
my @ref = map { http_request($srv, "POST /cpu/full/v1/completions\n$_",
                             undef, 120) } @b;
is($r[1]{status}, 200, 'prefix on the device: 200');
ok(main::cached_of($r[1]) > 0,
   'the longer second prompt resumes from the device\'s prefix cache ('
   . main::cached_of($r[1]) . ' tokens)');
is(main::text_of($r[0]), main::text_of($ref[0]),
   'first: the CPU\'s full text');
is(main::text_of($r[1]), main::text_of($ref[1]),
   'resumed: the CPU\'s full text of the longer prompt');
--- no_error_log
[error]



=== TEST 4: a refused request is a clean 400, and the device engine serves the next
--- http_config
    @ENGINES@
--- config
    location /v1/ { hypic_pass gpu; }
--- request eval
["POST /v1/completions\n{\"prompt\": \"" . ("word " x 400) . "\", \"max_tokens\": 1}",
 "POST /v1/completions\n{\"prompt\": \"Hi\", \"max_tokens\": 2}"]
--- error_code eval
[400, 200]
--- response_body_json eval
[{ error => { type => "invalid_request_error",
              code => "context_length_exceeded" } },
 { object => "text_completion" }]
--- timeout: 120
--- error_log
hypic: engine refused



=== TEST 5: /metrics and /health name the device; the device's sequence pool
--- http_config
    @ENGINES@
--- config
    location /v1/ { hypic_pass gpu; }
    location = /metrics { hypic_metrics; }
    location = /health { hypic_health; }
--- timeout: 60
--- response_check
my (undef, undef, $srv) = @_;
my $text;
Hypic::Util::wait_until(
    cond => sub { $text = http_request($srv, 'GET /metrics')->{body};
                  $text =~ /^hypic:engine_info\{engine="cpu"/m
                      && $text =~ /^hypic:engine_info\{engine="gpu"/m },
    timeout => 20);
like($text, qr/^hypic:engine_info\{engine="gpu",node="emu-node",model="[^"]+",device="cuda:0",device_name="host emulator"\} 1$/m,
     'engine_info: the gpu engine runs on cuda:0 (the emulator)');
like($text, qr/^hypic:engine_info\{engine="cpu",node="cpu-node",model="[^"]+",device="cpu",device_name=""\} 1$/m,
     'engine_info: the cpu engine on the CPU');
my ($budget) = $text =~ /^hypic:pool_budget_bytes\{engine="gpu",pool="sequence"\} (\d+)$/m;
ok(($budget // 0) > 0,
   'a device engine always has a sequence pool (' . ($budget // '?')
   . ' bytes for requests)');
like($text, qr/^hypic:pool_budget_bytes\{engine="cpu",pool="sequence"\} 0$/m,
     'the CPU engine without seq_budget has none (each request allocates)');
my $h = main::json_of(http_request($srv, 'GET /health'));
my %dev = map { $_->{name} => "$_->{device}/$_->{device_name}" }
          @{ $h->{engines} || [] };
is_deeply({ map { $_ => $dev{$_} } qw(gpu cpu) },
          { gpu => 'cuda:0/host emulator', cpu => 'cpu/' },
          '/health: each engine\'s device');
like($main::gpu->log_text, qr/serving .* prefill chunk 4096,/,
     'a device engine prefills 4096 tokens a step by default');
like($main::cpu->log_text, qr/serving .* prefill chunk 256,/,
     'a CPU engine 256');
my ($used, $total, $full) = $main::gpu->log_text =~
    /cuda:0 \(host emulator\): (\d+) of (\d+) MiB in use after start: .* \((\d+) requests of max_context at once\)/;
ok(defined $used && $used >= 32 && $used < $total && $full >= 2,
   'the device engine logs where its memory went at start ('
   . ($used // '?') . ' of ' . ($total // '?') . ' MiB, the two 16 MiB pools '
   . 'included; ' . ($full // '?') . ' full-context requests fit)');
unlike($main::cpu->log_text, qr/MiB in use after start/,
       'the CPU engine has no device memory to report');
# a SIGHUP logs the kernel tuners' choices (HYPIC_CUDA_TUNE=1): the GDN
# chunk's classes of the prompts prefilled so far (the toy heads run the
# default pass alone, untimed)
$main::gpu->signal('HUP');
ok($main::gpu->log_wait(qr/kernel tuner: gdn_chunk T<=\d+ Hk=\d+ Hv=\d+ dk=\d+ dv=\d+ x=\d+: (?:default|r64|deep|o64|r64\+o64|deep\+o64|tuning) \(default /),
   'SIGHUP: the device engine logs its kernel tuners\' choices')
    or diag(join "\n", grep { /SIGHUP|tuner/ } split /\n/, $main::gpu->log_text);
$main::cpu->signal('HUP');
ok($main::cpu->log_wait(qr/SIGHUP: no --config file/)
   && $main::cpu->log_text !~ /kernel tuner:/,
   'the CPU engine has none to log');
--- no_error_log
[error]



=== TEST 6: a device fault: a clean 503, the engine exits 1, the rest serve on
--- http_config
    @ENGINES@
--- config
    location /f/ { hypic_pass faulty; }
    location /c/ { hypic_pass cpu; }
    location = /health { hypic_health; }
--- timeout: 180
--- response_check
my (undef, undef, $srv) = @_;
my $b = main::body(prompt => 'The capital of Zorvia is', max_tokens => 4,
                   temperature => 0);
my $ok = http_request($srv, "POST /f/v1/completions\n$b", undef, 120);
is($ok->{status}, 200, 'the device serves before its fault');
open(my $fh, '>', $main::FAULT) or die "$main::FAULT: $!";
close $fh;
my $r = http_request($srv, "POST /f/v1/completions\n$b", undef, 120);
is($r->{status}, 503, 'the request in flight when the device faults: 503');
my $e = main::json_of($r)->{error} || {};
is($e->{code}, 'engine_unavailable', 'engine_unavailable');
like($e->{message} // '', qr/cuda:0: .*the device faulted; its context is lost/,
     'the message names the fault (' . ($e->{message} // '') . ')');
is($main::faulty->wait_exit(60), 1 << 8,
   'the engine exits with status 1, for its supervisor to restart it');
like($main::faulty->log_text,
     qr/\[error\] cuda:0: \w+: the device faulted; its context is lost; every request in flight ended .*exiting with status 1/,
     'its log says why');
my $h = main::json_of(http_request($srv, 'GET /health'));
my %state = map { $_->{name} => $_->{state} } @{ $h->{engines} || [] };
is_deeply([@state{qw(faulty cpu)}], ['down', 'up'],
          '/health: the faulted engine is down, the other up');
is(http_request($srv, "POST /c/v1/completions\n$b", undef, 60)->{status},
   200, 'the other engine serves on');
