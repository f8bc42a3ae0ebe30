package Hypic::Util;

# Process and socket helpers shared by the harness and its fixtures: free
# loopback ports, private directories, and child processes that are started
# and stopped by their own pid and always reaped, even when a test dies.

use strict;
use warnings;

use Exporter 'import';
use File::Spec;
use File::Temp ();
use IO::Socket::INET;
use JSON::PP ();
use POSIX ();
use Time::HiRes qw(sleep time);

our @EXPORT_OK = qw(build_dir private_dir free_port spawn wait_until
                    port_open alive stop_pid wait_exit slurp python_module
                    run_python);

my %live;            # pid => name, every child still running
my $owner = $$;      # END below runs in this process only

# '' when Python package $pkg imports in $python (python3 unless given),
# installing it from PyPI ($pip, default $pkg) if it is missing; else why
# not. The suites that
# drive real clients and reference scripts call it before they skip.
sub python_module {
    my ($pkg, $python, $pip) = @_;
    $python //= $ENV{HYPIC_PYTHON} // 'python3';
    $pip //= $pkg;
    my $imports = sub { system("$python -c 'import $pkg' >/dev/null 2>&1") == 0 };
    return '' if $imports->();
    return "no $python" if system("$python -c 1 >/dev/null 2>&1") != 0;
    system("timeout 300 $python -m pip install --quiet "
           . "--disable-pip-version-check '$pip' >/dev/null 2>&1");
    return '' if $imports->();
    return "the $pkg Python package is missing and pip could not install $pip";
}

# Runs a Python script (text) with args in $python, within timeout
# seconds: its exit status, its output, and its last line decoded as JSON
# ({} if it is not).
sub run_python {
    my ($script, $python, $timeout, @args) = @_;
    my $dir = private_dir('py');
    open my $fh, '>', "$dir/script.py" or die "$dir: $!";
    print $fh $script;
    close $fh;
    my $out = `timeout $timeout $python $dir/script.py @args 2>&1`;
    my $rc = $?;
    my $json = eval { JSON::PP->new->decode((split /\n/, $out)[-1]) } || {};
    return ($rc, $out, $json);
}

# $HYPIC_BUILD, or ./build: where the module and hypic-engine are.
sub build_dir {
    return File::Spec->rel2abs($ENV{HYPIC_BUILD} // 'build');
}

# A fresh directory under $TMPDIR, removed at exit unless HYPIC_KEEP=1.
sub private_dir {
    my ($tag) = @_;
    return File::Temp::tempdir("hypic-$tag-XXXXXX", TMPDIR => 1,
                               CLEANUP => !$ENV{HYPIC_KEEP});
}

# A file's content, '' if it cannot be read.
sub slurp {
    my ($file) = @_;
    open my $fh, '<', $file or return '';
    local $/;
    return scalar <$fh>;
}

# A loopback port nobody listens on right now.
sub free_port {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
                                  Proto => 'tcp', Listen => 1)
        or die "free_port: $!";
    my $port = $s->sockport;
    close $s;
    return $port;
}

sub port_open {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $port, Proto => 'tcp');
    return 0 unless $s;
    close $s;
    return 1;
}

# Starts cmd => [...] with env => {...} added, stdout and stderr to the
# files given (default /dev/null). Returns the child's pid.
sub spawn {
    my (%o) = @_;
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        open STDIN, '<', '/dev/null';
        open STDOUT, '>>', $o{stdout} // '/dev/null';
        open STDERR, '>>', $o{stderr} // '/dev/null';
        $ENV{$_} = $o{env}{$_} for keys %{ $o{env} || {} };
        exec { $o{cmd}[0] } @{ $o{cmd} } or POSIX::_exit(127);
    }
    $live{$pid} = $o{name} // $o{cmd}[0];
    return $pid;
}

# True while pid has not exited (reaps it when it has).
sub alive {
    my ($pid) = @_;
    return 0 unless $live{$pid};
    my $r = waitpid($pid, POSIX::WNOHANG());
    return 1 if $r == 0;
    delete $live{$pid};
    return 0;
}

# Polls cond until it is true; gives up after timeout seconds or as soon
# as pid (if given) has exited. Returns the last value of cond.
sub wait_until {
    my (%o) = @_;
    my $deadline = time + ($o{timeout} // 10);
    while (1) {
        my $v = $o{cond}->();
        return $v if $v;
        return 0 if defined $o{pid} && !alive($o{pid});
        return 0 if time > $deadline;
        sleep 0.02;
    }
}

# Sends sig (default TERM), waits up to timeout seconds, then KILLs.
# Returns the exit status, or undef if it had to be killed.
sub stop_pid {
    my ($pid, $sig, $timeout) = @_;
    local $?;
    return 0 unless $live{$pid};
    kill $sig // 'TERM', $pid;
    my $deadline = time + ($timeout // 10);
    while (time < $deadline) {
        if (waitpid($pid, POSIX::WNOHANG()) == $pid) {
            delete $live{$pid};
            return $?;
        }
        sleep 0.02;
    }
    kill 'KILL', $pid;
    waitpid($pid, 0);
    delete $live{$pid};
    return undef;
}

# Waits up to timeout seconds for pid to exit by itself; returns $?.
sub wait_exit {
    my ($pid, $timeout) = @_;
    return stop_pid($pid, 0, $timeout);
}

END {
    # keep the test's exit status: waitpid sets $?
    local $?;
    if ($$ == $owner) {
        stop_pid($_, 'TERM', 5) for keys %live;
    }
}

1;
