package Hypic::Redis;

# A private redis-server for a test: free loopback port, private directory,
# no persistence. Stopped by its pid when the object goes or at exit.
#
#   my $redis = Hypic::Redis->start;
#   $redis->port;  $redis->command(qw(SET k v));  $redis->stop;
#   $redis->start_again;          # the same port and directory: Redis back
#   my $hole = Hypic::Redis->blackhole;  # accepts, never answers

use strict;
use warnings;

use IO::Socket::INET;
use Hypic::Util qw(private_dir free_port spawn wait_until port_open
                   stop_pid);

sub start {
    my ($class, %o) = @_;
    my $self = bless { bin => $o{bin} // 'redis-server',
                       dir => private_dir('redis'),
                       port => $o{port} // free_port(),
                       timeout => $o{timeout} // 10 }, $class;
    $self->_spawn;
    return $self;
}

sub _spawn {
    my ($self) = @_;
    my ($port, $dir) = @$self{qw(port dir)};
    $self->{pid} = spawn(name => 'redis-server',
                         cmd => [$self->{bin}, '--port', $port, '--bind',
                                 '127.0.0.1', '--dir', $dir, '--save', '',
                                 '--appendonly', 'no', '--daemonize', 'no',
                                 '--logfile', "$dir/redis.log"]);
    wait_until(cond => sub { port_open($port) }, pid => $self->{pid},
               timeout => $self->{timeout})
        or die "redis-server did not start on port $port, see $dir\n";
}

# A stopped server again, on the same port (empty: nothing is saved).
sub start_again {
    my ($self) = @_;
    $self->stop;
    $self->_spawn;
    return $self;
}

# A server that accepts connections and never answers: a Redis that hangs.
# It has ->port and ->stop like the real one, and no ->command.
sub blackhole {
    my ($class) = @_;
    my $port = free_port();
    my $code = <<'PERL';
use IO::Socket::INET;
my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $ARGV[0],
                              Proto => 'tcp', Listen => 64, ReuseAddr => 1)
    or die "listen: $!";
my @held;
while (my $c = $l->accept) { push @held, $c }
PERL
    my $pid = spawn(name => 'redis blackhole', cmd => [$^X, '-e', $code, $port]);
    my $self = bless { pid => $pid, port => $port, dir => '' }, $class;
    wait_until(cond => sub { port_open($port) }, pid => $pid, timeout => 10)
        or die "the blackhole did not listen on port $port\n";
    return $self;
}

sub port { $_[0]{port} }
sub dir  { $_[0]{dir} }
sub pid  { $_[0]{pid} }

sub stop {
    my ($self) = @_;
    stop_pid(delete $self->{pid}, 'TERM', 5) if $self->{pid};
}

sub DESTROY { $_[0]->stop }

# One command over RESP; returns the reply (arrays as array refs, errors as
# "ERR ..." strings, nil as undef).
sub command {
    my ($self, @args) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1',
                                  PeerPort => $self->{port}, Proto => 'tcp')
        or die "redis: connect: $!";
    print $s join '', "*" . @args . "\r\n",
        map { '$' . length($_) . "\r\n$_\r\n" } @args;
    my $reply = _reply($s);
    close $s;
    return $reply;
}

sub _reply {
    my ($s) = @_;
    my $line = <$s>;
    die "redis: connection closed\n" unless defined $line;
    $line =~ s/\r\n\z//;
    my ($type, $rest) = (substr($line, 0, 1), substr($line, 1));
    return $rest if $type eq '+' || $type eq '-' || $type eq ':';
    if ($type eq '$') {
        return undef if $rest < 0;
        read($s, my $data, $rest + 2);
        return substr($data, 0, $rest);
    }
    if ($type eq '*') {
        return undef if $rest < 0;
        return [map { _reply($s) } 1 .. $rest];
    }
    die "redis: bad reply '$line'\n";
}

1;
