# `make run`'s tools/run.sh as a person runs it, on ports and a run
# directory of its own (conf/run.env's variables) and the test model:
# it comes up and serves completions; when its Redis dies, nginx and the
# engine go on serving (Redis only shares the segment index) and the log
# says so; when the engine dies, run.sh stops the rest and exits; the
# shipped nginx.conf answers nginx's own refusals in JSON. Every wait is
# for a condition, with a bound; nothing measures time.

use strict;
use warnings;
use lib 't/lib';

use IO::Socket::INET;
use Time::HiRes qw(sleep);
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Util qw(private_dir free_port spawn wait_until port_open alive
                   stop_pid slurp);

Hypic::Engine::Client->import(qw(json_body json_of text_of));

our $MODEL = Hypic::Engine->test_model;
my $why = Hypic::Engine->why_not || (-d $MODEL ? '' : "no $MODEL")
          || (system('command -v redis-server >/dev/null') == 0
              ? '' : 'no redis-server');
plan(skip_all => $why) if $why;

my $dir = private_dir('make-run');
my ($http, $rport) = (free_port(), free_port());
my $log = "$dir/run.log";

# under HYPIC_ASAN=1, nginx as the harness starts it (libasan preloaded
# for the module), through a wrapper run.sh takes for its nginx
my %asan;
my $env = Hypic::Nginx::nginx_env();
if (%$env) {
    open my $fh, '>', "$dir/nginx" or die "$dir/nginx: $!";
    print $fh "#!/bin/sh\n",
        (map { "export $_='$env->{$_}'\n" } sort keys %$env),
        "exec $Hypic::Nginx::NGINX \"\$@\"\n";
    close $fh;
    chmod 0755, "$dir/nginx";
    %asan = (HYPIC_NGINX => "$dir/nginx");
}

# its own process group, so that whatever is left can be found by it
my $run = spawn(
    name => 'run.sh', stdout => $log, stderr => $log,
    cmd => ['setsid', 'bash', "$Hypic::Nginx::REPO/tools/run.sh"],
    env => { HYPIC_HTTP_PORT => $http, HYPIC_REDIS_PORT => $rport,
             HYPIC_RUN_DIR => "$dir/run", HYPIC_MODEL => $MODEL,
             HYPIC_BUILD => Hypic::Util::build_dir(),
             HYPIC_ENGINE_FLAGS => "--node t-run --shm /hypic-t-run-$$ "
                                   . '--slots 4 --public-pool 64m '
                                   . '--private-pool 16m', %asan });

END {
    # run.sh's trap stops its three; the group is only for a run.sh that
    # could not (it is ours: setsid made its pid the group's id)
    if ($run && alive($run)) {
        stop_pid($run, 'TERM', 20);
    }
    kill 'KILL', -$run if $run && kill 0, -$run;
    # what the engine leaves when killed: its segment, its generation
    unlink "/dev/shm/hypic-t-run-$$", "/dev/shm/hypic-t-run-$$.gen";
}

my $srv = { port => $http };

sub completion {
    return http_request($srv, "POST /v1/completions\n"
                        . json_body(prompt => 'Hello world', max_tokens => 4,
                                    temperature => 0), undef, 60);
}

# the pid of run.sh's Redis, from INFO server
sub redis_pid {
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $rport, Proto => 'tcp')
        or return undef;
    print $s "*2\r\n\$4\r\nINFO\r\n\$6\r\nserver\r\n";
    my $reply = '';
    while ($reply !~ /process_id:(\d+)\r\n/) {
        last unless sysread($s, my $buf, 65536);
        $reply .= $buf;
    }
    close $s;
    return $reply =~ /process_id:(\d+)\r\n/ ? $1 : undef;
}

my $up = wait_until(cond => sub { slurp($log) =~ /HYPIC serve is up/ },
                    pid => $run, timeout => 120);
ok($up, 'run.sh says HYPIC serve is up') or diag(slurp($log));

my $want = Hypic::Engine->generate(model => $MODEL, prompt => 'Hello world',
                                   max_tokens => 4);

SKIP: {
    skip 'run.sh did not come up', 12 unless $up;

    my $r = completion();
    is($r->{status}, 200, 'a completion') or diag($r->{body});
    is(text_of($r), $want, 'its text is the CLI\'s');

    $r = http_request($srv, "TRACE / HTTP/1.1\r\nHost: x\r\n"
                            . "Connection: close\r\n\r\n");
    is($r->{status}, 405, 'the shipped config: TRACE is a 405');
    is(json_of($r)->{error}{code}, 'method_not_allowed', '... in JSON')
        or diag($r->{body});

    # Redis dies (as in a crash): the engine and nginx serve on
    my $rpid = redis_pid();
    ok($rpid, "run.sh's Redis answers INFO");
    skip 'no Redis pid', 7 unless $rpid;
    kill 'KILL', $rpid;

    ok(wait_until(cond => sub { slurp($log) =~ /redis exited/ },
                  timeout => 20),
       'run.sh logs that Redis went away') or diag(slurp($log));
    like(slurp($log), qr/redis exited.*still serving/,
         'and that it goes on serving');
    ok(alive($run), 'run.sh is still running');

    $r = completion();
    is($r->{status}, 200, 'a completion after Redis died')
        or diag($r->{body}, slurp($log));
    is(text_of($r), $want, 'the same text');
    $r = http_request($srv, 'GET /health');
    is($r->{status}, 200, '/health answers');

    # the engine crashes: without it nothing is served, so run.sh stops
    my ($epid) = slurp($log) =~ /\[engine\].*serving .*\bpid (\d+)/;
    ok($epid, 'the engine logged its pid') or diag(slurp($log));
    skip 'no engine pid', 3 unless $epid;
    kill 'KILL', $epid;
    ok(wait_until(cond => sub { !alive($run) }, timeout => 30),
       'run.sh exits when the engine dies') or diag(slurp($log));
    like(slurp($log), qr/engine exited.*stopping/,
         'saying the engine exited');
    ok(wait_until(cond => sub { !port_open($http) }, timeout => 20),
       'nginx is stopped');
}

my @reports = grep { /AddressSanitizer|LeakSanitizer|runtime error:/ }
              split /\n/, slurp($log) . slurp("$dir/run/nginx/logs/error.log");
ok(!@reports, 'no sanitizer report') or diag(join "\n", @reports);

Test::More::done_testing();
