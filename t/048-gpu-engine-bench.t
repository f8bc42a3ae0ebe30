# bench/gpu_engine (the whole engine on a device: prefill, batched decode,
# PIC TTFT) and bench/gpu_engine_ref.py (transformers on the same
# checkpoint, the merged report), as tools/device-check.sh runs them, on
# the CPU with toy shapes: every figure is a row of the TSV the reference
# reads, a spent budget skips rows instead of running them, a device that
# is not there is a clear error, and the merge writes engine.tsv and
# engine.md with the issue's targets judged from the figures. Then, where
# torch and transformers import, the reference itself on the CPU.

use strict;
use warnings;
use lib 't/lib';

use Test::More;
use Hypic::Util qw(build_dir private_dir slurp wait_until);

my $bench = build_dir() . '/bench/gpu_engine';
my $engine = build_dir() . '/hypic-engine';
plan skip_all => "no $bench (make bench; built with the CUDA library)"
    unless -x $bench;

my $dir = private_dir('gpu-engine');
my $py = $ENV{HYPIC_PYTHON} // 'python3';
my $model = 'models/test/qwen35-dense';
my @shape = ('--tokens', '64', '--batch', '1,3', '--kvbuf-batch', '1,3',
             '--decode', '2', '--pic', '2x40', '--reps', '1', '--lead', '8',
             '--query', '4');

sub tsv {
    my ($path) = @_;
    open my $fh, '<', $path or return;
    my @rows = map { chomp; [split /\t/, $_, -1] } <$fh>;
    return @rows;
}

my $out = `$bench --model $model --device cpu @shape --tsv $dir/ours.tsv --name tiny 2>&1`;
is($?, 0, 'gpu_engine runs on the CPU') or diag($out);
my ($head, @rows) = tsv("$dir/ours.tsv");
is(join(' ', @$head), 'measure shape ours anchor anchor_value unit',
   'the TSV has the columns the reference reads');
my %v = map { ("$_->[0] $_->[1]" => $_->[2]) } @rows;
my @want = ('prefill tiny/T=64', 'decode tiny/B=1', 'decode tiny/B=3',
            'decode_kvbuf tiny/B=1', 'decode_kvbuf tiny/B=3',
            map { "$_ tiny/2x40" } qw(ttft_full ttft_pic_cold ttft_pic_warm
            pic_compose_per_seg pic_rerotate_per_seg pic_seam_per_seg));
my @bad = grep { !defined $v{$_} || $v{$_} !~ /^[0-9.e+-]+$/ || $v{$_} <= 0 }
    @want;
ok(!@bad && @rows == @want + 1, 'a positive figure for every measurement')
    or diag("bad: @bad\n$out");
is($v{'pic_prompt_tokens tiny/2x40'}, 8 + 2 * 40 + 4,
   'the PIC prompt holds lead + k x n + query tokens');
ok(!grep({ $_->[3] ne '-' || $_->[4] ne '-' } @rows),
   'anchor columns are left to the reference');

$out = `$bench --model $model --device cpu @shape --tsv $dir/skip.tsv --budget 1e-9 2>&1`;
my (undef, @skip) = tsv("$dir/skip.tsv");
ok($? == 0 && @skip >= @want && !grep({ $_->[0] ne 'pic_prompt_tokens'
    && $_->[2] ne 'skipped (budget)' } @skip),
   'past the budget every measurement is skipped, and said so')
    or diag($out);
like($out, qr/measurement\(s\) skipped/, 'the skipped count is printed');

