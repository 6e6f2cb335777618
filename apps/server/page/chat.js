// The chat: conversations, streaming answers with their reasoning and tool calls, stop, edit
// and regenerate, the prompt's progress, and each answer's figures.

import { authHeaders, errorText, readEvents } from './api.js';
import {
  currentId, loadConversations, newConversation, saveConversations, setCurrentId,
} from './store.js';
import { el, fillAssistant, toolResult } from './render.js';
import { requestFields, systemPrompt } from './settings.js';
import { showProgress, hideProgress } from './progress.js';

const $ = (id) => document.getElementById(id);

let info = {};
let hooks = {};
let conversations = [];
let conv = null;
let controller = null; // the request in flight

export function initChat(serverInfo, callbacks) {
  info = serverInfo;
  hooks = callbacks;
  conversations = loadConversations();
  conv = conversations.find((c) => c.id === currentId()) || null;
  if (!conv) startConversation();
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    send();
  });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $('stop').addEventListener('click', () => controller?.abort());
  $('new-chat').addEventListener('click', () => {
    if (controller) return;
    startConversation();
    render();
  });
  render();
}

function startConversation() {
  conv = newConversation();
  conversations.unshift(conv);
  setCurrentId(conv.id);
}

function save() {
  // An empty conversation is not worth keeping, except the one on screen.
  conversations = conversations.filter((c) => c.messages.length || c === conv);
  saveConversations(conversations);
}

function render() {
  renderList();
  renderMessages();
  const pending = pendingCall();
  $('input').placeholder = pending
    ? `The result of ${pending.function?.name || 'the tool'} (sent as the tool's answer)`
    : 'Message (Enter sends, Shift+Enter a new line)';
}

function renderList() {
  const items = conversations.filter((c) => c.messages.length || c === conv).map((c) => {
    const li = el('li', c === conv ? 'current' : '');
    const title = el('button', 'title', c.title || 'New chat');
    title.type = 'button';
    title.addEventListener('click', () => {
      if (controller) return;
      conv = c;
      setCurrentId(c.id);
      render();
    });
    const remove = el('button', 'remove', '×');
    remove.type = 'button';
    remove.title = 'Delete this conversation';
    remove.addEventListener('click', () => {
      if (controller) return;
      conversations = conversations.filter((x) => x !== c);
      if (c === conv) startConversation();
      save();
      render();
    });
    li.append(title, remove);
    return li;
  });
  $('conversations').replaceChildren(...items);
}

function callById(id) {
  for (const m of conv.messages) {
    const call = m.tool_calls?.find((c) => c.id === id);
    if (call) return call;
  }
  return null;
}

// The first tool call of the last answer that has no result yet.
function pendingCall() {
  const last = conv.messages.findLastIndex((m) => m.role === 'assistant');
  if (last < 0) return null;
  const answered = new Set(conv.messages.slice(last + 1).map((m) => m.tool_call_id));
  return conv.messages[last].tool_calls?.find((c) => !answered.has(c.id)) || null;
}

function actions(buttons) {
  const bar = el('div', 'actions');
  for (const [label, onClick] of buttons) {
    const b = el('button', label.toLowerCase(), label);
    b.type = 'button';
    b.addEventListener('click', () => {
      if (!controller) onClick();
    });
    bar.append(b);
  }
  return bar;
}

function messageNode(m, i, lastAssistant) {
  const node = el('div', `message ${m.role}`);
  if (m.role === 'user') {
    node.append(el('div', 'content', m.content));
    node.append(actions([['Edit', () => edit(node, i)]]));
  } else if (m.role === 'assistant') {
    fillAssistant(node, m, false);
    if (i === lastAssistant) node.append(actions([['Regenerate', () => regenerate(i)]]));
  } else if (m.role === 'tool') {
    node.append(toolResult(m, callById(m.tool_call_id)));
  }
  return node;
}

function renderMessages() {
  const lastAssistant = conv.messages.findLastIndex((m) => m.role === 'assistant');
  $('messages').replaceChildren(...conv.messages.map((m, i) => messageNode(m, i, lastAssistant)));
  $('messages').scrollTop = $('messages').scrollHeight;
}

function edit(node, i) {
  const box = el('textarea', 'edit');
  box.value = conv.messages[i].content;
  box.rows = 3;
  const form = el('div', 'edit-form');
  form.append(box, actions([
    ['Save', () => {
      conv.messages = conv.messages.slice(0, i);
      conv.messages.push({ role: 'user', content: box.value });
      run();
    }],
    ['Cancel', render],
  ]));
  node.replaceChildren(form);
  box.focus();
}

function regenerate(i) {
  conv.messages = conv.messages.slice(0, i);
  run();
}

