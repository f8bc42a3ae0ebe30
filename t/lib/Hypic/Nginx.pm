package Hypic::Nginx;

# A Test::Nginx-style data-driven runner on Test::Base. For each block of
# the calling script's __DATA__: write nginx.conf into a private prefix,
# start Debian's nginx on a free loopback port, send the requests, check
# the answers and the error log, stop nginx by its pid. t/lib/README.md
# lists the sections.

use strict;
use warnings;

use Test::Base;
use Test::More ();
use File::Basename qw(dirname);
use File::Spec;
use IO::Select;
use IO::Socket::INET;
use JSON::PP ();
use Time::HiRes qw(time);
use Hypic::Util qw(build_dir private_dir free_port spawn wait_until
                   port_open stop_pid wait_exit slurp);

our $NGINX = $ENV{HYPIC_NGINX} // '/usr/sbin/nginx';
our $REPO = File::Spec->rel2abs(dirname(__FILE__) . '/../../..');

my %vars;        # @NAME@ substitutions added by the test script

sub import {
    my $caller = caller;
    no strict 'refs';
    *{"${caller}::$_"} = \&{$_}
        for qw(run_tests add_vars http_request blocks plan ok is isnt like
               unlike is_deeply diag pass fail skip cmp_ok start_server
               stop_server log_lines);
}

# Makes @NAME@ in every later block's config expand to the value.
sub add_vars {
    my %v = @_;
    @vars{keys %v} = values %v;
}

sub run_tests {
    my $module = module_path();
    Test::More::BAIL_OUT("no $module: run make module") unless -f $module;
    # through Test::Base's wrapper of plan(), so its END does not plan again
    Test::More::plan('no_plan') unless Test::More->builder->has_plan;
    run_block($_) for blocks();
}

sub module_path { build_dir() . '/nginx/ngx_http_hypic_module.so' }

sub run_block {
    my ($block) = @_;
    my $name = $block->name;
    my $srv = prepare($block);

    if (defined $block->must_die || defined $block->config_test_fails
        || defined $block->config_test)
    {
        my $fails = !defined $block->config_test;
        my ($status, $out) = nginx_t($srv);
        if ($fails) {
            isnt($status, 0, "$name - nginx -t fails");
        } else {
            is($status, 0, "$name - nginx -t succeeds") or diag($out);
        }
        check_log($block, $out . slurp("$srv->{prefix}/logs/error.log"),
                  !$fails);
        return;
    }

    if (!start_nginx($srv, $block)) {
        fail("$name - nginx starts");
        diag(slurp("$srv->{prefix}/logs/error.log"),
             slurp("$srv->{prefix}/logs/stderr.log"));
        stop_pid($srv->{pid}, 'KILL', 5);
        return;
    }

    # a mistake in a block fails that block; nginx is stopped all the same
    eval {
        my @requests = requests($block);
        my $timeout = one(scalar $block->timeout) // 10;
        my @responses;
        for my $i (0 .. $#requests) {
            my $res = exchange($srv->{port}, $requests[$i], $timeout);
            push @responses, $res;
            my $tag = @requests > 1 ? "$name - request $i" : $name;
            check_response($block, $res, $i, $tag);
        }
        response_check($block, \@responses, $srv);
        1;
    } or fail("$name - the block died: $@");

    my $status = stop_pid($srv->{pid}, 'QUIT', 15);
    ok(defined $status, "$name - nginx exits on QUIT");
    my $log = slurp("$srv->{prefix}/logs/error.log");
    check_log($block, $log, 1);
    # nginx points its stderr at the error log once started, so a worker's
    # sanitizer report lands there; the master's early ones in stderr.log
    my $stderr = slurp("$srv->{prefix}/logs/stderr.log");
    my @reports = grep { /AddressSanitizer|LeakSanitizer|runtime error:/ }
                  split /\n/, "$stderr\n$log";
    ok(!@reports, "$name - no sanitizer report") or diag(join "\n", @reports);
}

# --- response_check: Perl run with (\@responses, $block, $server) in
# package main, so it can call ok(), is(), like() and http_request()
# directly; or an "eval" giving a sub. $server has prefix, port and pid.
sub response_check {
    my ($block, $responses, $srv) = @_;
    my $code = $block->response_check;
    return unless defined $code;
    $code = eval "package main; sub { $code\n}" or die $@ unless ref $code;
    $code->($responses, $block, $srv);
}

