# The device check's reference scripts (bench/gpu_engine_ref.py,
# bench/gpu_kernels_ref.py, bench/fla_warmup.py) around their
# measurements, without torch or a GPU: bench/test_gpu_refs.py (each shape
# warmed up before it is timed, engine.tsv from our rows alone,
# kernels.tsv's columns, a SIGTERM that still leaves kernels.tsv and
# report.md; the FLA warm-up's failure without FLA, its workers stopped
# with it; bench/device_decide.py's tables of the choices a run settles).

use strict;
use warnings;
use lib 't/lib';

use Test::More;
use Hypic::Util qw(python_module);

my $why = python_module('numpy');
plan skip_all => $why if $why;

my $out = `python3 bench/test_gpu_refs.py -v -b 2>&1`;
my $rc = $?;
my @ok = $out =~ /^(test_\w+) .* \.\.\. ok$/mg;
ok($rc == 0 && @ok == 7, 'the reference scripts\' checks pass (' . scalar(@ok)
   . '/7)') or diag($out);
done_testing();
