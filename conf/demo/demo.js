/*
 * HYPIC serve demo: builds a chat prompt whose documents are separate
 * segments, runs it in one mode or in each mode in turn, streams every
 * answer (fetch + ReadableStream, server-sent events parsed here) and
 * shows what the server says about it: the mode that ran, the node, the
 * segments that came from the cache (X-Hypic-Segments, hit/total), the
 * usage, and the time to the first token as this page measures it.
 *
 * The API is the OpenAI one under v1/ next to this page; the location
 * there takes the mode from the X-Hypic-Mode request header
 * (conf/nginx.conf.in).
 */
'use strict';

const SEP = '<|pic_sep|>';
const MODES = ['full', 'prefix', 'naive', 'pic'];

const $ = (sel) => document.querySelector(sel);

let model = null;

async function getModel() {
  if (model) {
    return model;
  }
  const res = await fetch('v1/models');
  if (!res.ok) {
    throw new Error('GET v1/models: ' + res.status);
  }
  const list = await res.json();
  model = list.data[0].id;
  return model;
}

function documents() {
  return Array.from(document.querySelectorAll('textarea.doc'))
    .map((t) => t.value.trim())
    .filter((d) => d.length > 0);
}

/* system, then the user turn: SEP doc1 SEP doc2 ... SEP question */
function messages() {
  const docs = documents();
  const question = $('#question').value.trim();
  const content = docs.map((d) => SEP + d).join('') +
                  (docs.length ? SEP : '') + question;
  const msgs = [];
  const system = $('#system').value.trim();
  if (system) {
    msgs.push({ role: 'system', content: system });
  }
  msgs.push({ role: 'user', content: content });
  return msgs;
}

function addDocument() {
  const list = $('#doc-list');
  const box = document.createElement('div');
  box.className = 'doc-box';
  const label = document.createElement('label');
  label.textContent = 'Document ' + (list.children.length + 1);
  const area = document.createElement('textarea');
  area.className = 'doc';
  area.rows = 5;
  area.placeholder = 'Paste a document here';
  box.append(label, area);
  list.append(box);
  area.focus();
}

function panel(mode) {
  const node = $('#panel').content.firstElementChild.cloneNode(true);
  node.dataset.mode = mode;
  node.dataset.state = 'waiting';
  node.querySelector('.mode').textContent = mode;
  $('#results').append(node);
  return node;
}

function ms(t) {
  return t.toFixed(0) + ' ms';
}

function showSegments(p, header) {
  const m = /^(\d+)\/(\d+)$/.exec(header || '');
  p.querySelector('.segments').textContent = m ? header : 'n/a';
  const bar = p.querySelector('.seg-bar');
  bar.textContent = '';
  if (!m) {
    return;
  }
  const hit = Number(m[1]);
  const total = Math.min(Number(m[2]), 64);
  for (let i = 0; i < total; i++) {
    const cell = document.createElement('i');
    if (i < hit) {
      cell.className = 'hit';
    }
    cell.title = i < hit ? 'from the cache' : 'computed';
    bar.append(cell);
  }
}

/* Server-sent events: "data: ..." lines, events end with a blank line;
 * comments (": ping") are heartbeats. */
function* events(text) {
  for (const block of text.split('\n\n')) {
    const data = block.split('\n')
      .filter((l) => l.startsWith('data:'))
      .map((l) => l.slice(5).replace(/^ /, ''))
      .join('\n');
    if (data) {
      yield data;
    }
  }
}

async function stream(mode, p, body) {
  const t0 = performance.now();
  const res = await fetch('v1/chat/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-Hypic-Mode': mode },
    body: JSON.stringify(body),
  });

  if (!res.ok) {
    let msg = res.status + ' ' + res.statusText;
    try {
      msg = (await res.json()).error.message;
    } catch (e) { /* not JSON */ }
    throw new Error(msg);
  }

  p.querySelector('.mode').textContent = res.headers.get('X-Hypic-Mode') ||
                                         mode;
  p.querySelector('.node').textContent = res.headers.get('X-Hypic-Node') ?
    'on ' + res.headers.get('X-Hypic-Node') : '';
  showSegments(p, res.headers.get('X-Hypic-Segments'));

  const answer = p.querySelector('.answer');
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let first = null;

  for (;;) {
    const { value, done } = await reader.read();
    if (done) {
      break;
    }
    buf += decoder.decode(value, { stream: true });
    const end = buf.lastIndexOf('\n\n');
    if (end < 0) {
      continue;
    }
    const whole = buf.slice(0, end);
    buf = buf.slice(end + 2);

    for (const data of events(whole)) {
      if (data === '[DONE]') {
        continue;
      }
      const ev = JSON.parse(data);
      if (ev.error) {
        throw new Error(ev.error.message);
      }
      if (ev.usage) {
        const cached = ev.usage.prompt_tokens_details ?
          ev.usage.prompt_tokens_details.cached_tokens : 0;
        p.querySelector('.tokens').textContent =
          ev.usage.prompt_tokens + ' (' + cached + ')';
      }
      const choice = ev.choices && ev.choices[0];
      const piece = choice && choice.delta && choice.delta.content;
      if (piece) {
        if (first === null) {
          first = performance.now() - t0;
          p.querySelector('.ttft').textContent = ms(first);
          p.dataset.ttft = first.toFixed(1);
        }
        answer.textContent += piece;
      }
    }
  }

  p.querySelector('.total').textContent = ms(performance.now() - t0);
}

/* "SEP doc SEP" with max_tokens 0 caches the document (naive, pic) */
async function warm(mode, docs) {
  for (const d of docs) {
    await fetch('v1/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'X-Hypic-Mode': mode },
      body: JSON.stringify({ model: await getModel(), prompt: SEP + d + SEP,
                             max_tokens: 0 }),
    });
  }
}

async function run() {
  const button = $('#run');
  const status = $('#status');
  const choice = $('#mode').value;
  const modes = choice === 'compare' ? MODES : [choice];

  button.disabled = true;
  document.body.dataset.state = 'running';
  $('#results').textContent = '';
  status.textContent = '';

  try {
    const body = {
      model: await getModel(),
      messages: messages(),
      max_tokens: Number($('#max-tokens').value) || 48,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    };
    const docs = documents();
    const panels = modes.map(panel);

    /* one after the other: each mode's TTFT is not shared with another */
    for (let i = 0; i < modes.length; i++) {
      const p = panels[i];
      p.dataset.state = 'running';
      try {
        if ($('#warm').checked && (modes[i] === 'pic' ||
                                   modes[i] === 'naive')) {
          status.textContent = 'caching the documents for ' + modes[i];
          await warm(modes[i], docs);
        }
        status.textContent = 'running ' + modes[i];
        await stream(modes[i], p, body);
        p.dataset.state = 'done';
      } catch (e) {
        p.querySelector('.error').textContent = e.message;
        p.dataset.state = 'error';
      }
    }
    status.textContent = '';
  } catch (e) {
    status.textContent = e.message;
  }

  button.disabled = false;
  document.body.dataset.state = 'done';
}

$('#add-doc').addEventListener('click', addDocument);
$('#run').addEventListener('click', run);