{
    # a run a timeout stops mid-measurement (SIGTERM): what it printed is
    # in its log (stdout line-buffered; progress on stderr names the
    # measurement it was in)
    my $pid = fork // die;
    if (!$pid) {
        open STDOUT, '>', "$dir/cut.out" or die;
        open STDERR, '>', "$dir/cut.err" or die;
        exec $bench, '--model', $model, '--device', 'cpu', '--tokens', '1024',
            '--batch', '', '--pic', '', '--reps', '15', '--piece', '16',
            '--name', 'cut';
        exit 127;
    }
    my $started = wait_until(cond => sub {
        (slurp("$dir/cut.err") // '') =~ /prefill T=1024: measuring/ },
        timeout => 60);
    kill 'TERM', $pid;
    waitpid $pid, 0;
    my $log = slurp("$dir/cut.out") // '';
    ok($started && $log =~ /^# \S+ on cpu: .* loaded in /m
       && $log =~ /^# warm-up [0-9.]+ s$/m,
       'stopped mid-measurement: its log has the header and the warm-up')
        or diag("stdout:\n$log\nstderr:\n" . (slurp("$dir/cut.err") // ''));
}

$out = `$bench --model $model --device cuda:7 @shape 2>&1`;
ok($? >> 8 == 1 && $out =~ /cuda:7: |without CUDA/,
   'a device that is not there: a clear error') or diag($out);

{
    # the anchor at half our prefill and decode rate, full prefill 10x warm
    open my $fh, '>', "$dir/hf.tsv" or die;
    print $fh "measure\tshape\tvalue\tunit\tanchor\n";
    printf $fh "prefill\ttiny/T=64\t%g\ttok/s\tA\n", $v{'prefill tiny/T=64'} / 2;
    printf $fh "decode\ttiny/B=3\t%g\ttok/s\tA\n", $v{'decode tiny/B=3'} * 2;
    printf $fh "ttft_full\ttiny/2x40\t%g\tms\tA\n", 7;
    printf $fh "logits_max_rel_err_vs_f32\ttiny/9 tokens\t1e-06\trel\tA32\n";
    close $fh;
    $out = `python3 bench/gpu_engine_ref.py --ours $dir/ours.tsv --anchors $dir/hf.tsv --out $dir/res 2>&1`;
    my ($h, @m) = tsv("$dir/res/engine.tsv");
    my %r = map { ("$_->[0] $_->[1]" => $_) } @m;
    ok($? == 0 && join(' ', @$h) eq 'measure shape ours anchor anchor_value unit'
       && $r{'prefill tiny/T=64'}[3] eq 'A'
       && $r{'ttft_pic_warm tiny/2x40'}[4] == 7
       && $r{'decode_kvbuf tiny/B=3'}[3] eq 'A'
       && $r{'logits_max_rel_err_vs_f32 tiny/9 tokens'}[2] == 1e-6,
       'engine.tsv: our rows beside their anchors, PIC against full, '
       . 'the KVBuffer decode against the decode, parity')
        or diag($out);
    my $md = slurp("$dir/res/engine.md") // '';
    like($md, qr/tiny prefill T=64 >= transformers\+FLA \| met \| 2\.00x/,
         'engine.md: prefill at twice the anchor meets its target');
    like($md, qr/\| 0\.50x \|/, 'engine.md: decode at half the anchor, 0.50x');

    # another HYPIC_CUDA_GDN mode's rows (device-check's DC_GDN_MODES,
    # shapes TAG@MODE/...) against the same anchors, a target of their own
    system("cp $dir/ours.tsv $dir/ours2.tsv");
    open $fh, '>>', "$dir/ours2.tsv" or die;
    printf $fh "prefill\ttiny\@tc_bf16/T=64\t%g\t-\t-\ttok/s\n",
        $v{'prefill tiny/T=64'} / 4;
    close $fh;
    $out = `python3 bench/gpu_engine_ref.py --ours $dir/ours2.tsv --anchors $dir/hf.tsv --out $dir/res3 2>&1`;
    ($h, @m) = tsv("$dir/res3/engine.tsv");
    %r = map { ("$_->[0] $_->[1]" => $_) } @m;
    ok($? == 0 && $r{'prefill tiny@tc_bf16/T=64'}[3] eq 'A'
       && $r{'prefill tiny/T=64'}[3] eq 'A',
       'engine.tsv: a GDN mode\'s rows (TAG@MODE) beside the same anchors')
        or diag($out);
    like(slurp("$dir/res3/engine.md") // '',
         qr/tiny\@tc_bf16 prefill T=64 >= transformers\+FLA \| not met \| 0\.50x/,
         'engine.md: the mode\'s prefill target, at half the anchor');
}

SKIP: {
    # never installed here (gigabytes): HYPIC_PYTHON may name one that has it
    skip "no torch and transformers in $py", 1
        if system("$py -c 'import torch, transformers' >/dev/null 2>&1");
    my $text = 'The cat sat on the mat.';
    system($engine, 'logits', '--model', $model, '--prompt', $text, '--all',
           '--out', "$dir/lg.safetensors") == 0 or die;
    $out = `$py bench/gpu_engine_ref.py --model $model --name tiny --device cpu --tokens 64 --batch 1,3 --decode 2 --reps 1 --ours $dir/ours.tsv --anchors $dir/hf2.tsv --logits $dir/lg.safetensors --text '$text' --out $dir/res2 2>&1`;
    my (undef, @m) = tsv("$dir/res2/engine.tsv");
    my %r = map { ("$_->[0] $_->[1]" => $_) } @m;
    my ($e) = map { $r{$_} } grep { /^logits_max_rel_err_vs_f32 tiny\// }
        keys %r;
    ok($? == 0 && $r{'prefill tiny/T=64'}[4] > 0 && $e && $e->[2] < 1e-4,
       'transformers on the CPU: anchors, and our logits within 1e-4 of its f32')
        or diag($out);
}

done_testing();
