# --device (engine/backend): where hypic-engine runs the model. cpu is
# the default and gives the same text; a name that is not a device is a
# usage error (exit 2) naming the choices; cuda without a device, or in a
# build without CUDA, is a clear error (exit 1), never a crash; where a
# device exists, cuda gives the CPU's greedy text. The same for serve's
# flag and its config-file key. --dtype (auto, f32, bf16: what a device may
# round to bf16) is checked the same way; on the CPU it changes nothing.

use strict;
use warnings;
use lib 't/lib';

use Test::More;
use Hypic::Util qw(build_dir private_dir);

my $engine = build_dir() . '/hypic-engine';
my $model = 'models/test/qwen35-dense';
plan skip_all => "no $engine (make first)" unless -x $engine;

# exit status, signal, stdout, stderr of hypic-engine @args
sub run_engine {
    my (@args) = @_;
    my $dir = private_dir('device');
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        open STDOUT, '>', "$dir/out" or die;
        open STDERR, '>', "$dir/err" or die;
        exec $engine, @args or exit 127;
    }
    waitpid $pid, 0;
    my ($st, $sig) = ($? >> 8, $? & 127);
    my ($out, $err) = map {
        local $/;
        open my $f, '<', "$dir/$_" or die;
        scalar <$f>
    } qw(out err);
    chomp $err;
    return ($st, $sig, $out, $err);
}

my @gen = ('generate', '--model', $model, '--prompt', 'the cat sat on',
           '--max-tokens', 8);
my ($st, $sig, $want) = run_engine(@gen);
is($st, 0, 'generate on the default device');
my ($st2, $sig2, $cpu) = run_engine(@gen, '--device', 'cpu');
ok($st2 == 0 && $cpu eq $want, '--device cpu: the same text');

($st, $sig, undef, my $err) = run_engine(@gen, '--device', 'gpu');
ok($st == 2 && !$sig && $err =~ /device "gpu": expected cpu, cuda or cuda:N/,
   "a name that is not a device: usage error ($err)");
($st, $sig, undef, $err) = run_engine('logits', '--model', $model,
                                      '--prompt', 'hi', '--out', '/dev/null',
                                      '--device', 'cuda:x');
ok($st == 2 && !$sig && $err =~ /N in cuda:N is a device number/,
   "cuda:x: usage error ($err)");

($st, $sig, my $out, $err) = run_engine(@gen, '--device', 'cuda');
ok(!$sig, 'cuda: no crash');
if ($st == 0) {
    is($out, $want, 'cuda: the CPU\'s greedy text');
} else {
    ok($st == 1 && $err =~ /device cuda:0: (no CUDA device|this program was built without CUDA)/,
       "cuda without a device: a clear error ($err)");
}

for my $dt (qw(auto f32 bf16)) {
    my ($s, $g, $o) = run_engine(@gen, '--dtype', $dt);
    ok($s == 0 && !$g && $o eq $want, "--dtype $dt on the CPU: the same text");
}
{
    my ($s, $g, undef, $e) = run_engine(@gen, '--dtype', 'fp16');
    ok($s == 2 && !$g && $e =~ /--dtype is auto, f32 or bf16, not 'fp16'/,
       "--dtype fp16: usage error ($e)");
    my $dir = private_dir('dtype-serve');
    open my $f, '>', "$dir/conf" or die;
    print $f "model $model\nsocket $dir/s\ndtype half\n";
    close $f;
    ($s, $g, undef, $e) = run_engine('serve', '--config', "$dir/conf");
    ok($s == 2 && !$g && $e =~ /conf:3: dtype is auto, f32 or bf16, not 'half'/,
       "serve: the config key dtype is checked ($e)");
}

SKIP: {
    skip 'a CUDA device is present', 2 if $st == 0;
    my $dir = private_dir('device-serve');
    ($st, $sig, undef, $err) =
        run_engine('serve', '--model', $model, '--socket', "$dir/s",
                   '--device', 'cuda:0');
    ok($st == 1 && !$sig && $err =~ /device cuda:0: /,
       "serve --device cuda:0 without a device: refused ($err)");
    open my $f, '>', "$dir/conf" or die;
    print $f "model $model\nsocket $dir/s\ndevice tpu\n";
    close $f;
    ($st, $sig, undef, $err) = run_engine('serve', '--config', "$dir/conf");
    ok($st == 2 && !$sig && $err =~ /device "tpu"/,
       "serve: the config key device is checked ($err)");
}

done_testing();
