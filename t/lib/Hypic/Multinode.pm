package Hypic::Multinode;

# The three nodes of the multi-node suites (DESIGN §7): engines B and C
# serve their segments and prefills to peers (--peer-listen), engine A
# serves nginx and sends its cold segments to them (--peers). B also asks
# C for a cold segment before it computes one (--peers C --peer-fetch 1,
# fetches logged at debug): a segment C prefilled is reused on B. All
# three take requests from nginx (engines_conf). Either on
# loopback ports (t/090), or with B and C each in a network namespace of
# its own, joined to A by a bridge with addresses of their own (t/091):
#
#   root namespace: nginx --unix--> A (bridge hpbrPID, 10.77.N.1)
#   hptPID-b: B on 10.77.N.2  hptPID-c: C on 10.77.N.3  (veth pairs)
#
# Unix sockets and shared memory belong to the file system, not to a
# network namespace: nginx reaches B and C as it reaches A; only peer TCP
# crosses namespaces. Without namespaces (not root, no `ip`, EPERM) the fixture
# falls back to loopback ports and says why. Namespaces and links are
# removed at exit, even after a failure, and leftovers of runs that died
# (their pid is gone) before a new set-up.
#
#   my $mn = Hypic::Multinode->start(model => $dir, netns => 1);
#   $mn->{mode};  $mn->{why};  my ($A, $B, $C) = $mn->engines;
#   $mn->{b_peer};  $mn->{c_peer};  $mn->c_backlog;
#   add_vars(ENGINES => $mn->engines_conf);  # hypic_engine mn_a, mn_b, mn_c

use strict;
use warnings;

use POSIX ();
use Hypic::Engine;
use Hypic::Util qw(free_port);

my @live;    # fixtures whose namespaces and links are still there
my $owner = $$;

sub start {
    my ($class, %o) = @_;
    my $self = bless { mode => 'loopback', why => '', tag => $$ }, $class;
    if ($o{netns}) {
        $self->{why} = $self->_netns_up;
        $self->{mode} = 'netns' unless $self->{why};
    }
    my ($pb, $pc) = (free_port(), free_port());
    my @common = ('--model', $o{model}, '--threads', 1, '--public-pool',
                  '64m', '--private-pool', '16m');
    my ($hb, $hc) = ('127.0.0.1', '127.0.0.1');
    my (@wb, @wc);
    if ($self->{mode} eq 'netns') {
        ($hb, $hc) = ("$self->{net}.2", "$self->{net}.3");
        @wb = ($self->{ip}, 'netns', 'exec', $self->{ns_b});
        @wc = ($self->{ip}, 'netns', 'exec', $self->{ns_c});
    }
    @$self{qw(b_peer c_peer)} = ("$hb:$pb", "$hc:$pc");
    $self->{B} = Hypic::Engine->start(
        wrap => \@wb,
        args => [@common, '--node', 'mn-b', '--peer-listen', "$hb:$pb",
                 '--peers', $self->{c_peer}, '--peer-fetch', 1,
                 '--peer-timeout-ms', 600000, '--log-level', 'debug']);
    $self->{C} = Hypic::Engine->start(
        wrap => \@wc,
        args => [@common, '--node', 'mn-c', '--peer-listen', "$hc:$pc"]);
    $self->{A} = Hypic::Engine->start(
        args => [@common, '--node', 'mn-a', '--prefill-workers', 1,
                 '--peers', "$self->{b_peer},$self->{c_peer}",
                 '--peer-timeout-ms', 600000]);
    return $self;
}

sub engines { @{ $_[0] }{qw(A B C)} }

# nginx's hypic_engine lines for the three: mn_a, mn_b, mn_c.
sub engines_conf {
    my ($self) = @_;
    return join ' ', map {
        "hypic_engine mn_\L$_\E unix:" . $self->{$_}->socket
            . ' model=tiny-1;'
    } qw(A B C);
}

# The namespace a pid runs in ('' for the root one), from `ip`.
sub netns_of {
    my ($self, $pid) = @_;
    my ($ok, $out) = _ip($self->{ip}, 'netns', 'identify', $pid);
    $out =~ s/\s+\z//;
    return $ok ? $out : "?($out)";
}

# Connections waiting in the accept queue of C's peer port, read in C's
# own namespace (/proc/PID/net/tcp shows the namespace of PID); -1 if
# there is no such listener.
sub c_backlog {
    my ($self) = @_;
    my ($port) = $self->{c_peer} =~ /:(\d+)\z/;
    my $pid = $self->{C}->pid or return -1;
    my $hex = sprintf ':%04X', $port;
    open my $fh, '<', "/proc/$pid/net/tcp" or return -1;
    while (my $l = <$fh>) {
        my @f = split ' ', $l;
        next unless $f[1] =~ /\Q$hex\E$/ && $f[3] eq '0A';
        return hex((split /:/, $f[4])[1]);
    }
    return -1;
}

