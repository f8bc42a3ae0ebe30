# Three engines on loopback ports (DESIGN §7, HYPIC §4.4): A serves nginx
# and dispatches the cold segments of a pic request by LPT to its own
# prefill worker and to peers B and C (remote prefill workers over the TCP
# peer transport); the answer equals the CLI's one-shot pic. Documents
# prefilled on C are reused on B: B pulls their cache tuples from C (peer
# fetch) and computes only what C computes when they are its own hits; B
# reports them as fetched tokens in its usage. Then C is
# frozen, gets its share of a new request, and is killed while A waits on
# it: the request completes by local recompute, with the same text, and A
# says which peer failed. No check measures time. The nodes are
# Hypic::Multinode's; t/091-multinode-netns.t runs these blocks again with
# B and C in network namespaces of their own.

use strict;
use warnings;
use lib 't/lib';

use JSON::PP ();
use Time::HiRes qw(sleep);
use Hypic::Nginx;
use Hypic::Engine;
use Hypic::Multinode;

Hypic::Engine::Client->import(qw(open_request finish_request sse_events
                                 sse_text json_body json_of text_of));

our $MODEL = "$Hypic::Nginx::REPO/models/test/qwen35-dense";

# '' when the nodes can run here (t/091 asks the same)
sub why_not {
    my $why = Hypic::Engine->why_not || (-d $MODEL ? '' : "no $MODEL");
    return $why if $why;
    my $bin = Hypic::Engine::binary();
    my $help = `$bin serve --help 2>&1`;
    return $help =~ /--peer-listen/ ? ''
        : 'hypic-engine serve has no peer transport (--peer-listen)';
}

# t/091 sets $NETNS and runs this file's blocks (do FILE)
our $NETNS //= 0;
my $why = why_not();
plan(skip_all => $why) if $why;

our $MN = Hypic::Multinode->start(model => $MODEL, netns => $NETNS);
our ($A, $B, $C) = $MN->engines;
Test::More::note("network namespaces unavailable ($MN->{why}): the "
                 . "loopback-port variant instead")
    if $NETNS && $MN->{mode} ne 'netns';

add_vars(ENGINE => $MN->engines_conf);

our $SEP = '<|pic_sep|>';

# a lead and four documents of different lengths, new for every call (no
# node holds any of them yet); question(P, Q): P's documents, question Q
my $round = 0;
sub prompt {
    $round++;
    my @docs = map {
        "Document $round.$_: " . join(' ', ("the river $_ runs past the "
                                             . "mill of round $round") x $_)
    } 1 .. 4;
    return join($SEP, "You answer from the documents of round $round.", @docs,
                'Which river runs past the mill?');
}

sub question {
    my ($p, $q) = @_;
    my @parts = split /\Q$SEP\E/, $p;
    $parts[-1] = $q;
    return join $SEP, @parts;
}

# A greedy pic completion of $n tokens (8 by default) from one node's
# location (/b/, /c/; '' for A's /v1/): the response with its text, usage
# and X-Hypic-Segments taken out.
sub ask {
    my ($srv, $node, $p, $n) = @_;
    my $path = $node eq '' ? '/v1/completions' : "/$node/v1/completions";
    my $r = http_request($srv, "POST $path\n"
                         . body(prompt => $p, max_tokens => $n // 8,
                                temperature => 0), undef, 120);
    $r->{text} = text_of($r);
    $r->{usage} = json_of($r)->{usage} // {};
    $r->{segs} = join ',', @{ $r->{headers}{'x-hypic-segments'} || [] };
    return $r;
}

sub body { json_body(@_) }

sub cli_pic {
    my ($p, $n) = @_;
    return Hypic::Engine->generate(model => $MODEL, prompt => $p,
                                   max_tokens => $n, args => ['--mode', 'pic']);
}

sub wait_for {
    my ($cond, $secs) = @_;
    for (1 .. $secs * 20) {
        return 1 if $cond->();
        sleep 0.05;
    }
    return 0;
}

run_tests();

__DATA__

=== TEST 1: all three nodes up: cold segments prefilled across them, the CLI's text
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass mn_a; hypic_mode pic; hypic_seam 8; }
--- response_check
my ($res, $block, $srv) = @_;
my $p = main::prompt();
my $r = main::ask($srv, '', $p, 8);
is($r->{status}, 200, 'answered');
is($r->{text}, main::cli_pic($p, 8), 'equals the CLI in pic mode');
unlike($main::A->log_text, qr/peer \S+ failed/, 'no peer failed');
if ($main::MN->{mode} eq 'netns') {
    my $mn = $main::MN;
    is($mn->netns_of($main::B->pid), $mn->{ns_b},
       "B ran in namespace $mn->{ns_b}, at $mn->{b_peer}");
    is($mn->netns_of($main::C->pid), $mn->{ns_c},
       "C ran in namespace $mn->{ns_c}, at $mn->{c_peer}");
    is($mn->netns_of($main::A->pid), '', 'A ran in the root namespace');
}
--- no_error_log
[error]



