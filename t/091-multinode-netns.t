# t/090-multinode.t's three nodes and blocks again, with B and C each in a
# network namespace of its own (addresses 10.77.N.2 and .3, a bridge to A
# in the root namespace at 10.77.N.1): peer TCP crosses namespaces as it
# would cross hosts (DESIGN §7). Where namespaces cannot be made (not
# root, no `ip`, EPERM) it runs the loopback-port variant and says why in
# a TAP note. Hypic::Multinode removes namespaces and links at exit.

use strict;
use warnings;

our $NETNS = 1;
my $file = 't/090-multinode.t';
do "./$file";
die "$file: $@" if $@;
