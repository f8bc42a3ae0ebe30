package Hypic::Redis;

# A private redis-server for a test: free loopback port, private directory,
# no persistence. Stopped by its pid when the object goes or at exit.
#
#   my $redis = Hypic::Redis->start;
#   $redis->port;  $redis->command(qw(SET k v));  $redis->stop;

use strict;
use warnings;

use IO::Socket::INET;
use Hypic::Util qw(private_dir free_port spawn wait_until port_open
                   stop_pid);

sub start {
    my ($class, %o) = @_;
    my $bin = $o{bin} // 'redis-server';
    my $dir = private_dir('redis');
    my $port = free_port();
    my $pid = spawn(name => 'redis-server',
                    cmd => [$bin, '--port', $port, '--bind', '127.0.0.1',
                            '--dir', $dir, '--save', '', '--appendonly',
                            'no', '--daemonize', 'no', '--logfile',
                            "$dir/redis.log"]);
    my $self = bless { pid => $pid, port => $port, dir => $dir }, $class;
    wait_until(cond => sub { port_open($port) }, pid => $pid,
               timeout => $o{timeout} // 10)
        or die "redis-server did not start on port $port, see $dir\n";
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