=== TEST 2: documents prefilled on C are fetched by B, not recomputed
--- http_config
    @ENGINE@
--- config
    location /b/ { hypic_pass mn_b; hypic_mode pic; hypic_seam 8; }
    location /c/ { hypic_pass mn_c; hypic_mode pic; hypic_seam 8; }
--- response_check
my ($res, $block, $srv) = @_;
my $c_peer = $main::MN->{c_peer};
my $p1 = main::prompt();
my $p2 = main::question($p1, 'Which mill does the river pass?');

# C has no peers: it prefills the documents itself and caches them
my $c1 = main::ask($srv, 'c', $p1);
is($c1->{status}, 200, 'C answered');
is($c1->{text}, main::cli_pic($p1, 8), 'C: the CLI\'s pic text');
is($c1->{usage}{prompt_tokens_details}{cached_tokens}, 0,
   'C: nothing cached before');
my ($hit, $total) = $c1->{segs} =~ m{^(\d+)/(\d+)\z};
is($hit, 0, "C: no segment hit ($c1->{segs})");

# B has never seen them: it pulls them from C instead of computing them
my $b = main::ask($srv, 'b', $p2);
is($b->{status}, 200, 'B answered');
is($b->{text}, main::cli_pic($p2, 8), 'B: the CLI\'s pic text');
my $fetched = $b->{usage}{prompt_tokens_details}{fetched_tokens} // 0;
ok($fetched > 0, "B: $fetched prompt tokens fetched from a peer");
is($fetched, $b->{usage}{prompt_tokens_details}{cached_tokens},
   'B: every cached token was fetched (B held none)');
($hit) = $b->{segs} =~ m{^(\d+)/};
is($b->{segs}, ($total - 1) . "/$total",
   'B: every document and the lead a hit, only the question missed');
ok($main::B->log_wait(qr/fetched from peer \Q$c_peer\E/, 120, $hit),
   "B logged $hit fetches from C at $c_peer");
my @lines = $main::B->log_text =~ /^.*fetched from peer.*$/mg;
is(scalar @lines, $hit, 'B fetched nothing else') or diag(join "\n", @lines);
unlike($main::B->log_text, qr/peer \S+ failed/, 'B: no peer failed');

# the same request on C, where the documents are its own hits: B computed
# exactly what C computes then, no document token more
my $c2 = main::ask($srv, 'c', $p2);
is($c2->{text}, $b->{text}, 'C: the same text');
is($c2->{segs}, $b->{segs}, 'C: the same hits');
is($b->{usage}{prompt_tokens_details}{cached_tokens},
   $c2->{usage}{prompt_tokens_details}{cached_tokens},
   'B reused as many tokens as C from its own cache');
is($c2->{usage}{prompt_tokens_details}{fetched_tokens}, undef,
   'C: no fetched tokens reported');
is($b->{usage}{prompt_tokens}, $c2->{usage}{prompt_tokens},
   'the same prompt tokens');
--- no_error_log
[error]



=== TEST 3: C killed while A waits on it: the request completes by local recompute
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass mn_a; hypic_mode pic; hypic_seam 8; }
--- timeout: 30
--- response_check
my ($res, $block, $srv) = @_;
my $p = main::prompt();
kill 'STOP', $main::C->pid;
my $h = open_request($srv->{port}, "POST /v1/completions\n"
                     . main::body(prompt => $p, max_tokens => 8,
                                  temperature => 0,
                                  stream => JSON::PP::true));
ok(main::wait_for(sub { $main::MN->c_backlog > 0 }, 120),
   'A dispatched a segment to the frozen C');
$main::C->crash;
my $r = finish_request($h, 120);
is($r->{status}, 200, 'the request is answered');
my @ev = sse_events($r->{body});
ok((grep { !ref && $_ eq '[DONE]' } @ev), 'the stream ends with [DONE]');
is(sse_text(@ev), main::cli_pic($p, 8), 'with the CLI\'s pic text');
like($main::A->log_text, qr/peer \Q$main::MN->{c_peer}\E failed/,
     'A logged which peer failed');
ok($main::B->alive && $main::A->alive, 'A and B live on');
--- no_error_log
[error]



=== TEST 4: with C gone, the next request does not wait for it
--- http_config
    @ENGINE@
--- config
    location /v1/ { hypic_pass mn_a; hypic_mode pic; hypic_seam 8; }
--- response_check
my ($res, $block, $srv) = @_;
my $p = main::prompt();
my $r = main::ask($srv, '', $p, 4);
is($r->{status}, 200, 'answered');
is($r->{text}, main::cli_pic($p, 4), 'equals the CLI in pic mode');
--- no_error_log
[error]
