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
#
# The emulated programs are single-threaded and independent of each
# other: after the build they run as jobs, HK_EMU_JOBS (default 2, the
# machine's cores) at a time, longest first, and the checks below read
# their outputs in the order they always had. The reverse order runs the
# groups of test_cuda_kernels whose kernels have something for it to catch
# (barriers, shared memory, warp shuffles, asynchronous copies); the
# others' kernels are elementwise, each thread on its own elements, and
# the tid order run covers them.

use strict;
use warnings;
use lib 't/lib';

use POSIX ();
use Test::More;
use Hypic::Util qw(build_dir private_dir python_module slurp);

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

my $log = `HK_EMU_BUILD=$work HK_EMU_BENCH=1 HK_EMU_ORDERS= HK_EMU_ENGINE=$hypic kernels/cuda/emu/run.sh $lib 2>&1`;
ok($? == 0, 'the CUDA kernels and the test build against the emulator')
    or diag($log), done_testing(), exit;

# ---- the runs: jobs of steps, HK_EMU_JOBS at a time ----------------------

# Each job is a list of steps [name, shell command], run one after another;
# a step's output (stdout and stderr) lands in $work/NAME.out, its exit
# status in $work/NAME.rc. Jobs start in list order (longest first).
sub run_jobs {
    my @queue = @_;
    my $slots = $ENV{HK_EMU_JOBS} || 2;
    my %running;
    while (@queue || %running) {
        while (@queue && keys(%running) < $slots) {
            my $sh = join '; ', map {
                "($_->[1]) >$work/$_->[0].out 2>&1; echo \$? >$work/$_->[0].rc"
            } @{ shift @queue };
            my $pid = fork() // die "fork: $!";
            if (!$pid) {
                exec('/bin/sh', '-c', $sh) or POSIX::_exit(127);
            }
            $running{$pid} = 1;
        }
        my $pid = waitpid(-1, 0);
        last if $pid < 0;
        delete $running{$pid};
    }
}

# A step's output and exit status (-1: it did not run).
sub step {
    my ($name) = @_;
    my $rc = slurp("$work/$name.rc");
    return (slurp("$work/$name.out"), $rc =~ /^(\d+)/ ? $1 : -1);
}

# A step of an emulated TAP program (threads in tid order) ...
sub tap_step {
    my ($name, $cmd) = @_;
    return [$name, "HK_EMU_ORDER=forward $cmd"];
}

