# The CUDA twins (kernels/cuda) against the CPU kernels without a GPU: the
# host emulator (kernels/cuda/emu/run.sh) compiles the .cu files with g++
# and runs kernels/test/test_cuda_kernels.c on the reduced shape grid
# (HK_CUDA_TEST_GRID=small), threads in tid order and in reverse, so a
# missing barrier fails one of the two. `make test-cuda-emu` runs the
# full grid.

use strict;
use warnings;
use lib 't/lib';

use Test::More;
use Hypic::Util qw(build_dir private_dir);

my $lib = build_dir() . '/libhk_cpu.a';
plan skip_all => "no $lib (make first)" unless -f $lib;
# ASan and ucontext stack switching do not mix, and an instrumented
# libhk_cpu.a needs the sanitizer runtime the emulator build does not link.
plan skip_all => 'not under the sanitizers' if $ENV{HYPIC_ASAN};
for my $tool (qw(g++ python3)) {
    plan skip_all => "no $tool"
        unless grep { -x "$_/$tool" } split /:/, $ENV{PATH};
}

my $work = private_dir('cuda-emu');
my $log = `HK_EMU_BUILD=$work HK_EMU_ORDERS= kernels/cuda/emu/run.sh $lib 2>&1`;
ok($? == 0, 'the CUDA kernels and the test build against the emulator')
    or diag($log), done_testing(), exit;

for my $order (qw(forward reverse)) {
    my $out = `HK_CUDA_TEST_GRID=small HK_EMU_ORDER=$order $work/test_cuda_kernels 2>&1`;
    my $rc = $?;
    my @lines = split /\n/, $out;
    my ($plan) = map { /^1\.\.(\d+)/ ? $1 : () } @lines;
    my $pass = grep { /^ok \d+/ && !/# SKIP/ } @lines;
    my @fail = grep { /^not ok/ } @lines;
    ok($rc == 0 && defined $plan && $plan > 0 && $pass == $plan,
       "threads in $order order: " . ($pass // 0) . '/' . ($plan // '?')
       . ' CUDA twins agree with the CPU')
        or diag(join "\n", @fail ? @fail : @lines[-20 .. -1]);
}

done_testing();