# ---- namespaces -----------------------------------------------------------

sub _find_ip {
    for my $d (split(/:/, $ENV{PATH} // ''), qw(/usr/sbin /sbin /usr/bin
                                                /bin)) {
        return "$d/ip" if $d && -x "$d/ip";
    }
    return undef;
}

# Runs ip with args, stderr with stdout; (success, output).
sub _ip {
    my ($ip, @args) = @_;
    my $pid = open(my $fh, '-|');
    return (0, "fork: $!") unless defined $pid;
    if (!$pid) {
        open STDERR, '>&', \*STDOUT;
        exec { $ip } $ip, @args or POSIX::_exit(127);
    }
    local $/;
    my $out = <$fh> // '';
    close $fh;
    return ($? == 0, $out);
}

# Namespaces and links left by runs whose process is gone.
sub _sweep {
    my ($ip) = @_;
    my (undef, $ns) = _ip($ip, 'netns', 'list');
    for (split /\n/, $ns) {
        next unless /^(hpt(\d+)-[bc])\b/ && !kill(0, $2);
        _ip($ip, 'netns', 'del', $1);
    }
    my (undef, $links) = _ip($ip, '-o', 'link', 'show');
    for (split /\n/, $links) {
        next unless /^\d+:\s+(hp(?:br|v)(\d+)[bc]?)[\@:]/ && !kill(0, $2);
        _ip($ip, 'link', 'del', $1);
    }
}

# A /24 under 10.77 that no interface here uses yet.
sub _free_net {
    my ($ip, $tag) = @_;
    my (undef, $addrs) = _ip($ip, '-o', '-4', 'addr', 'show');
    for my $i (0 .. 249) {
        my $n = ($tag + $i) % 250 + 1;
        return "10.77.$n" unless $addrs =~ /\binet 10\.77\.$n\./;
    }
    return undef;
}

# '' when B's and C's namespaces are up, else why not (nothing is left
# behind then).
sub _netns_up {
    my ($self) = @_;
    return 'not root' if $> != 0;
    my $ip = $self->{ip} = _find_ip()
        or return 'no ip command (iproute2)';
    _sweep($ip);
    my $t = $self->{tag};
    my $net = $self->{net} = _free_net($ip, $t)
        or return 'no free 10.77.N.0/24';
    @$self{qw(ns_b ns_c br vb vc)} =
        ("hpt$t-b", "hpt$t-c", "hpbr$t", "hpv${t}b", "hpv${t}c");
    push @live, $self;
    my @steps = (
        ['netns', 'add', $self->{ns_b}],
        ['netns', 'add', $self->{ns_c}],
        ['link', 'add', $self->{br}, 'type', 'bridge'],
        ['addr', 'add', "$net.1/24", 'dev', $self->{br}],
        ['link', 'set', $self->{br}, 'up'],
    );
    for ([$self->{vb}, $self->{ns_b}, "$net.2"],
         [$self->{vc}, $self->{ns_c}, "$net.3"]) {
        my ($veth, $ns, $addr) = @$_;
        push @steps,
            ['link', 'add', $veth, 'type', 'veth', 'peer', 'name', 'eth0',
             'netns', $ns],
            ['link', 'set', $veth, 'master', $self->{br}],
            ['link', 'set', $veth, 'up'],
            ['-n', $ns, 'addr', 'add', "$addr/24", 'dev', 'eth0'],
            ['-n', $ns, 'link', 'set', 'eth0', 'up'],
            ['-n', $ns, 'link', 'set', 'lo', 'up'];
    }
    for my $s (@steps) {
        my ($ok, $out) = _ip($ip, @$s);
        next if $ok;
        $out =~ s/\s+\z//;
        $self->_netns_down;
        return "ip @$s: $out";
    }
    # a signal that ends the test still runs END, which cleans up
    $SIG{$_} ||= sub { exit 1 } for qw(INT TERM HUP);
    return '';
}

sub _netns_down {
    my ($self) = @_;
    return unless $self->{ip} && $self->{ns_b};
    # the engines inside first: a namespace lives as long as its processes
    $_ && $_->stop for @$self{qw(B C)};
    _ip($self->{ip}, 'link', 'del', $_) for @$self{qw(vb vc br)};
    _ip($self->{ip}, 'netns', 'del', $_) for @$self{qw(ns_b ns_c)};
    delete $self->{ns_b};
    @live = grep { $_ != $self } @live;
}

END {
    local $?;
    if ($$ == $owner) {
        $_->_netns_down for @live;
    }
}

1;
