# The demo page (conf/demo/) in a real browser: headless Chromium driven
# by Selenium loads it from nginx with a real engine
# (models/test/qwen35-dense), fills in two documents and a question, runs
# every mode, waits for the answers to stream in and takes a screenshot.
# Each panel must show its mode, a time to first token, the segments from
# the cache and an answer; the "full" answer must equal the API's own
# (the page parses the stream right); the screenshot must be a real PNG.
# Chromium (Debian's chromium + chromium-driver) and Selenium (pip) are
# installed when missing; the suite is skipped when they cannot be.

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Util qw(private_dir slurp python_module);

our $MODEL = "$Hypic::Nginx::REPO/models/test/qwen35-dense";
our $PYTHON = $ENV{HYPIC_PYTHON} // 'python3';
our $CHROMIUM = '/usr/bin/chromium';
our $DRIVER = '/usr/bin/chromedriver';

my $why = Hypic::Engine->why_not || (-d $MODEL ? '' : "no $MODEL")
          || browser();
plan(skip_all => $why) if $why;

our $engine = Hypic::Engine->start(
    args => ['--model', $MODEL, '--node', 't-node', '--slots', 4]);

add_vars(ENGINE => 'hypic_engine tiny unix:' . $engine->socket
                   . ' model=tiny-1;');

sub quiet { system("@_ >/dev/null 2>&1") == 0 }

# '' when Chromium, its driver and Selenium are there (installing what is
# missing); else why not
sub browser {
    if (!-x $CHROMIUM || !-x $DRIVER) {
        return 'no chromium and not root to install it' if $> != 0;
        quiet('DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install '
              . '-y -q chromium chromium-driver')
            or quiet('timeout 300 apt-get update -q')
               && quiet('DEBIAN_FRONTEND=noninteractive timeout 600 '
                        . 'apt-get install -y -q chromium chromium-driver');
        return 'chromium and chromium-driver could not be installed'
            if !-x $CHROMIUM || !-x $DRIVER;
    }
    return python_module('selenium', $PYTHON);
}

our @DOCS = (
    'Mount Keld is the highest peak of the Ostra range, 2,341 metres '
    . 'above the sea. Its north face was first climbed in 1911 by two '
    . 'shepherds from the village of Brenn, who carried a lantern.',
    'The village of Brenn holds a cheese market every Thursday. Its '
    . 'smoked goat cheese, aged in caves under Mount Keld, is sold as far '
    . 'as the coast, where it is eaten with black bread and pears.',
);
our $QUESTION = 'Who first climbed the north face of Mount Keld?';
our $SYSTEM = 'Answer from the documents, in one sentence.';

our $DRIVE = <<'PY';
import json, os, sys
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

url, shot, chromium, driver_path, spec = sys.argv[1:6]
spec = json.load(open(spec))
opts = webdriver.ChromeOptions()
opts.binary_location = chromium
for a in ("--headless=new", "--no-sandbox", "--disable-gpu",
          "--disable-dev-shm-usage", "--window-size=1400,1100"):
    opts.add_argument(a)
d = webdriver.Chrome(service=Service(driver_path), options=opts)
try:
    d.set_page_load_timeout(30)
    d.get(url)
    system = d.find_element(By.ID, "system")
    system.clear()
    system.send_keys(spec["system"])
    docs = d.find_elements(By.CSS_SELECTOR, "textarea.doc")
    for area, text in zip(docs, spec["docs"]):
        area.send_keys(text)
    d.find_element(By.ID, "question").send_keys(spec["question"])
    Select(d.find_element(By.ID, "mode")).select_by_value("compare")
    d.find_element(By.ID, "max-tokens").clear()
    d.find_element(By.ID, "max-tokens").send_keys(str(spec["max_tokens"]))
    d.find_element(By.ID, "run").click()
    WebDriverWait(d, 90, poll_frequency=0.1).until(
        lambda d: d.find_element(By.TAG_NAME, "body")
                   .get_attribute("data-state") == "done")
    panels = []
    for p in d.find_elements(By.CSS_SELECTOR, "#results .panel"):
        q = lambda sel: p.find_element(By.CSS_SELECTOR, sel)
        panels.append({
            "mode": p.get_attribute("data-mode"),
            "state": p.get_attribute("data-state"),
            "shown_mode": q(".mode").text,
            "ttft": q(".ttft").text,
            "segments": q(".segments").text,
            "cells": len(p.find_elements(By.CSS_SELECTOR, ".seg-bar i")),
            "tokens": q(".tokens").text,
            "answer": d.execute_script(
                "return arguments[0].textContent", q(".answer")),
            "error": q(".error").text,
        })
    d.save_screenshot(shot)
    print(json.dumps({"panels": panels, "title": d.title}))
