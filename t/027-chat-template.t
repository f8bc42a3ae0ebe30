#!/usr/bin/env perl
# 027-chat-template.t - the engine renders chat templates byte for byte as
# transformers' apply_chat_template does: every case of t/chat/golden.json
# (made by tools/make_chat_golden.py with transformers) through
# `hypic-engine chat`, on the test models' own templates and on the real
# Qwen3.5 template (t/chat/qwen3.5.jinja) with and without tools,
# multi-turn with tool results, thinking on and off; a case the template
# refuses exits 1 with the template's message. Where transformers imports
# (HYPIC_PYTHON), the golden file is checked against it too.
use strict;
use warnings;
use lib 't/lib';

use File::Copy qw(copy);
use JSON::PP ();
use Test::More;
use Hypic::Util qw(build_dir private_dir slurp);

my $root = File::Spec->rel2abs('.');
my $bin = build_dir() . '/hypic-engine';
plan(skip_all => "no $bin") unless -x $bin;

my $golden = JSON::PP->new->utf8->decode(slurp("$root/t/chat/golden.json"));
my $dir = private_dir('chat');

# the real Qwen3.5 template as a checkpoint's chat_template.jinja
mkdir "$dir/qwen3.5" or die $!;
copy("$root/models/test/qwen35-dense/$_", "$dir/qwen3.5/$_") or die $!
    for qw(tokenizer.json tokenizer_config.json);
copy("$root/t/chat/qwen3.5.jinja", "$dir/qwen3.5/chat_template.jinja")
    or die $!;

my $i = 0;
for my $case (@{ $golden->{cases} }) {
    my $model = $case->{model} eq 'qwen3.5' ? "$dir/qwen3.5"
                                            : "$root/$case->{model}";
    my $req = "$dir/req$i.json";
    open my $fh, '>', $req or die $!;
    my $body = $case->{body};
    utf8::encode($body);
    print $fh $body;
    close $fh;
    my $out = `'$bin' chat --model '$model' --prompt-file '$req' 2>$dir/err$i`;
    my $rc = $? >> 8;
    my $name = "case $i ($case->{model})";
    if (defined $case->{prompt}) {
        my $want = $case->{prompt};
        utf8::encode($want);
        is($rc, 0, "$name renders") or diag(slurp("$dir/err$i"));
        ok($out eq $want, "$name: the prompt transformers makes")
            or diag("got:  " . JSON::PP->new->encode([$out])
                    . "\nwant: " . JSON::PP->new->encode([$want]));
    } else {
        is($rc, 1, "$name is refused");
        my $err = slurp("$dir/err$i");
        my $want = $case->{error};
        utf8::encode($want);
        like($err, qr/chat template: \Q$want\E/,
             "$name: with the template's message");
    }
    $i++;
}
cmp_ok($i, '>=', 15, 'every case ran');

# transformers itself, where it is installed: the golden file is current
my $py = $ENV{HYPIC_PYTHON} // 'python3';
SKIP: {
    skip "transformers does not import in $py", 1
        if system("$py -c 'import transformers' >/dev/null 2>&1") != 0;
    my $out = `$py $root/tools/make_chat_golden.py --check 2>&1`;
    is($?, 0, 'transformers renders what golden.json says') or diag($out);
}

done_testing();
