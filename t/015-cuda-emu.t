# The CUDA twins (kernels/cuda) against the CPU kernels without a GPU: the
# host emulator (kernels/cuda/emu/run.sh) compiles the .cu files with g++
# and runs kernels/test/test_cuda_kernels.c on the reduced shape grid
# (HK_CUDA_TEST_GRID=small), threads in tid order and in reverse, so a
# missing barrier fails one of the two. `make test-cuda-emu` runs the
# full grid. Then bench/gpu_kernels on toy shapes (--tiny) and
# bench/gpu_kernels_ref.py on its dumps: the plumbing the GPU host's
# device check runs, and our outputs against a float64 reference. Then
# the CUDA backend (engine/backend/backend_cuda.c) on the emulator: whole
# test models against the CPU backend (engine/test/test_cuda_backend.c),
# the caches there (test_cuda_pic.c), and hypic-engine and
# bench/gpu_engine with --device cuda.

use strict;
use warnings;
use lib 't/lib';

use Test::More;
use Hypic::Util qw(build_dir private_dir python_module);

my $lib = build_dir() . '/libhk_cpu.a';
my $hypic = build_dir() . '/libhypic.a';
plan skip_all => "no $lib or $hypic (make first)"
    unless -f $lib && -f $hypic;
# ASan and ucontext stack switching do not mix, and an instrumented
# libhk_cpu.a needs the sanitizer runtime the emulator build does not link.
plan skip_all => 'not under the sanitizers' if $ENV{HYPIC_ASAN};
for my $tool (qw(g++ python3)) {
    plan skip_all => "no $tool"
        unless grep { -x "$_/$tool" } split /:/, $ENV{PATH};
}

my $work = private_dir('cuda-emu');

