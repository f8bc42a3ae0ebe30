package Hypic::Engine;

# A private hypic-engine service for a test: `$HYPIC_BUILD/hypic-engine
# serve` on a unix socket in a private directory, stopped by its pid.
#
#   plan skip_all => Hypic::Engine->why_not if Hypic::Engine->why_not;
#   my $engine = Hypic::Engine->start(args => ['--model', $dir]);
#   $engine->socket;  $engine->stop;

use strict;
use warnings;

use Hypic::Util qw(build_dir private_dir spawn wait_until stop_pid);

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

# args => [...] are passed after `serve`; the socket is added with
# socket_flag (default --socket) unless args already name one.
sub start {
    my ($class, %o) = @_;
    my $dir = private_dir('engine');
    my $sock = "$dir/engine.sock";
    my @args = @{ $o{args} || [] };
    my $flag = $o{socket_flag} // '--socket';
    push @args, $flag, $sock unless grep { $_ eq $flag } @args;
    my $pid = spawn(name => 'hypic-engine', env => $o{env},
                    cmd => [binary(), 'serve', @args],
                    stdout => "$dir/engine.log", stderr => "$dir/engine.log");
    my $self = bless { pid => $pid, socket => $sock, dir => $dir }, $class;
    wait_until(cond => sub { -S $sock }, pid => $pid,
               timeout => $o{timeout} // 30)
        or die "hypic-engine did not create $sock:\n"
               . Hypic::Util::slurp("$dir/engine.log");
    return $self;
}

sub socket { $_[0]{socket} }
sub dir    { $_[0]{dir} }
sub pid    { $_[0]{pid} }
sub alive  { $_[0]{pid} && Hypic::Util::alive($_[0]{pid}) }

sub stop {
    my ($self) = @_;
    stop_pid(delete $self->{pid}, 'TERM', 10) if $self->{pid};
}

sub DESTROY { $_[0]->stop }

1;
