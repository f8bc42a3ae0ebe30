# The four prefill modes through real nginx and a real engine (models/test/
# qwen35-dense): pic and naive reuse cached segments on a second request
# (hit counts in X-Hypic-Segments, usage.prompt_tokens_details.
# cached_tokens), pic's greedy text equals the CLI's warm `--mode pic`
# (the one-shot reference), prefix mode resumes exactly (its text is
# full's), and a warm-up request `SEP doc SEP` with max_tokens 0 caches a
# document for later requests.

use strict;
use warnings;
use lib 't/lib';

use Hypic::Nginx;
use Hypic::Engine;

Hypic::Engine::Client->import(qw(json_body text_of cached_of));

our $MODEL = Hypic::Engine->test_model;
our $engine = Hypic::Engine->start_suite(
    args => ['--node', 'm-node', '--slots', 8, '--batch', 2,
             '--public-pool', '64m', '--private-pool', '64m']);

our $SEP = '<|pic_sep|>';
our @DOCS = (
    'The capital of Zorvia is Quellam. Zorvia exports copper and tea; '
    . 'its population is 4812, most of it in the hills.',
    'Water boils at one hundred degrees at sea level, and earlier at '
    . 'altitude, because the air pressure there is lower.',
);
our $PROMPT = join($SEP, 'You answer from the documents.', @DOCS,
                   'What is the capital of Zorvia?');

sub body { json_body(@_) }

run_tests();

__DATA__

=== TEST 1: pic: the second request hits every cached segment and says so
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode pic; hypic_seam 8; }
--- request eval
my $b = main::body(prompt => $main::PROMPT, max_tokens => 8,
                   temperature => 0);
["POST /v1/completions\n$b", "POST /v1/completions\n$b"]
--- error_code: 200
--- response_headers eval
[{ 'X-Hypic-Mode' => 'pic', 'X-Hypic-Segments' => '0/4' },
 { 'X-Hypic-Mode' => 'pic', 'X-Hypic-Segments' => '3/4' }]
--- response_check
my ($r) = @_;
is(main::cached_of($r->[0]), 0, 'first request: nothing cached yet');
ok(main::cached_of($r->[1]) > 0,
   'second request: cached tokens reported (' . main::cached_of($r->[1])
   . ')');
is(main::text_of($r->[1]), main::text_of($r->[0]),
   'warm and cold pic give the same greedy text');
my $cli = Hypic::Engine->generate(model => $main::MODEL,
                                  prompt => $main::PROMPT, max_tokens => 8,
                                  args => ['--mode', 'pic']);
is(main::text_of($r->[1]), $cli, 'equals the CLI in pic mode');
--- no_error_log
[error]



=== TEST 2: naive reuses segments too, and reports its own mode
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode naive; }
--- request eval
my $b = main::body(prompt => $main::PROMPT, max_tokens => 4,
                   temperature => 0);
["POST /v1/completions\n$b", "POST /v1/completions\n$b"]
--- error_code: 200
--- response_headers eval
[{ 'X-Hypic-Mode' => 'naive' },
 { 'X-Hypic-Mode' => 'naive', 'X-Hypic-Segments' => '3/4' }]
--- response_check
my ($r) = @_;
my $cli = Hypic::Engine->generate(model => $main::MODEL,
                                  prompt => $main::PROMPT, max_tokens => 4,
                                  args => ['--mode', 'naive']);
is(main::text_of($r->[1]), $cli, 'equals the CLI in naive mode');
--- no_error_log
[error]



=== TEST 3: prefix resumes exactly: a longer second prompt gives full's text
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode prefix; }
--- request eval
my $b1 = main::body(prompt => $main::PROMPT, max_tokens => 6,
                    temperature => 0);
my $b2 = main::body(prompt => "$main::PROMPT$main::SEP And of Zorvia's "
                              . "population?", max_tokens => 6,
                    temperature => 0);
["POST /v1/completions\n$b1", "POST /v1/completions\n$b2"]
--- error_code: 200
--- response_headers eval
[{ 'X-Hypic-Mode' => 'prefix' }, { 'X-Hypic-Mode' => 'prefix' }]
--- response_check
my ($r) = @_;
ok(main::cached_of($r->[1]) > 0,
   'the second prompt resumed (' . main::cached_of($r->[1]) . ' cached)');
my $cli = Hypic::Engine->generate(
    model => $main::MODEL, max_tokens => 6,
    prompt => "$main::PROMPT$main::SEP And of Zorvia's population?");
is(main::text_of($r->[1]), $cli, 'equals full recompute (the CLI)');
--- no_error_log
[error]



=== TEST 4: a warm-up request caches a document for the next request
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass tiny; hypic_mode pic; }
--- request eval
my $w = main::body(prompt => "$main::SEP$main::DOCS[1]$main::SEP",
                   max_tokens => 0);
my $q = main::body(prompt => CORE::join($main::SEP, 'Another lead.',
                                  $main::DOCS[1], 'When does water boil?'),
                   max_tokens => 3, temperature => 0);
["POST /v1/completions\n$w", "POST /v1/completions\n$q"]
--- error_code: 200
--- response_headers eval
[{ 'X-Hypic-Mode' => 'pic' }, { 'X-Hypic-Segments' => '1/3' }]
--- response_body_json eval
[{ choices => [{ text => "" }], usage => { completion_tokens => 0 } },
 undef]
--- no_error_log
[error]