# ... checked: one check that all its (more than 2) checks passed.
sub tap_all {
    my ($name, $what) = @_;
    my ($out, $rc) = step($name);
    my @lines = split /\n/, $out;
    my ($plan) = map { /^1\.\.(\d+)/ ? $1 : () } @lines;
    my $pass = grep { /^ok \d+/ } @lines;
    ok($rc == 0 && defined $plan && $plan > 2 && $pass == $plan,
       "$what (" . ($pass // 0) . '/' . ($plan // '?') . ')')
        or diag($out);
}

# The reverse order: test_cuda_kernels' groups (its RUN_TEST lines) less
# those whose kernels are elementwise (each thread reads and writes its
# own elements: no barrier, shared memory or shuffle for the order to
# matter), kernels/cuda/hk_elementwise.cu, hk_transition.cu, hk_norm.cu's
# swiglu, hk_gdn.cu's gates, cuBLAS (host code here), and the groups that
# launch nothing (ring: copies; einval: refusals). A new group runs in
# both orders until it is named here.
my @elementwise = qw(test_swiglu test_gdn_gates test_trans_compose
                     test_trans_chain test_trans_rope_shift test_matmul
                     test_split_heads test_gate_scale test_kv_store
                     test_embed test_ring test_einval);
my @groups = slurp('kernels/test/test_cuda_kernels.c')
    =~ /^\s*RUN_TEST\((test_\w+)\);/mg;
my %groups = map { $_ => 1 } @groups;
my %ew = map { $_ => 1 } @elementwise;
my @stale = grep { !$groups{$_} } @elementwise;
ok(@groups > 20 && !@stale,
   'test_cuda_kernels names the elementwise groups t/015 runs in tid order '
   . 'only') or diag("groups: @groups; not there: @stale");
# (HK_CUDA_TEST_ONLY: the groups whose names hold one of these; all of
# them if the list is off)
my $only = @stale || @groups <= 20
    ? '' : join(',', grep { !$ew{$_} } @groups);

my $numpy = python_module('numpy'); # '' when it imports
my $moe = "$work/moe-f32";
my $lg_prompt = 'The capital of Zorvia is Quellam, by the sea. Water boils '
    . 'at one hundred degrees. The capital of Zorvia is';
my $pic_prompt = join('<|pic_sep|>', 'Lead.',
                      'The capital of Zorvia is Quellam, by the sea.',
                      'Water boils at one hundred degrees.', 'Capital?');
# A logits run of the prompt, every row, into lg-NAME.st: env before the
# engine, args its model, device and kernels.
sub lg_step {
    my ($name, $env, $args) = @_;
    return ["lg-$name",
            "$env HK_EMU_ORDER=forward $work/hypic-engine logits $args --all "
            . "--prompt '$lg_prompt' --out $work/lg-$name.st"];
}
my $dense = 'models/test/qwen35-dense';
sub logits_step {
    my ($dev, $att) = @_;
    return lg_step("$dev-$att", "HYPIC_CUDA_ATT=$att",
                   "--model $dense --device $dev");
}
sub dtype_step {
    my ($dt) = @_;
    return lg_step("dtype-$dt", 'env -u HYPIC_CUDA_ATT',
                   "--model $dense --device cuda --dtype $dt");
}
# the dense model as a bf16 checkpoint: a bf16 checkpoint's own numerics
# on the device (--dtype auto: FLASH2, the MLP's hidden rows in bf16)
my $dbf = "$work/dense-bf16";
sub bf16_step {
    my ($dev, $dt) = @_;
    return lg_step("bf16-$dev-$dt", 'env -u HYPIC_CUDA_ATT',
                   "--model $dbf --device $dev --dtype $dt");
}

my @jobs = (
    # An f32 copy of the bf16 MoE model: its MoE ops at f32 tolerance
    # (test_cuda_backend.c says why the bf16 one cannot be held to it).
    # HYPIC_CUDA_TUNE=1 (backend, pool): the decode step's tuner, opt-in,
    # picks its kernel there.
    [($numpy ? () : ['moe-f32', "rm -rf $moe && python3 "
                     . "tools/convert_weights.py --to f32 "
                     . "models/test/qwen35-moe $moe >/dev/null"]),
     tap_step('backend', "HYPIC_CUDA_KVBUF=v2 HYPIC_CUDA_TUNE=1 "
              . "HK_CUDA_TEST_GRID=small "
              . "$work/test_cuda_backend \$(test \"\$(cat $work/moe-f32.rc "
              . "2>/dev/null)\" = 0 && echo $moe)")],
    [tap_step('pic', "$work/test_cuda_pic qwen35-dense")],
    [['kernels-forward', "HK_CUDA_TEST_GRID=small HK_EMU_ORDER=forward "
      . "$work/test_cuda_kernels"]],
    [['kernels-reverse', "HK_CUDA_TEST_GRID=small HK_EMU_ORDER=reverse "
      . ($only ? "HK_CUDA_TEST_ONLY=$only " : '') . "$work/test_cuda_kernels"]],
    [tap_step('pool', "HYPIC_CUDA_TUNE=1 $work/test_cuda_pool qwen35-dense")],
    [['gpu-engine', "HK_EMU_ORDER=forward HYPIC_CUDA_TUNE=1 "
      . "$work/gpu_engine --model "
      . "models/test/qwen35-dense --device cuda --tokens 16 --batch 1 "
      . "--decode 1 --pic 1x10 --seam 3 --reps 1 --lead 2 --query 2 "
      . "--piece 16 --profile 1 --tsv $work/engine.tsv"]],
    [tap_step('peer', "$work/test_cuda_peer qwen35-dense")],
    ($numpy ? () :
     [['gpu-kernels', "$work/gpu_kernels --tiny --out $work/bench.tsv "
       . "--dump $work/dump"],
      ['gpu-kernels-ref', "python3 bench/gpu_kernels_ref.py --bench "
       . "$work/bench.tsv --dump $work/dump --out $work/res"]]),
    [map { ["generate-$_", "HK_EMU_ORDER=forward $work/hypic-engine "
            . "generate --model models/test/qwen35-dense --device $_ "
            . "--mode pic --seam 3 --max-tokens 3 --prompt '$pic_prompt'"] }
     qw(cpu cuda)],
    ($numpy ? () :
     ([logits_step('cpu', 'flash'), logits_step('cuda', 'flash')],
      [logits_step('cuda', 'flash2')], [logits_step('cuda', 'flash2x')],
      [logits_step('cuda', 'flash3_seq')], [dtype_step('bf16')],
      [lg_step('dtype-bf16-flash3_seq', 'HYPIC_CUDA_ATT=flash3_seq',
               "--model $dense --device cuda --dtype bf16")],
      [dtype_step('auto')],
      [['dense-bf16', "rm -rf $dbf && python3 tools/convert_weights.py "
        . "--to bf16 models/test/qwen35-dense $dbf >/dev/null"],
       bf16_step('cpu', 'auto'), bf16_step('cuda', 'auto'),
       bf16_step('cuda', 'f32')])),
);
run_jobs(@jobs);

# ---- the checks ----------------------------------------------------------

for my $order (qw(forward reverse)) {
    my ($out, $rc) = step("kernels-$order");
    my @lines = split /\n/, $out;
    my ($plan) = map { /^1\.\.(\d+)/ ? $1 : () } @lines;
    my $pass = grep { /^ok \d+/ && !/# SKIP/ } @lines;
    my @fail = grep { /^not ok/ } @lines;
    ok($rc == 0 && defined $plan && $plan > 0 && $pass == $plan,
       "threads in $order order: " . ($pass // 0) . '/' . ($plan // '?')
       . ' CUDA twins agree with the CPU'
       . ($order eq 'reverse' && $only
          ? ' (the groups with barriers, shared memory or shuffles)' : ''))
        or diag(join "\n", @fail ? @fail : @lines[-20 .. -1]);
}

SKIP: {
    skip $numpy, 4 if $numpy;
    my ($out, $rc) = step('gpu-kernels');
    ok($rc == 0 && -s "$work/bench.tsv", 'gpu_kernels --tiny runs on the emulator')
        or diag($out);
    # the in-kernel probes' rows: each decode step kernel's span, after its
    # row (the GDN chunk's come with its tensor-core rows)
    my %span;
    if (open(my $bt, '<', "$work/bench.tsv")) {
        while (<$bt>) {
            $span{$1} = 1 if /^probe_gdn_step\w*\.(\w+)\.span\t/;
        }
    }
    my @kern = qw(KH PIPE PIPE32 PIPEA PIPEW);
    ok(!grep(!$span{$_}, @kern),
       'gpu_kernels prints the decode step kernels\' probes ('
       . join(', ', sort keys %span) . ')');
    ($out, $rc) = step('gpu-kernels-ref');
    ok($rc == 0 && -s "$work/res/kernels.tsv" && -s "$work/res/report.md",
       'gpu_kernels_ref.py writes kernels.tsv and report.md')
        or diag($out);
    # our outputs against float64: f32 kernels ~1e-7, the bf16 chunk (v2,
    # v1, the first kernel A, kernel A3, the outputs fused into the state
    # pass (ro), R on 64 columns (r64) or three buffers (deep), O on 64
    # columns (o64), R on 8 warps (w8), the launches overlapped (ov), the
    # shared-SM pass), the f32-in
    # tensor-core one and the tensor-core attention prefill (bf16 hi/lo
    # splits) ~1e-5
    # (the pass in shared memory, p, too), the chunk's fast variants (single
    # bf16 products, as FLA's bf16 path; fasta: kernel A's too;
    # f32mmaround and f32mmabf16in(a3ro, r64, deep, w8, ov): f32 in rounded
    # once)
    # ~3e-3
    # here, the
    # attention's bf16-operand variants (wmma, FLASH2, FLASH3 on wgmma and
    # FLASH3_SEQ, FLASH3_WS) ~1e-3 (FLASH2X, FLASH2's on hi/lo splits: ~1e-5), conv states are
    # copies; the fused step once per kernel
    # (default, kh, pipe, pipe32, pipea, pipew)
    my %limit = (ours_bf16 => 1e-4, ours_bf16v1 => 1e-4, ours_f32mma => 1e-4,
                 ours_f32mmav1 => 1e-4, ours_bf16a1 => 1e-4,
                 ours_f32mmaa1 => 1e-4, ours_bf16a3 => 1e-4,
                 ours_f32mmaa3 => 1e-4, ours_bf16ro => 1e-4,
                 ours_bf16a3ro => 1e-4, ours_f32mmaro => 1e-4,
                 ours_f32mmabf16ina3ro => 1e-2, ours_bf16ps => 1e-4,
                 ours_bf16r64 => 1e-4, ours_f32mmabf16inr64 => 1e-2,
                 ours_bf16deep => 1e-4, ours_f32mmabf16indeep => 1e-2,
                 ours_bf16o64 => 1e-4, ours_bf16w8 => 1e-4,
                 ours_f32mmabf16inw8 => 1e-2, ours_bf16ov => 1e-4,
                 ours_f32mmabf16inov => 1e-2,
                 ours_f32mmaps => 1e-4, ours_bf16p => 1e-4,
                 ours_f32mmap => 1e-4, ours_bf16fast => 1e-2,
                 ours_f32mmafast => 1e-2, ours_bf16fasta => 1e-2,
                 ours_bf16fastap => 1e-2,
                 ours_f32mmaround => 1e-2, ours_f32mmabf16in => 1e-2, ours_att_bf16 => 2e-2,
                 ours_att_flash2 => 2e-2, ours_att_flash2x => 2e-5,
                 ours_att_flash3 => 2e-2, ours_att_flash3seq => 2e-2,
                 ours_att_flash3ws => 2e-2,
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
    ok($n == 130 && !@bad, "$n of our outputs within their float64 bounds")
        or diag(join "\n", @bad);
}

# the small grid: one int8 model (qwen35-dense-int8, the I8 projections
# against the CPU's), without its batched and KVBuffer checks. The
# KVBuffer's v2 kernels by name: a step, a flush or a verification they
# could not take would be an error, not a quiet fall back to v1.
tap_all('backend', 'the CUDA backend on whole models agrees with the CPU backend');

# The caches on the emulated device (test_cuda_pic: capture, warm and cold
# splice, naive, prefix resume against the CPU backend) on one model here;
# `make test-cuda-emu` and a GPU run all of them.
tap_all('pic', 'PIC, naive and prefix resume on the CUDA backend agree with the CPU');

# Serving allocates device memory at start only (test_cuda_pool: the
# sequence pool with the segment builders' sequences, the workspaces and
# the backend's scratch), in full, pic (cold, warm), naive and prefix
# modes and with two prefill workers; a request over the pool's room
# waits, one over its size or a segment over max_segment is refused. On
# the dense model here; a GPU run adds its int8 twin (the I8 tile).
tap_all('pool',
        'serving on the CUDA backend allocates no device memory after its '
        . 'start');

# Peers between device nodes (test_cuda_peer: entries served from and
# fetched into device pools, device <-> CPU byte for byte, a remote PREFILL
# on the device node's one builder, no device allocation after start).
tap_all('peer', 'the peer transport moves entries in and out of device pools');

# hypic-engine on the emulated device: pic mode (each document captured,
# then spliced warm) gives the CPU's greedy text.
{
    my %text;
    for my $dev (qw(cpu cuda)) {
        ($text{$dev}, $text{"$dev rc"}) = step("generate-$dev");
    }
    ok($text{'cpu rc'} == 0 && $text{'cuda rc'} == 0
       && $text{cuda} eq $text{cpu},
       'generate --mode pic --device cuda gives the CPU\'s text')
        or diag("cpu: $text{cpu}\ncuda: $text{cuda}");
}

# The engine's prefill on FLASH2 (HYPIC_CUDA_ATT=flash2: bf16 operands,
# scratch from the forward plan), FLASH2X (flash2x: its hi/lo split
# operands, twice the scratch) and FLASH3_SEQ (flash3_seq, a bf16
# checkpoint's default on Hopper: wgmma, bf16 operands, its tiles' scratch)
# against the default FLASH and the CPU: every
# position's logits, a bf16 kernel's error for FLASH2 and FLASH3_SEQ (FLASH
# ~3e-5, FLASH2 ~6e-4 here), FLASH's bound for FLASH2X, the same greedy
# token everywhere.
SKIP: {
    skip $numpy, 4 if $numpy;
    my $rc = 0;
    for my $run (['cpu', 'flash'], ['cuda', 'flash'], ['cuda', 'flash2'],
                 ['cuda', 'flash2x'], ['cuda', 'flash3_seq']) {
        my ($dev, $att) = @$run;
        $rc ||= (step("lg-$dev-$att"))[1];
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
if sys.argv[1] == 'bf16':
    c, a, f = (load(sys.argv[2] + x + '.st')
               for x in ('cpu-auto', 'cuda-auto', 'cuda-f32'))
    e = lambda g: float(np.abs(g - c).max() / np.abs(c).max())
    print(f'{e(a):.2e} {e(f):.2e} '
          f'{float((a.argmax(-1) == c.argmax(-1)).mean()):.3f} '
          f'{int(bool((a != f).any()))}')
    sys.exit(0)
c, f, f2, f2x, f3 = (load(sys.argv[1] + x) for x in
                     ('cpu-flash.st', 'cuda-flash.st', 'cuda-flash2.st',
                      'cuda-flash2x.st', 'cuda-flash3_seq.st'))
e = lambda g: float(np.abs(g - c).max() / np.abs(c).max())
same = all((g.argmax(-1) == c.argmax(-1)).all() for g in (f, f2, f2x, f3))
# FLASH2X's and FLASH3_SEQ's own logits, not their fallbacks' (FLASH's, FLASH2's
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
    # --dtype picks them without HYPIC_CUDA_ATT: bf16 is FLASH3_SEQ on
    # Hopper (the emulator's compute capability 9.0), auto on
    # this f32 checkpoint FLASH2X (the CLI through the model's precision to
    # the backend's kernel), bit for bit; bf16 precision also rounds the GDN
    # chunk's q, k, v, so not FLASH3_SEQ's f32-precision logits
    my $rcd = 0;
    for my $dt (qw(bf16 bf16-flash3_seq auto)) {
        $rcd ||= (step("lg-dtype-$dt"))[1];
    }
    ok($rc == 0 && $rcd == 0
       && system("cmp -s $work/lg-dtype-bf16.st $work/lg-dtype-bf16-flash3_seq.st") == 0
       && system("cmp -s $work/lg-dtype-bf16.st $work/lg-cuda-flash3_seq.st") != 0
       && system("cmp -s $work/lg-dtype-auto.st $work/lg-cuda-flash2x.st") == 0,
       'logits --dtype bf16: FLASH3_SEQ\'s logits bit for bit, not at f32 '
       . 'precision (the GDN chunk takes q, k, v rounded); --dtype auto on an '
       . 'f32 checkpoint: FLASH2X\'s');
    ok($rc == 0 && $same && $ran3 && $ef3 > $ef && $ef3 <= 5e-3,
       "logits --device cuda with FLASH3_SEQ prefill: within 5e-3 of the CPU's "
       . '(' . ($ef3 // '?') . '; FLASH2 ' . ($ef2 // '?') . '), greedy tokens '
       . 'the same')
        or diag("rc $rc, same " . ($same // '?') . ', ran ' . ($ran3 // '?'));
    # the bf16 checkpoint: --dtype auto on the device (bf16 attention and
    # MLP rows, as transformers runs it) within 5e-2 of the CPU's f32
    # compute, greedy tokens agreeing in 90 % of rows (test_cuda_backend's
    # bound for bf16 models; emulator: 3.0e-2, 95 %, both about what
    # --dtype f32 gives: x rounded for the bf16 GEMMs either way), and not
    # --dtype f32's logits (its own kernels ran)
    my $rcb = (step('dense-bf16'))[1];
    $rcb ||= (step("lg-bf16-$_"))[1] for qw(cpu-auto cuda-auto cuda-f32);
    my ($eb, $ef32, $agree, $own) = split ' ', `python3 $work/lg-cmp.py bf16 $work/lg-bf16- 2>&1`;
    ok($rcb == 0 && defined $own && $eb <= 5e-2 && $agree >= 0.9 && $own,
       "logits of a bf16 checkpoint, --dtype auto on cuda: within 5e-2 of "
       . 'the CPU\'s (' . ($eb // '?') . '; --dtype f32 ' . ($ef32 // '?')
       . '), greedy tokens agree in ' . (defined $agree ? 100 * $agree : '?')
       . ' % of rows') or diag("rc $rcb, " . ($eb // ''));
}

# bench/gpu_engine's PIC rows on the emulated device (toy shapes): every
# one a figure, none "unsupported"; and the op profiles (--profile) of a
# prefill and of a warm splice: their kinds of op, with their calls, sum to
# the whole.
{
    my ($out, $rc) = step('gpu-engine');
    my %v;
    if (open my $fh, '<', "$work/engine.tsv") {
        for (<$fh>) { my @f = split /\t/; $v{$f[0]} = $f[2]; }
    }
    my @want = qw(ttft_full ttft_pic_cold ttft_pic_warm pic_compose_per_seg
                  pic_rerotate_per_seg pic_seam_per_seg);
    my @bad = grep { ($v{$_} // '') !~ /^[0-9.e+-]+$/ || $v{$_} <= 0 } @want;
    ok($rc == 0 && !@bad, 'gpu_engine --device cuda: every PIC row measured')
        or diag("bad: @bad\n$out");
    # a profile's rows: the "#   op ms % calls" lines under its head
    my $rows = sub {
        my ($head) = @_;
        my ($ops, $block) = $out =~ /^# profile \Q$head\E: [0-9.]+ ms of device time in (\d+) ops[^\n]*\n((?:#   [^\n]*\n)*)/m;
        my (%calls, $pct, $sum);
        while (($block // '') =~ /^#   (\S.*?)\s+([0-9.]+) ms\s+([0-9.]+) %\s+(\d+) calls$/mg) {
            $calls{$1} = $4;
            $pct += $3;
            $sum += $4;
        }
        return ($ops, \%calls, defined $ops && ($sum // 0) == $ops
                && abs(($pct // 0) - 100) < 1);
    };
    my ($ops, $calls, $whole) = $rows->('prefill T=16');
    ok($whole && $calls->{linear} && $calls->{attention}
       && $calls->{'gdn_chunk (tensor cores)'},
       "gpu_engine --profile 1: a prefill's device time by op ("
       . ($ops // '?') . ' ops, ' . scalar(keys %$calls) . ' kinds)')
        or diag($out);
    # and the warm splice's: its compositions and re-rotations among them
    my ($wops, $wcalls, $wwhole) = $rows->('ttft_pic_warm 1x10');
    ok($wwhole && $wcalls->{trans_compose} && $wcalls->{rope_shift}
       && $wcalls->{attention},
       "gpu_engine --profile 1: the warm PIC splice's device time by op ("
       . ($wops // '?') . ' ops, ' . scalar(keys %$wcalls) . ' kinds)')
        or diag($out);
    # and a decode step's, with the step's wall time split into the
    # host's and its waits for the device
    my ($dops, $dcalls, $dwhole) = $rows->('decode B=1');
    ok($dwhole && $dcalls->{'gdn_step (fused)'} && $dcalls->{attention_decode}
       && $dcalls->{argmax}
       && $out =~ /^#   per step: [0-9.]+ ops, [0-9.]+ transfers \([0-9.]+ copied\), [0-9.]+ waits; ([0-9.]+) ms: host ([0-9.]+), waiting ([0-9.]+)$/m
       && abs($1 - $2 - $3) < 0.01,
       "gpu_engine --profile 1: a decode step's device time by op ("
       . ($dops // '?') . ' ops) and its host / waiting split')
        or diag($out);
    # the staging memo: a steady step copies only the arrays that change
    # (ids, positions, lengths, the argmax down), not each layer's lists
    ok($out =~ /^#   per step: [0-9.]+ ops, ([0-9.]+) transfers \(([0-9.]+) copied\)/m
       && $2 > 0 && $2 * 2 < $1,
       "gpu_engine: a decode step copies under half its transfers ("
       . ($2 // '?') . ' of ' . ($1 // '?') . ')') or diag($out);
    # HYPIC_CUDA_TUNE=1: the tuners' classes, the GDN chunk's among them
    # (the toy heads run the default pass alone: kernel 0, untimed)
    ok($out =~ /^# tuned gdn_chunk T<=\d+ Hk=\d+ Hv=\d+ dk=\d+ dv=\d+ x=\d+: (?:default|r64|deep) \(default (?:-|[0-9.]+), r64 /m,
       'gpu_engine, HYPIC_CUDA_TUNE=1: the GDN chunk tuner\'s classes '
       . 'reported') or diag($out);
}

done_testing();