# One more request to the block's nginx, from a response_check: "GET /x"
# (with optional header lines) or raw bytes; returns the parsed response.
sub http_request {
    my ($srv, $req, $headers, $timeout) = @_;
    $req = build_request($req, $headers) unless $req =~ /\r\n\r\n/;
    return exchange($srv->{port}, $req, $timeout // 10);
}

# A second nginx beside the block's (a peer node, a stub upstream), from
# the same sections given as strings: http_config, config, main_config,
# workers, log_level. @NAME@ expands as in blocks (PORT is its own port).
# Returns { prefix, port, pid }; stop_server stops it (QUIT), and it is
# stopped at exit anyway.
sub start_server {
    my (%o) = @_;
    my $spec = Hypic::Nginx::Spec->new(%o);
    my $srv = prepare($spec);
    start_nginx($srv, $spec)
        or die "the second nginx did not start:\n"
               . slurp("$srv->{prefix}/logs/error.log")
               . slurp("$srv->{prefix}/logs/stderr.log");
    return $srv;
}

sub stop_server {
    my ($srv) = @_;
    return stop_pid(delete $srv->{pid}, 'QUIT', 15) if $srv->{pid};
    return 0;
}

# The lines of a log file under a server's prefix, once there are at least
# $n of them (nginx writes an access log line after the answer has gone,
# so a client may look before it is there); at most $timeout seconds.
sub log_lines {
    my ($srv, $file, $n, $timeout) = @_;
    my $path = "$srv->{prefix}/logs/$file";
    my @lines;
    wait_until(cond => sub {
                   @lines = grep { length } split /\n/, slurp($path);
                   @lines >= ($n // 1);
               }, timeout => $timeout // 10);
    return @lines;
}

# A private prefix with conf/nginx.conf written for the block.
sub prepare {
    my ($block) = @_;
    my $prefix = private_dir('nginx');
    mkdir "$prefix/$_" for qw(conf logs tmp html);
    my $port = free_port();
    my %v = (%vars, PORT => $port, SERVER_PORT => $port, PREFIX => $prefix,
             BUILD => build_dir(), REPO => $REPO,
             ERROR_PAGES => shipped_error_pages());
    open my $fh, '>', "$prefix/conf/nginx.conf" or die "$prefix: $!";
    print $fh subst(conf_text($block, $port), \%v);
    close $fh;
    return { prefix => $prefix, port => $port };
}

# The server-level lines of conf/nginx.conf.in that answer nginx's own
# refusals in OpenAI's error shape: its error_page lines for /hypic_error
# and that location ('' when the file has none).
sub shipped_error_pages {
    my $conf = slurp("$REPO/conf/nginx.conf.in");
    my @pages = $conf =~ /^\s*(error_page\s[^;]*\/hypic_error;)/mg;
    my ($loc) = $conf =~ /^\s*(location = \/hypic_error \{[^}]*\})/m;
    return @pages && $loc ? join("\n", @pages, $loc) : '';
}

sub subst {
    my ($text, $v) = @_;
    $text =~ s/\@([A-Z][A-Z0-9_]*)\@/exists $v->{$1} ? $v->{$1} : "\@$1\@"/ge;
    return $text;
}

sub conf_text {
    my ($block, $port) = @_;
    my $main = $block->main_config // '';
    my $http = $block->http_config // '';
    my $server = $block->config // '';
    # as root, workers would run as nobody and could not reach the prefix
    my $user = ($> == 0 && $main !~ /^\s*user\s/m) ? "user root;" : '';
    my $workers = one(scalar $block->workers) // 1;
    my $level = one(scalar $block->log_level) // 'debug';
    my $module = module_path();
    return <<"CONF";
load_module $module;
$user
worker_processes $workers;
error_log logs/error.log $level;
pid logs/nginx.pid;
$main
events {
    worker_connections 256;
}
http {
    access_log logs/access.log;
    default_type text/plain;
    client_body_temp_path tmp/client_body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
$http
    server {
        listen 127.0.0.1:$port;
        server_name localhost;
$server
    }
}
CONF
}

# Under HYPIC_ASAN=1 nginx itself is not instrumented: preload libasan for
# our module, and do not count nginx's by-design leaks at exit.
sub nginx_env {
    return {} unless $ENV{HYPIC_ASAN};
    chomp(my $lib = `gcc -print-file-name=libasan.so`);
    my @opts = grep { length && !/^detect_leaks=/ } split /:/,
               $ENV{ASAN_OPTIONS} // '';
    return { LD_PRELOAD => $lib,
             ASAN_OPTIONS => join(':', @opts, 'detect_leaks=0') };
}

sub nginx_cmd {
    my ($srv, @args) = @_;
    return [$NGINX, '-p', "$srv->{prefix}/", '-c', 'conf/nginx.conf',
            '-e', 'logs/error.log', @args];
}

sub nginx_t {
    my ($srv) = @_;
    my $out = "$srv->{prefix}/logs/nginx-t.out";
    my $pid = spawn(name => 'nginx -t', env => nginx_env(),
                    cmd => nginx_cmd($srv, '-t'),
                    stdout => $out, stderr => $out);
    my $status = wait_exit($pid, 30);
    return ($status // -1, slurp($out));
}

sub start_nginx {
    my ($srv, $block) = @_;
    my $master = one(scalar $block->master_process) // 'on';
    $srv->{pid} = spawn(name => 'nginx', env => nginx_env(),
                        cmd => nginx_cmd($srv, '-g',
                                         "daemon off; master_process $master;"),
                        stdout => "$srv->{prefix}/logs/stderr.log",
                        stderr => "$srv->{prefix}/logs/stderr.log");
    return wait_until(cond => sub { port_open($srv->{port}) },
                      pid => $srv->{pid}, timeout => 15);
}

# A one-line section's value without its newline.
sub one {
    my ($v) = @_;
    chomp $v if defined $v;
    return $v;
}

# --- requests ------------------------------------------------------------

sub requests {
    my ($block) = @_;
    if (defined $block->raw_request) {
        my $raw = $block->raw_request;
        return ref $raw ? @$raw : ($raw);
    }
    return () unless defined $block->request;
    my $req = $block->request;
    my @reqs = ref $req ? @$req : ($req);
    my $more = $block->more_headers;
    return map { build_request($reqs[$_], pick($more, $_)) } 0 .. $#reqs;
}

# "METHOD URI [PROTOCOL]\nBODY" to bytes on the wire.
sub build_request {
    my ($req, $more) = @_;
    chomp $req;
    my ($line, $body) = split /\n/, $req, 2;
    my ($method, $uri, $proto) = split ' ', $line;
    my @more = grep { length } split /\n/, $more // '';
    my $head = "$method $uri " . ($proto // 'HTTP/1.1') . "\r\n"
               . "Host: localhost\r\n";
    $head .= "$_\r\n" for @more;
    $head .= "Connection: close\r\n" unless grep { /^connection:/i } @more;
    if (defined $body) {
        utf8::encode($body) if utf8::is_utf8($body);
        $head .= "Content-Length: " . length($body) . "\r\n"
            unless grep { /^(content-length|transfer-encoding):/i } @more;
    }
    return { raw => $head . "\r\n" . ($body // ''), method => $method };
}

# Writes the request while reading the answer; every read is kept as
# [index, bytes, seconds since start] so streams can be checked for
# incremental arrival. Stops at EOF, when the response is complete, or at
# the timeout.
sub exchange {
    my ($port, $req, $timeout) = @_;
    $req = { raw => $req, method => '' } unless ref $req;
    my $raw = $req->{raw};
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port,
                                  Proto => 'tcp')
        or return { error => "connect: $!", reads => [], headers => {} };
    $s->blocking(0);
    local $SIG{PIPE} = 'IGNORE';
    my $sel = IO::Select->new($s);
    my ($off, $data, @reads) = (0, '');
    my $t0 = time;
    my $res = parse_response('', [], $req->{method});
    while (!$res->{complete}) {
        my $left = $t0 + $timeout - time;
        if ($left <= 0) {
            $res->{error} = "timeout after ${timeout}s";
            last;
        }
        my ($r, $w) = IO::Select->select($sel,
                                         $off < length $raw ? $sel : undef,
                                         undef, $left);
        if ($w && @$w) {
            my $n = syswrite($s, $raw, 65536, $off);
            # a peer that stopped reading has answered: go read it
            $off = defined $n ? $off + $n
                 : $!{EAGAIN} ? $off : length $raw;
        }
        next unless $r && @$r;
        my $n = sysread($s, my $buf, 65536);
        next if !defined $n && $!{EAGAIN};
        last if !$n;
        push @reads, [scalar @reads, $buf, time - $t0];
        $data .= $buf;
        $res = parse_response($data, \@reads, $req->{method});
    }
    close $s;
    $res->{error} //= 'no response' unless defined $res->{status};
    return $res;
}

# Status, headers (lower-case names => [values]), body, and chunks: the
# decoded chunks of a chunked body, else the body's share of each read,
# each as [index of the read it completed in, bytes].
sub parse_response {
    my ($raw, $reads, $method) = @_;
    my $res = { raw => $raw, reads => $reads, headers => {}, chunks => [],
                body => '', complete => 0 };
    my $end = index $raw, "\r\n\r\n";
    return $res if $end < 0;
    my ($status, @lines) = split /\r\n/, substr($raw, 0, $end);
    ($res->{status}) = $status =~ m{^HTTP/\d\.\d (\d{3})};
    for (@lines) {
        push @{ $res->{headers}{lc $1} }, $2 if /^([^:]+):\s*(.*)$/;
    }
    my $pos = $end + 4;
    my $h = $res->{headers};
    if ($method eq 'HEAD' || ($res->{status} // '') =~ /^(1..|204|304)$/) {
        $res->{complete} = 1;
    } elsif (($h->{'transfer-encoding'}[0] // '') =~ /chunked/i) {
        while ((my $eol = index $raw, "\r\n", $pos) >= 0) {
            my $size = hex((split /;/, substr($raw, $pos, $eol - $pos))[0]);
            my $start = $eol + 2;
            last if length($raw) < $start + $size + 2;
            if ($size == 0) {
                $res->{complete} = 1;
                last;
            }
            push @{ $res->{chunks} },
                 [read_index($reads, $start + $size),
                  substr($raw, $start, $size)];
            $res->{body} .= substr($raw, $start, $size);
            $pos = $start + $size + 2;
        }
    } else {
        my $len = $h->{'content-length'}[0];
        $res->{body} = substr($raw, $pos);
        $res->{complete} = 1
            if defined $len && length $res->{body} >= $len;
        my $seen = 0;
        for my $r (@$reads) {
            my $from = $pos > $seen ? $pos - $seen : 0;
            $seen += length $r->[1];
            push @{ $res->{chunks} }, [$r->[0], substr($r->[1], $from)]
                if $from < length $r->[1];
        }
    }
    return $res;
}

sub read_index {
    my ($reads, $offset) = @_;
    my $sum = 0;
    for my $r (@$reads) {
        $sum += length $r->[1];
        return $r->[0] if $sum >= $offset;
    }
    return $#$reads;
}

# --- checks --------------------------------------------------------------

# A section's value for request i: arrays (from "eval") are per request.
sub pick {
    my ($v, $i) = @_;
    return ref $v eq 'ARRAY' ? $v->[$i] : $v;
}

sub check_response {
    my ($block, $res, $i, $name) = @_;
    if ($res->{error}) {
        fail("$name - response: $res->{error}");
        diag($res->{raw}) if length($res->{raw} // '');
        return;
    }
    my $code = pick(scalar $block->error_code, $i);
    if (defined $code) {
        chomp $code;
        is($res->{status}, $code, "$name - status") or diag($res->{body});
    }
    my $headers = pick(scalar $block->response_headers, $i) // '';
    for my $line (split /\n/, $headers) {
        if ($line =~ /^!\s*(\S+)/) {
            ok(!exists $res->{headers}{lc $1}, "$name - no $1 header");
        } elsif ($line =~ /^([^:]+):\s*(.*?)\s*$/) {
            is(join(', ', @{ $res->{headers}{lc $1} || [] }), $2,
               "$name - header $1");
        }
    }
    $headers = pick(scalar $block->response_headers_like, $i) // '';
    for my $line (split /\n/, $headers) {
        next unless $line =~ /^([^:]+):\s*(.*?)\s*$/;
        like(join(', ', @{ $res->{headers}{lc $1} || [] }), qr/$2/,
             "$name - header $1 like");
    }
    my $body = pick(scalar $block->response_body, $i);
    is($res->{body}, $body, "$name - body") if defined $body;
    my $like = pick(scalar $block->response_body_like, $i);
    if (defined $like) {
        chomp $like unless ref $like;
        like($res->{body}, ref $like ? $like : qr/$like/s,
             "$name - body like");
    }
    my $json = pick(scalar $block->response_body_json, $i);
    check_json($res->{body}, $json, $name) if defined $json;
    my $chunks = pick(scalar $block->response_chunks_like, $i);
    check_chunks($res, $chunks, $name) if defined $chunks;
}

# Every field of the expected JSON (text, or a Perl structure whose
# leaves may be qr//) must be in the body with that value; fields not
# named are not checked.
sub check_json {
    my ($body, $want, $name) = @_;
    my $got = eval { JSON::PP->new->utf8->allow_nonref->decode($body) };
    if (!defined $got && $@) {
        fail("$name - body is JSON: $@");
        diag($body);
        return;
    }
    $want = JSON::PP->new->utf8->allow_nonref->decode($want) unless ref $want;
    my $err = json_diff($got, $want, '$');
    ok(!$err, "$name - body JSON") or diag("$err\n$body");
}

sub json_diff {
    my ($got, $want, $path) = @_;
    my $show = sub { defined $_[0] ? JSON::PP->new->allow_nonref
                     ->allow_blessed->canonical->encode($_[0]) : 'null' };
    if (ref $want eq 'HASH') {
        return "$path is not an object" unless ref $got eq 'HASH';
        for my $k (sort keys %$want) {
            return "$path.$k is missing" unless exists $got->{$k};
            my $e = json_diff($got->{$k}, $want->{$k}, "$path.$k");
            return $e if $e;
        }
        return '';
    }
    if (ref $want eq 'ARRAY') {
        return "$path is not an array" unless ref $got eq 'ARRAY';
        return "$path has " . @$got . " elements, expected " . @$want
            if @$got != @$want;
        for my $i (0 .. $#$want) {
            my $e = json_diff($got->[$i], $want->[$i], "$path\[$i]");
            return $e if $e;
        }
        return '';
    }
    return (defined $got && !ref $got && $got =~ $want) ? ''
           : "$path is " . $show->($got) . ", expected $want"
        if ref $want eq 'Regexp';
    return (!defined $got) ? ''
           : "$path is " . $show->($got) . ", expected null"
        if !defined $want;
    return (JSON::PP::is_bool($got) && !$got == !$want) ? ''
           : "$path is " . $show->($got) . ", expected " . $show->($want)
        if JSON::PP::is_bool($want);
    return (defined $got && !ref $got && $got eq $want) ? ''
           : "$path is " . $show->($got) . ", expected " . $show->($want);
}

# One regex per line (or an array of qr//) against the chunks, in order.
sub check_chunks {
    my ($res, $want, $name) = @_;
    my @want = ref $want ? @$want : map { qr/$_/s } split /\n/, $want;
    my @got = map { $_->[1] } grep { length $_->[1] } @{ $res->{chunks} };
    is(scalar @got, scalar @want, "$name - chunk count")
        or diag(explain_chunks($res));
    for my $i (0 .. $#want) {
        like($got[$i] // '', $want[$i], "$name - chunk $i");
    }
}

sub explain_chunks {
    my ($res) = @_;
    return join '', map { "read $_->[0]: " . JSON::PP->new->allow_nonref
                          ->encode($_->[1]) . "\n" } @{ $res->{chunks} };
}

sub patterns {
    my ($v) = @_;
    return () unless defined $v;
    return @$v if ref $v eq 'ARRAY';
    return ($v) if ref $v;
    return grep { length } split /\n/, $v;
}

sub matches {
    my ($p, $text) = @_;
    return ref $p ? $text =~ $p : index($text, $p) >= 0;
}

# error_log / no_error_log, and (when $alerts) no [alert], [crit] or
# [emerg] line that the block does not expect.
sub check_log {
    my ($block, $log, $alerts) = @_;
    my $name = $block->name;
    my @expect = patterns(scalar $block->error_log);
    for my $p (@expect) {
        ok(matches($p, $log), "$name - error_log has $p") or diag($log);
    }
    for my $p (patterns(scalar $block->no_error_log)) {
        my @bad = grep { matches($p, $_) } split /\n/, $log;
        ok(!@bad, "$name - error_log lacks $p") or diag(join "\n", @bad);
    }
    return unless $alerts;
    my @bad = grep { my $l = $_; !grep { matches($_, $l) } @expect }
              grep { /\[(alert|crit|emerg)\]/ } split /\n/, $log;
    ok(!@bad, "$name - no unexpected [alert], [crit] or [emerg]")
        or diag(join "\n", @bad);
}



# The sections of start_server, shaped like a Test::Base block.
package Hypic::Nginx::Spec;

sub new {
    my ($class, %o) = @_;
    return bless { name => 'second nginx', %o }, $class;
}

sub name           { $_[0]{name} }
sub main_config    { $_[0]{main_config} }
sub http_config    { $_[0]{http_config} }
sub config         { $_[0]{config} }
sub workers        { $_[0]{workers} }
sub log_level      { $_[0]{log_level} }
sub master_process { $_[0]{master_process} }

1;
