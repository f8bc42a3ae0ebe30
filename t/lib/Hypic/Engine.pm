package Hypic::Engine;

# A private hypic-engine service for a test: `$HYPIC_BUILD/hypic-engine
# serve` on a unix socket in a private directory, with a shared segment
# of its own, stopped by its pid.
#
#   plan skip_all => Hypic::Engine->why_not if Hypic::Engine->why_not;
#   my $engine = Hypic::Engine->start(args => ['--model', $dir]);
#   $engine->socket;  $engine->crash;  $engine->restart;  $engine->stop;

use strict;
use warnings;

use Hypic::Util qw(build_dir private_dir spawn wait_until stop_pid);

my $seq = 0;

sub binary { build_dir() . '/hypic-engine' }

# Why the engine cannot be started here, or '' when it can.
sub why_not {
    my $bin = binary();
    return "no $bin (make engine)" unless -x $bin;
    my $out = `'$bin' serve --help 2>&1`;
    return "$bin has no working 'serve' command"
        if $? != 0 || $out =~ /unknown command|not implemented/i;
    return '';
}

# The model the suites serve: models/test/qwen35-dense.
sub test_model {
    require Hypic::Nginx;
    no warnings 'once';
    return "$Hypic::Nginx::REPO/models/test/qwen35-dense";
}

# How a suite that serves the test model through one engine starts: it
# skips the whole suite (plan skip_all) where no engine can run, the model
# is missing or need (a sub) gives a reason; else it starts `serve --model
# MODEL` with args and the other options of start, makes @ENGINE@ the
# nginx line for it (upstream name, default "tiny", model id, default
# "NAME-1"), and returns the engine. model: default test_model().
#   our $engine = Hypic::Engine->start_suite(args => ['--slots', 2]);
sub start_suite {
    my ($class, %o) = @_;
    require Hypic::Nginx;
    my $model = delete $o{model} // test_model();
    my $name = delete $o{name} // 'tiny';
    my $id = delete $o{id} // "$name-1";
    my $need = delete $o{need};
    my $why = $class->why_not || (-d $model ? '' : "no $model")
              || ($need ? $need->() : '');
    Hypic::Nginx::plan(skip_all => $why) if $why;
    my $engine = $class->start(%o, args => ['--model', $model,
                                            @{ $o{args} || [] }]);
    Hypic::Nginx::add_vars(ENGINE => "hypic_engine $name unix:"
                                     . $engine->socket . " model=$id;");
    return $engine;
}