finally:
    d.quit()
PY

sub body {
    my (%f) = @_;
    return JSON::PP->new->canonical->encode(\%f);
}

# width and height of a PNG, if it is one
sub png_size {
    my ($data) = @_;
    return () unless length($data) > 33
        && substr($data, 0, 8) eq "\x89PNG\r\n\x1a\n"
        && substr($data, 12, 4) eq 'IHDR';
    return unpack('NN', substr($data, 16, 8));
}

run_tests();

__DATA__

=== TEST 1: the demo page runs every mode in a headless browser
--- http_config
    @ENGINE@
    map $http_x_hypic_mode $hypic_demo_mode {
        default     pic;
        full        full;
        prefix      prefix;
        naive       naive;
        pic         pic;
    }
--- config
    location /demo/ {
        alias @REPO@/conf/demo/;
        types {
            text/html                   html;
            text/css                    css;
            application/javascript      js;
        }
    }
    location /demo/v1/ {
        hypic_pass tiny;
        hypic_mode $hypic_demo_mode;
    }
--- response_check
my ($res, $block, $srv) = @_;
my $dir = private_dir('demo');
open my $fh, '>', "$dir/drive.py" or die "$dir: $!";
print $fh $main::DRIVE;
close $fh;
open $fh, '>', "$dir/spec.json" or die "$dir: $!";
print $fh JSON::PP->new->encode({ docs => \@main::DOCS,
                                  question => $main::QUESTION,
                                  system => $main::SYSTEM,
                                  max_tokens => 24 });
close $fh;
my $shot = "$dir/demo.png";
local $ENV{SE_OFFLINE} = 'true';
my $out = `timeout 150 $main::PYTHON $dir/drive.py http://127.0.0.1:$srv->{port}/demo/ $shot $main::CHROMIUM $main::DRIVER $dir/spec.json 2>&1`;
is($?, 0, 'the browser ran the page') or diag($out);
my $r = eval { JSON::PP->new->decode((split /\n/, $out)[-1]) } || {};
like($r->{title} // '', qr/HYPIC/, 'the page loaded');
my @p = @{ $r->{panels} || [] };
is_deeply([map { $_->{mode} } @p], [qw(full prefix naive pic)],
          'one panel per mode');
for my $p (@p) {
    my $m = $p->{mode};
    is($p->{state}, 'done', "$m: done") or diag($p->{error});
    is($p->{shown_mode}, $m, "$m: the server ran it (X-Hypic-Mode)");
    like($p->{ttft}, qr/^\d+ ms$/, "$m: a time to first token");
    like($p->{segments}, qr/^\d+\/\d+$/, "$m: segments from the cache");
    my ($total) = $p->{segments} =~ m{/(\d+)$};
    is($p->{cells}, $total // -1, "$m: one cell per segment");
    like($p->{tokens}, qr/^\d+ \(\d+\)$/, "$m: prompt and cached tokens");
    ok(length $p->{answer}, "$m: an answer");
}
my ($pic) = grep { $_->{mode} eq 'pic' } @p;
my ($hit) = ($pic->{segments} // '') =~ m{^(\d+)/};
ok(($hit // 0) >= 2, 'pic found the cached documents');
# the same request through the API: the page parsed the stream right
my $sep = '<|pic_sep|>';
my $api = http_request($srv, "POST /demo/v1/chat/completions\n"
                       . body(model => 'tiny-1', max_tokens => 24,
                              temperature => 0,
                              messages => [
                                  { role => 'system',
                                    content => $main::SYSTEM },
                                  { role => 'user',
                                    content => join('', map { "$sep$_" }
                                                    @main::DOCS)
                                               . "$sep$main::QUESTION" }]),
                       "X-Hypic-Mode: full");
my $text = eval { JSON::PP->new->decode($api->{body})
                  ->{choices}[0]{message}{content} };
my ($full) = grep { $_->{mode} eq 'full' } @p;
is($full->{answer}, $text, 'the full answer is the API\'s');
my @size = png_size(slurp($shot));
ok(@size && $size[0] >= 800 && $size[1] >= 600,
   "the screenshot is a PNG of @size pixels");
cmp_ok(-s $shot, '>', 20000, 'with something on it');
diag("screenshot: $shot") if $ENV{HYPIC_KEEP};
--- timeout: 60
--- no_error_log
[error]
