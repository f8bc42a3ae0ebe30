# What ptxas gave each CUDA kernel at sm_90a (the build keeps its -v report
# beside each object) against kernels/cuda/ptxas-sm90a.tsv: no kernel's
# stack frame or spills grew, none is new or gone from the list
# (tools/ptxas_report.py; after a deliberate change, rerun it with
# --update). No GPU needed: the build compiles for sm_90a here. Skipped in
# a build without nvcc.

use strict;
use warnings;
use lib 't/lib';

use Test::More;
use Hypic::Util qw(build_dir);

my @logs = glob(build_dir() . '/obj/kernels/cuda/*.cu.o.log');
plan skip_all => 'no CUDA objects (a build without nvcc)' unless @logs;

my $base = 'kernels/cuda/ptxas-sm90a.tsv';
my $out = `python3 tools/ptxas_report.py --check $base @logs 2>&1`;
my $rc = $?;
my ($n) = $out =~ /^(\d+) kernels at sm_90a/m;
ok($rc == 0 && $n, "every kernel's stack and spills at sm_90a as "
   . "$base has them (" . ($n // 0) . ' kernels)')
    or diag($out . "\n(objects built before the nvcc rule kept ptxas -v: "
            . 'remove ' . build_dir() . '/obj/kernels/cuda/*.o and make)');

# the checker itself: a kernel whose spills grew, a new one and a gone one
# are each caught
my $dir = build_dir() . '/ptxas-check';
mkdir $dir;
open(my $fh, '>', "$dir/a.log") or die;
print $fh <<'EOF';
ptxas info    : Compiling entry function '_Z1av' for 'sm_90a'
ptxas info    : Function properties for _Z1av
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for __internal_callee
    64 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers
ptxas info    : Compiling entry function '_Z1bv' for 'sm_90a'
ptxas info    : Function properties for _Z1bv
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers
ptxas info    : Compiling entry function '_Z1bv' for 'sm_80'
ptxas info    : Function properties for _Z1bv
    99 bytes stack frame, 99 bytes spill stores, 99 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers
EOF
close $fh;
open($fh, '>', "$dir/base.tsv") or die;
print $fh "# a baseline\n_Z1av\t40\t0\t0\t0\n_Z1bv\t250\t8\t4\t12\n"
    . "_Z1cv\t32\t0\t0\t0\n";
close $fh;
$out = `python3 tools/ptxas_report.py --check $dir/base.tsv $dir/a.log 2>&1`;
ok($? != 0 && $out =~ /^b\(\): spill stores grew: stack 8 -> 8, spills 4\/12 -> 8\/12$/m
   && $out =~ /^gone \(still in the baseline\): c\(\)$/m
   && $out !~ /a\(\)/ && $out =~ /^2 kernels at sm_90a; 2 against/m,
   'the check catches a kernel that spills more and one gone, not a '
   . "callee's frame nor sm_80's") or diag($out);
open($fh, '>', "$dir/base.tsv") or die;
print $fh "_Z1bv\t250\t8\t8\t12\n";
close $fh;
$out = `python3 tools/ptxas_report.py --check $dir/base.tsv $dir/a.log 2>&1`;
ok($? != 0 && $out =~ /^new kernel \(not in the baseline\): a\(\): 40 registers/m
   && $out =~ /; 1 against/, 'and a new kernel') or diag($out);
done_testing();