# args => [...] are passed after `serve`; the socket is added with
# socket_flag (default --socket) unless args already name one, and a
# private --shm name unless args name one (so that suites never share a
# segment name, nor the generation counter that goes with it).
# wrap => [...] goes before the binary (e.g. ip netns exec NAME: a
# command that execs it, so that pid stays the engine's). bin => PATH runs
# another hypic-engine (e.g. one linked against the CUDA emulator).
sub start {
    my ($class, %o) = @_;
    my $dir = private_dir('engine');
    my $sock = "$dir/engine.sock";
    my @args = @{ $o{args} || [] };
    my $flag = $o{socket_flag} // '--socket';
    push @args, $flag, $sock unless grep { $_ eq $flag } @args;
    my ($shm) = map { $args[$_ + 1] } grep { $args[$_] eq '--shm' } 0 .. $#args;
    unless (defined $shm) {
        $shm = "/hypic-t-$$-" . ++$seq;
        push @args, '--shm', $shm;
    }
    my $self = bless { socket => $sock, dir => $dir, args => \@args,
                       env => $o{env}, shm => $shm,
                       wrap => $o{wrap} || [], bin => $o{bin} // binary(),
                       timeout => $o{timeout} // 30 }, $class;
    $self->_spawn;
    return $self;
}

sub _spawn {
    my ($self) = @_;
    my $log = "$self->{dir}/engine.log";
    $self->{pid} = spawn(name => 'hypic-engine', env => $self->{env},
                         cmd => [@{ $self->{wrap} }, $self->{bin}, 'serve',
                                 @{ $self->{args} }],
                         stdout => $log, stderr => $log);
    wait_until(cond => sub { -S $self->{socket} }, pid => $self->{pid},
               timeout => $self->{timeout})
        or die "hypic-engine did not create $self->{socket}:\n"
               . Hypic::Util::slurp($log);
}

sub socket { $_[0]{socket} }
sub dir    { $_[0]{dir} }
sub pid    { $_[0]{pid} }
sub shm    { $_[0]{shm} }
sub alive  { $_[0]{pid} && Hypic::Util::alive($_[0]{pid}) }
sub log_text { Hypic::Util::slurp("$_[0]{dir}/engine.log") }

# Kills the engine at once (default SIGKILL: a crash, no clean-up) and
# reaps it; its socket file stays behind, as after a real crash.
sub crash {
    my ($self, $sig) = @_;
    stop_pid(delete $self->{pid}, $sig // 'KILL', 10) if $self->{pid};
}

# The same engine again (same socket, segment name and flags): a new
# generation. Stops the running one first if there is one.
sub restart {
    my ($self) = @_;
    $self->stop;
    # a crash leaves the socket file: wait for the new one, not that
    unlink $self->{socket};
    $self->_spawn;
    return $self;
}

sub stop {
    my ($self) = @_;
    stop_pid(delete $self->{pid}, 'TERM', 10) if $self->{pid};
}

# Sends a signal ('HUP', 'TERM', ...) to the running engine.
sub signal {
    my ($self, $sig) = @_;
    return $self->{pid} && kill($sig, $self->{pid});
}

# Waits up to $timeout seconds for the engine to exit by itself (after a
# signal); returns its wait status ($?: 0 is exit 0), or undef if it was
# still running and had to be killed.
sub wait_exit {
    my ($self, $timeout) = @_;
    return undef unless $self->{pid};
    return Hypic::Util::wait_exit(delete $self->{pid}, $timeout // 30);
}

# Waits up to $timeout seconds (default 20) for the log to match $re
# $count times (default once); returns whether it did. A bound for
# failures: the engine says when it got somewhere.
sub log_wait {
    my ($self, $re, $timeout, $count) = @_;
    $count //= 1;
    return wait_until(cond => sub {
                          my ($text, $n) = ($self->log_text, 0);
                          $n++ while $text =~ /$re/g;
                          $n >= $count;
                      }, timeout => $timeout // 20);
}

# The reference answer: what `hypic-engine generate` prints for a prompt
# (greedy by default), without the CLI's final newline, as bytes.
#   Hypic::Engine->generate(model => $dir, prompt => $p, max_tokens => 16,
#                           stop => [...], args => [...])
sub generate {
    my ($class, %o) = @_;
    my @cmd = (binary(), 'generate', '--model', $o{model}, '--prompt',
               $o{prompt}, '--max-tokens', $o{max_tokens} // 16,
               (map { ('--stop', $_) } @{ $o{stop} || [] }),
               @{ $o{args} || [] });
    open my $fh, '-|', @cmd or die "hypic-engine generate: $!";
    my $out = do { local $/; <$fh> };
    close $fh or die "hypic-engine generate failed ($?): @cmd\n";
    $out =~ s/\n\z//;
    return $out;
}

# The token ids of a text, from `hypic-engine tokenize`.
sub tokenize {
    my ($class, %o) = @_;
    my @cmd = (binary(), 'tokenize', '--model', $o{model}, '--text',
               $o{text});
    open my $fh, '-|', @cmd or die "hypic-engine tokenize: $!";
    my $out = do { local $/; <$fh> };
    close $fh or die "hypic-engine tokenize failed ($?)\n";
    return split ' ', $out;
}

sub DESTROY {
    my ($self) = @_;
    $self->stop;
    # the generation counter outlives the engine by design; not ours
    unlink "/dev/shm$self->{shm}.gen", "/dev/shm$self->{shm}"
        if $self->{shm} && $self->{shm} =~ m{^/hypic-t-\d+-\d+$};
}



# --------------------------------------------------------------------------
# Client helpers for suites that talk to an engine through nginx: streams
# held open, requests sent at once, server-sent events taken apart. They
# return responses parsed as Hypic::Nginx does (status, headers, body,
# chunks, reads).

package Hypic::Engine::Client;

use strict;
use warnings;

use Exporter 'import';
use IO::Select;
use IO::Socket::INET;
use JSON::PP ();
use Time::HiRes qw(time);

our @EXPORT_OK = qw(open_request read_until finish_request concurrently
                    sse_events sse_text json_body json_of text_of
                    cached_of chatml);

# Sends "METHOD URI\nBODY" on a new connection and returns a handle to
# read the answer with read_until / finish_request.
sub open_request {
    my ($port, $req, $headers) = @_;
    require Hypic::Nginx;
    my $r = Hypic::Nginx::build_request($req, $headers);
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $port, Proto => 'tcp')
        or die "connect: $!";
    local $SIG{PIPE} = 'IGNORE';
    syswrite($s, $r->{raw}) == length $r->{raw} or die "write: $!";
    $s->blocking(0);
    return { sock => $s, method => $r->{method}, data => '', reads => [],
             t0 => time };
}

# Reads until the parsed response satisfies $cond->($res) (or the answer
# is complete, or the peer closed, or $timeout seconds passed: a bound for
# failures, never a measurement). Returns the parsed response so far.
sub read_until {
    my ($h, $cond, $timeout) = @_;
    my $sel = IO::Select->new($h->{sock});
    my $deadline = time + ($timeout // 10);
    my $res = Hypic::Nginx::parse_response($h->{data}, $h->{reads},
                                           $h->{method});
    until ($res->{complete} || ($cond && $cond->($res)) || $h->{eof}) {
        my $left = $deadline - time;
        last if $left <= 0;
        next unless $sel->can_read($left);
        my $n = sysread($h->{sock}, my $buf, 65536);
        next if !defined $n && $!{EAGAIN};
        if (!$n) {
            $h->{eof} = 1;
            last;
        }
        push @{ $h->{reads} }, [scalar @{ $h->{reads} }, $buf,
                                time - $h->{t0}];
        $h->{data} .= $buf;
        $res = Hypic::Nginx::parse_response($h->{data}, $h->{reads},
                                             $h->{method});
    }
    $res->{eof} = $h->{eof};
    return $res;
}

# Reads to the end and closes.
sub finish_request {
    my ($h, $timeout) = @_;
    my $res = read_until($h, undef, $timeout);
    close $h->{sock};
    return $res;
}

# Sends every request at once, each on its own connection, then reads all
# the answers; returns them in order.
sub concurrently {
    my ($port, @reqs) = @_;
    my @h = map { open_request($port, $_) } @reqs;
    return map { finish_request($_, 30) } @h;
}

# A request body: the fields as JSON, keys sorted.
sub json_body {
    my (%f) = @_;
    return JSON::PP->new->canonical->encode(\%f);
}

# Messages (role, content pairs) as the test models' chat template
# renders a chat request: ChatML, open for the assistant's turn.
sub chatml {
    my $p = '';
    while (my ($role, $content) = splice @_, 0, 2) {
        $p .= "<|im_start|>$role\n$content<|im_end|>\n";
    }
    return $p . "<|im_start|>assistant\n";
}

# A response's body decoded ({} if it is not JSON); the completion's text
# as UTF-8 bytes (as the CLI prints it); its usage's cached tokens (-1:
# none reported).
sub json_of {
    my ($res) = @_;
    return eval { JSON::PP->new->utf8->decode($res->{body}) } || {};
}

sub text_of {
    my $t = json_of($_[0])->{choices}[0]{text} // '';
    utf8::encode($t);
    return $t;
}

sub cached_of {
    return json_of($_[0])->{usage}{prompt_tokens_details}{cached_tokens}
        // -1;
}

# The events of an SSE body: decoded JSON objects, '[DONE]', or a string
# "bad: ..." for anything else. Comments (": ping") are left out unless
# $comments, then they come as ':'.
sub sse_events {
    my ($body, $comments) = @_;
    my @ev;
    for my $e (split /\n\n/, $body) {
        if ($e =~ /^:/) {
            push @ev, ':' if $comments;
            next;
        }
        if ($e !~ /\Adata: (.*)\z/s) {
            push @ev, "bad: $e";
            next;
        }
        my $data = $1;
        if ($data eq '[DONE]') {
            push @ev, '[DONE]';
            next;
        }
        my $j = eval { JSON::PP->new->utf8->decode($data) };
        push @ev, defined $j ? $j : "bad: $data";
    }
    return @ev;
}

# The text of a stream's events (completions "text" or chat
# delta.content), as UTF-8 bytes to compare with the CLI's output.
sub sse_text {
    my $text = '';
    for my $e (@_) {
        next unless ref $e eq 'HASH' && $e->{choices} && @{ $e->{choices} };
        my $c = $e->{choices}[0];
        $text .= $c->{text} // $c->{delta}{content} // '';
    }
    utf8::encode($text);
    return $text;
}

1;
