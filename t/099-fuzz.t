# Each libFuzzer target of fuzz/ (make fuzz-build, fuzz/README.md) runs
# for a few seconds from its seed corpus: one test per target, failing on
# a sanitizer report, a broken invariant of the target, or a crash.
# HYPIC_FUZZ_SECONDS sets the time per target (default 4); `make fuzz`
# runs them for longer. The mutations follow a fixed seed (HYPIC_FUZZ_SEED,
# default 1): the suite is a regression check that replays the same inputs
# on every run, not a search whose outcome depends on luck; new findings
# come from `make fuzz` and join the seed corpus.

use strict;
use warnings;
use Test::More;
use File::Basename qw(basename dirname);
use Cwd qw(abs_path);

my $repo = abs_path(dirname(__FILE__) . '/..');
my $build = $ENV{HYPIC_FUZZ_BUILD} || "$repo/build-fuzz";
my $secs = $ENV{HYPIC_FUZZ_SECONDS} || 4;
$ENV{FUZZ_SEED} = $ENV{HYPIC_FUZZ_SEED} || 1;

# the targets carry their own sanitizers; make test-asan has no fuzz build
plan skip_all => 'fuzz targets run under make test, not test-asan'
    if $ENV{HYPIC_ASAN};

my @targets = map { basename($_, '.c') } glob("$repo/fuzz/fuzz_*.c");
ok(@targets >= 7, 'fuzz/ has its targets') or diag(join ' ', @targets);

chdir $repo or die "$repo: $!";
for my $t (@targets) {
    my $bin = "$build/fuzz/$t";
    if (!-x $bin) {
        fail("$t is built ($bin; make fuzz-build)");
        next;
    }
    my $out = `fuzz/run.sh $bin $secs 2>&1`;
    my $rc = $? >> 8;
    my ($line) = $out =~ /^(\Q$t\E: ok.*)$/m;
    ok($rc == 0 && $line, "$t runs $secs s clean") or diag($out);
    note($line) if $line;
}

done_testing();