function send() {
  const text = $('input').value;
  if (controller || !text.trim()) return;
  $('input').value = '';
  const pending = pendingCall();
  if (pending) {
    conv.messages.push({ role: 'tool', tool_call_id: pending.id, content: text });
  } else {
    conv.messages.push({ role: 'user', content: text });
    if (conv.title === 'New chat') conv.title = text.trim().slice(0, 48);
  }
  run();
}

function apiMessages() {
  const out = [];
  if (systemPrompt()) out.push({ role: 'system', content: systemPrompt() });
  for (const m of conv.messages) {
    if (m.role === 'assistant') {
      // An answer stopped before its first word says nothing to the model.
      if (!m.content && !m.tool_calls?.length) continue;
      const a = { role: 'assistant', content: m.content || '' };
      if (m.tool_calls?.length) {
        a.tool_calls = m.tool_calls.map((c) => ({
          id: c.id, type: 'function',
          function: { name: c.function.name, arguments: c.function.arguments },
        }));
      }
      out.push(a);
    } else if (m.role === 'tool') {
      out.push({ role: 'tool', tool_call_id: m.tool_call_id, content: m.content });
    } else {
      out.push({ role: m.role, content: m.content });
    }
  }
  return out;
}

// Adds a stream chunk's delta to answer `m`; whether it carried any output.
function addDelta(m, delta) {
  let got = false;
  if (delta.reasoning_content) {
    m.reasoning = (m.reasoning || '') + delta.reasoning_content;
    got = true;
  }
  if (delta.content) {
    m.content += delta.content;
    got = true;
  }
  for (const t of delta.tool_calls || []) {
    m.tool_calls = m.tool_calls || [];
    const call = m.tool_calls[t.index ?? 0] ||= { id: '', function: { name: '', arguments: '' } };
    if (t.id) call.id = t.id;
    if (t.function?.name) call.function.name += t.function.name;
    if (t.function?.arguments) call.function.arguments += t.function.arguments;
    got = true;
  }
  return got;
}

function setBusy(busy) {
  $('send').hidden = busy;
  $('stop').hidden = !busy;
  document.body.classList.toggle('busy', busy);
}

function showError(text) {
  $('error').textContent = text;
  $('error').hidden = !text;
}

async function run() {
  showError('');
  const m = { role: 'assistant', content: '', stats: { context: info.context } };
  conv.messages.push(m);
  save();
  render();
  const node = $('messages').lastElementChild;
  node.classList.add('streaming');
  controller = new AbortController();
  setBusy(true);
  const start = performance.now();
  let first = null;
  let deltas = 0;
  let frame = 0;
  const draw = () => {
    frame = 0;
    const s = m.stats;
    if (first !== null) {
      s.completionTokens ??= deltas;
      const seconds = (performance.now() - first) / 1000;
      if (seconds > 0) s.tokensPerSecond = deltas / seconds;
    }
    fillAssistant(node, m, true);
    $('messages').scrollTop = $('messages').scrollHeight;
  };
  const body = {
    model: info.model, messages: apiMessages(), stream: true, return_progress: true,
    stream_options: { include_usage: true }, ...requestFields(),
  };
  try {
    const response = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', ...authHeaders() },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) {
      if (response.status === 401) hooks.onUnauthorized?.();
      throw new Error(await errorText(response));
    }
    await readEvents(response, (data) => {
      if (data === '[DONE]') return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || 'the server failed');
      if (chunk.prompt_progress && first === null) showProgress(chunk.prompt_progress);
      const choice = chunk.choices?.[0];
      if (choice?.delta && addDelta(m, choice.delta)) {
        deltas += 1;
        if (first === null) {
          first = performance.now();
          m.stats.ttftMs = first - start;
          hideProgress();
        }
      }
      if (choice?.finish_reason && choice.finish_reason !== 'stop') {
        m.stats.finish = choice.finish_reason;
      }
      if (chunk.usage) {
        m.stats.promptTokens = chunk.usage.prompt_tokens;
        m.stats.cachedTokens = chunk.usage.prompt_tokens_details?.cached_tokens ?? 0;
        m.stats.completionTokens = chunk.usage.completion_tokens;
      }
      frame ||= requestAnimationFrame(draw);
    });
  } catch (e) {
    if (e.name === 'AbortError') {
      m.stats.stopped = true;
    } else {
      showError(e.message);
      // A request refused or failed before any output leaves no empty answer behind.
      if (first === null) conv.messages.pop();
    }
  }
  cancelAnimationFrame(frame);
  if (first !== null) {
    const tokens = m.stats.completionTokens ?? deltas;
    const seconds = (performance.now() - first) / 1000;
    // The first token's time is TTFT's; the rate is of the tokens after it.
    if (tokens > 1 && seconds > 0) m.stats.tokensPerSecond = (tokens - 1) / seconds;
  }
  controller = null;
  setBusy(false);
  hideProgress();
  save();
  render();
}
