// How messages look. Model output becomes markdown through markdown-it with raw HTML off (a
// reply's "<script>" or "<img onerror>" is escaped text) and only http(s) and mailto links;
// reasoning, tool arguments and tool results are set as textContent, never parsed as HTML.

let md = null;

function markdown() {
  if (md) return md;
  // eslint-disable-next-line no-undef
  md = window.markdownit({ html: false, linkify: false, typographer: false, breaks: true });
  // An image would fetch from wherever the model says (and the policy forbids it): off.
  md.disable('image');
  md.validateLink = (url) => /^(https?:|mailto:)/i.test(url.trim());
  const link = md.renderer.rules.link_open ||
    ((tokens, i, options, env, self) => self.renderToken(tokens, i, options));
  md.renderer.rules.link_open = (tokens, i, options, env, self) => {
    tokens[i].attrSet('target', '_blank');
    tokens[i].attrSet('rel', 'noopener noreferrer');
    return link(tokens, i, options, env, self);
  };
  return md;
}

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// markdown-it's output holds only the tags it made itself: with html false every character of
// the source that could open a tag is escaped.
export function renderMarkdown(node, text) {
  node.innerHTML = markdown().render(text);
}

function toolCall(call) {
  const box = el('div', 'tool-call');
  box.append(el('div', 'tool-name', `→ ${call.function?.name || '(unnamed tool)'}`));
  let args = call.function?.arguments || '';
  try {
    args = JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    // still streaming, or not JSON: as it came
  }
  box.append(el('pre', 'tool-args', args));
  return box;
}

function stats(s) {
  const parts = [];
  if (s.promptTokens !== undefined) parts.push(`prompt ${s.promptTokens} tokens`);
  if (s.cachedTokens !== undefined) parts.push(`${s.cachedTokens} cached`);
  if (s.ttftMs !== undefined) parts.push(`first token ${(s.ttftMs / 1000).toFixed(2)} s`);
  if (s.completionTokens !== undefined) parts.push(`${s.completionTokens} tokens`);
  if (s.tokensPerSecond !== undefined) parts.push(`${s.tokensPerSecond.toFixed(1)} tokens/s`);
  if (s.context > 0 && s.promptTokens !== undefined) {
    const used = s.promptTokens + (s.completionTokens || 0);
    parts.push(`context ${((100 * used) / s.context).toFixed(1)}% of ${s.context}`);
  }
  if (s.stopped) parts.push('stopped');
  if (s.finish) parts.push(s.finish);
  return parts.join(' · ');
}

// Fills `node` (a .message) with assistant message `m`; `streaming` keeps the reasoning open
// until the answer starts.
export function fillAssistant(node, m, streaming) {
  let details = node.querySelector(':scope > details.reasoning');
  if (m.reasoning) {
    if (!details) {
      details = el('details', 'reasoning');
      details.append(el('summary', '', 'Reasoning'), el('div', 'reasoning-text'));
      details.open = streaming;
      node.prepend(details);
    }
    details.querySelector('.reasoning-text').textContent = m.reasoning;
    const answered = Boolean(m.content || m.tool_calls?.length);
    details.querySelector('summary').textContent =
      streaming && !answered ? 'Reasoning…' : 'Reasoning';
    if (streaming && answered && details.dataset.folded !== '1') {
      details.open = false; // folds once when the answer starts; the user may open it again
      details.dataset.folded = '1';
    }
  }
  let content = node.querySelector(':scope > .content');
  if (!content) {
    content = el('div', 'content');
    node.append(content);
  }
  renderMarkdown(content, m.content || '');
  let calls = node.querySelector(':scope > .tool-calls');
  if (m.tool_calls?.length) {
    if (!calls) {
      calls = el('div', 'tool-calls');
      node.append(calls);
    }
    calls.replaceChildren(...m.tool_calls.map(toolCall));
  }
  let line = node.querySelector(':scope > .stats');
  if (m.stats) {
    if (!line) {
      line = el('div', 'stats');
      node.append(line);
    }
    line.textContent = stats(m.stats);
  }
}

export function toolResult(m, call) {
  const box = el('div', 'tool-result');
  box.append(el('div', 'tool-name', `← ${call?.function?.name || 'tool'} result`));
  box.append(el('pre', 'tool-output', m.content || ''));
  return box;
}