# Runs an emulated TAP program (threads in tid order): one check that all
# its (more than 2) checks passed.
sub tap_all {
    my ($cmd, $what) = @_;
    my $out = `HK_EMU_ORDER=forward $cmd 2>&1`;
    my $rc = $?;
    my @lines = split /\n/, $out;
    my ($plan) = map { /^1\.\.(\d+)/ ? $1 : () } @lines;
    my $pass = grep { /^ok \d+/ } @lines;
    ok($rc == 0 && defined $plan && $plan > 2 && $pass == $plan,
       "$what (" . ($pass // 0) . '/' . ($plan // '?') . ')')
        or diag($out);
}
my $log = `HK_EMU_BUILD=$work HK_EMU_BENCH=1 HK_EMU_ORDERS= HK_EMU_ENGINE=$hypic kernels/cuda/emu/run.sh $lib 2>&1`;
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

SKIP: {
    my $why = python_module('numpy');
    skip $why, 3 if $why;
    my $out = `$work/gpu_kernels --tiny --out $work/bench.tsv --dump $work/dump 2>&1`;
    ok($? == 0 && -s "$work/bench.tsv", 'gpu_kernels --tiny runs on the emulator')
        or diag($out);
    $out = `python3 bench/gpu_kernels_ref.py --bench $work/bench.tsv --dump $work/dump --out $work/res 2>&1`;
    ok($? == 0 && -s "$work/res/kernels.tsv" && -s "$work/res/report.md",
       'gpu_kernels_ref.py writes kernels.tsv and report.md')
        or diag($out);
    # our outputs against float64: f32 kernels ~1e-7, the bf16 chunk (v2,
    # v1, the first kernel A, the shared-SM pass), the f32-in tensor-core
    # one and the tensor-core attention prefill (bf16 hi/lo splits) ~1e-5
    # (the pass in registers, reg, too), the chunk's fast variants (single
    # bf16 products, as FLA's bf16 path; fasta: kernel A's too;
    # f32mmaround: f32 in rounded once, tc_bf16's) ~3e-3 here, the
    # attention's bf16-operand variants (wmma, FLASH2, FLASH3 on wgmma and
    # FLASH3_SEQ) ~1e-3 (FLASH2X, FLASH2's on hi/lo splits: ~1e-5), conv states are
    # copies; the fused step once per kernel
    # (default, kh, pipe, pipe32)
    my %limit = (ours_bf16 => 1e-4, ours_bf16v1 => 1e-4, ours_f32mma => 1e-4,
                 ours_f32mmav1 => 1e-4, ours_bf16a1 => 1e-4,
                 ours_f32mmaa1 => 1e-4, ours_bf16ps => 1e-4,
                 ours_f32mmaps => 1e-4, ours_bf16reg => 1e-4,
                 ours_f32mmareg => 1e-4, ours_bf16fast => 1e-2,
                 ours_f32mmafast => 1e-2, ours_bf16fasta => 1e-2,
                 ours_bf16fastareg => 1e-2,
                 ours_f32mmaround => 1e-2, ours_att_bf16 => 2e-2,
                 ours_att_flash2 => 2e-2, ours_att_flash2x => 2e-5,
                 ours_att_flash3 => 2e-2, ours_att_flash3seq => 2e-2,
                 conv => 0);
    my (@bad, $n);
    open(my $fh, '<', "$work/res/accuracy.tsv") or die;
    <$fh>;
    while (<$fh>) {
        chomp;
        my ($case, $what, $who, $err) = split /\t/;
        next unless $who =~ /^ours/;
        $n++;
        my $lim = $what eq 'conv' ? 0 : $limit{$who} // 2e-6;
        $lim = 2e-5 if $case =~ /^attention_prefill/ && $who eq 'ours';
        push @bad, $_ unless $err <= $lim;
    }
    ok($n == 75 && !@bad, "$n of our outputs within their float64 bounds")
        or diag(join "\n", @bad);
}

{
    # An f32 copy of the bf16 MoE model: its MoE ops at f32 tolerance
    # (test_cuda_backend.c says why the bf16 one cannot be held to it).
    my $moe = '';
    unless (python_module('numpy')) {
        system("rm -rf $work/moe-f32 && python3 tools/convert_weights.py "
               . "--to f32 models/test/qwen35-moe $work/moe-f32 >/dev/null");
        $moe = "$work/moe-f32" if $? == 0;
    }
    # the small grid: one int8 model (qwen35-dense-int8, the I8 projections
    # against the CPU's), without its batched and KVBuffer checks. The
    # KVBuffer's v2 kernels by name: a step, a flush or a verification they
    # could not take would be an error, not a quiet fall back to v1.
    tap_all("HYPIC_CUDA_KVBUF=v2 HK_CUDA_TEST_GRID=small "
            . "$work/test_cuda_backend $moe",
            'the CUDA backend on whole models agrees with the CPU backend');
}

# The caches on the emulated device (test_cuda_pic: capture, warm and cold
# splice, naive, prefix resume against the CPU backend) on one model here;
# `make test-cuda-emu` and a GPU run all of them.
tap_all("$work/test_cuda_pic qwen35-dense",
        'PIC, naive and prefix resume on the CUDA backend agree with the CPU');

# Serving allocates device memory at start only (test_cuda_pool: the
# sequence pool with the segment builders' sequences, the workspaces and
# the backend's scratch), in full, pic (cold, warm), naive and prefix
# modes and with two prefill workers; a request over the pool's room
# waits, one over its size or a segment over max_segment is refused. On
# the dense model here; a GPU run adds its int8 twin (the I8 tile).
tap_all("$work/test_cuda_pool qwen35-dense",
        'serving on the CUDA backend allocates no device memory after its '
        . 'start');

# Peers between device nodes (test_cuda_peer: entries served from and
# fetched into device pools, device <-> CPU byte for byte, a remote PREFILL
# on the device node's one builder, no device allocation after start).
tap_all("$work/test_cuda_peer qwen35-dense",
        'the peer transport moves entries in and out of device pools');

# hypic-engine on the emulated device: pic mode (each document captured,
# then spliced warm) gives the CPU's greedy text.
{
    my $prompt = join('<|pic_sep|>', 'Lead.',
                      'The capital of Zorvia is Quellam, by the sea.',
                      'Water boils at one hundred degrees.', 'Capital?');
    my %text;
    for my $dev (qw(cpu cuda)) {
        $text{$dev} = `HK_EMU_ORDER=forward $work/hypic-engine generate --model models/test/qwen35-dense --device $dev --mode pic --seam 3 --max-tokens 3 --prompt '$prompt' 2>&1`;
        $text{"$dev rc"} = $?;
    }
    ok($text{'cpu rc'} == 0 && $text{'cuda rc'} == 0
       && $text{cuda} eq $text{cpu},
       'generate --mode pic --device cuda gives the CPU\'s text')
        or diag("cpu: $text{cpu}\ncuda: $text{cuda}");
}

# The engine's prefill on FLASH2 (HYPIC_CUDA_ATT=flash2: bf16 operands,
# scratch from the forward plan), FLASH2X (flash2x: its hi/lo split
# operands, twice the scratch) and FLASH3 (flash3: wgmma, bf16 operands,
# its tiles' scratch) against the default FLASH and the CPU: every
# position's logits, a bf16 kernel's error for FLASH2 and FLASH3 (FLASH
# ~3e-5, FLASH2 ~6e-4 here), FLASH's bound for FLASH2X, the same greedy
# token everywhere.
SKIP: {
    my $why = python_module('numpy');
    skip $why, 4 if $why;
    my $prompt = 'The capital of Zorvia is Quellam, by the sea. Water boils '
        . 'at one hundred degrees. The capital of Zorvia is';
    my $rc = 0;
    for my $run (['cpu', 'flash'], ['cuda', 'flash'], ['cuda', 'flash2'],
                 ['cuda', 'flash2x'], ['cuda', 'flash3']) {
        my ($dev, $att) = @$run;
        system("HYPIC_CUDA_ATT=$att HK_EMU_ORDER=forward $work/hypic-engine "
               . "logits --model models/test/qwen35-dense --device $dev --all "
               . "--prompt '$prompt' --out $work/lg-$dev-$att.st >/dev/null 2>&1");
        $rc ||= $?;
    }
    my $cmp = <<'PY';
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = {k: v for k, v in json.loads(b[8:8 + n]).items() if k != '__metadata__'}
    (t,) = h.values()
    o = t['data_offsets']
    return np.frombuffer(b[8 + n + o[0]:8 + n + o[1]], np.float32).reshape(t['shape'])
c, f, f2, f2x, f3 = (load(sys.argv[1] + x) for x in
                     ('cpu-flash.st', 'cuda-flash.st', 'cuda-flash2.st',
                      'cuda-flash2x.st', 'cuda-flash3.st'))
e = lambda g: float(np.abs(g - c).max() / np.abs(c).max())
same = all((g.argmax(-1) == c.argmax(-1)).all() for g in (f, f2, f2x, f3))
# FLASH2X's and FLASH3's own logits, not their fallbacks' (FLASH's, FLASH2's
# bit for bit)
ran = int(bool((f2x != f).any()))
ran3 = int(bool((f3 != f2).any()))
print(f'{e(f):.2e} {e(f2):.2e} {e(f2x):.2e} {int(same)} {ran} {e(f3):.2e} {ran3}')
PY
    open(my $py, '>', "$work/lg-cmp.py") or die;
    print $py $cmp;
    close $py;
    my ($ef, $ef2, $ef2x, $same, $ran, $ef3, $ran3) =
        split ' ', `python3 $work/lg-cmp.py $work/lg- 2>&1`;
    ok($rc == 0 && $same && $ef <= 1e-4 && $ef2 > $ef && $ef2 <= 5e-3,
       "logits --device cuda with FLASH2 prefill: within 5e-3 of the CPU's "
       . '(' . ($ef2 // '?') . '; FLASH ' . ($ef // '?') . '), greedy tokens '
       . 'the same')
        or diag("rc $rc, same " . ($same // '?'));
    # FLASH's bound, and well under FLASH2's error: the split is what
    # buys the f32 parity
    ok($rc == 0 && $same && $ran && $ef2x <= 1e-4 && $ef2x * 5 < $ef2,
       "logits --device cuda with FLASH2X prefill: within FLASH's 1e-4 of "
       . "the CPU's (" . ($ef2x // '?') . '; FLASH2 ' . ($ef2 // '?')
       . '), greedy tokens the same')
        or diag("rc $rc, same " . ($same // '?') . ', ran ' . ($ran // '?'));
    # bf16 operands as FLASH2, its own kernel (the emulator is an H100)
    # --dtype picks them without HYPIC_CUDA_ATT: bf16 is FLASH2, auto on
    # this f32 checkpoint FLASH2X (the CLI through the model's precision to
    # the backend's kernel), bit for bit
    my $rcd = 0;
    for my $dt (qw(bf16 auto)) {
        system("env -u HYPIC_CUDA_ATT HK_EMU_ORDER=forward $work/hypic-engine "
               . "logits --model models/test/qwen35-dense --device cuda "
               . "--dtype $dt --all --prompt '$prompt' "
               . "--out $work/lg-dtype-$dt.st >/dev/null 2>&1");
        $rcd ||= $?;
    }
    ok($rc == 0 && $rcd == 0
       && system("cmp -s $work/lg-dtype-bf16.st $work/lg-cuda-flash2.st") == 0
       && system("cmp -s $work/lg-dtype-auto.st $work/lg-cuda-flash2x.st") == 0,
       'logits --dtype bf16: FLASH2\'s logits bit for bit; --dtype auto on an '
       . 'f32 checkpoint: FLASH2X\'s');
    ok($rc == 0 && $same && $ran3 && $ef3 > $ef && $ef3 <= 5e-3,
       "logits --device cuda with FLASH3 prefill: within 5e-3 of the CPU's "
       . '(' . ($ef3 // '?') . '; FLASH2 ' . ($ef2 // '?') . '), greedy tokens '
       . 'the same')
        or diag("rc $rc, same " . ($same // '?') . ', ran ' . ($ran3 // '?'));
}

# bench/gpu_engine's PIC rows on the emulated device (toy shapes): every
# one a figure, none "unsupported"; and a prefill's op profile (--profile):
# its kinds of op, with their calls, sum to the whole.
{
    my $out = `HK_EMU_ORDER=forward $work/gpu_engine --model models/test/qwen35-dense --device cuda --tokens 16 --batch '' --decode 1 --pic 1x10 --seam 3 --reps 1 --lead 2 --query 2 --piece 16 --profile 1 --tsv $work/engine.tsv 2>&1`;
    my $rc = $?;
    my %v;
    if (open my $fh, '<', "$work/engine.tsv") {
        for (<$fh>) { my @f = split /\t/; $v{$f[0]} = $f[2]; }
    }
    my @want = qw(ttft_full ttft_pic_cold ttft_pic_warm pic_compose_per_seg
                  pic_rerotate_per_seg pic_seam_per_seg);
    my @bad = grep { ($v{$_} // '') !~ /^[0-9.e+-]+$/ || $v{$_} <= 0 } @want;
    ok($rc == 0 && !@bad, 'gpu_engine --device cuda: every PIC row measured')
        or diag("bad: @bad\n$out");
    my ($all, $ops) = $out =~ /^# profile prefill T=16: ([0-9.]+) ms of device time in (\d+) ops/m;
    my (%calls, $pct);
    while ($out =~ /^#   (\S.*?)\s+([0-9.]+) ms\s+([0-9.]+) %\s+(\d+) calls$/mg) {
        $calls{$1} = $4;
        $pct += $3;
    }
    my $sum = 0;
    $sum += $_ for values %calls;
    ok(defined $ops && $calls{linear} && $calls{attention}
       && $calls{'gdn_chunk (tensor cores)'} && $sum == $ops
       && abs($pct - 100) < 1,
       "gpu_engine --profile 1: a prefill's device time by op ($ops ops, "
       . scalar(keys %calls) . ' kinds)') or diag($out);
}

done_testing();
