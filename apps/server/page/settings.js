// The settings panel: the system prompt and the request's parameters, kept in localStorage,
// and the request fields they make.

import { loadSettings, saveSettings } from './store.js';

const $ = (id) => document.getElementById(id);

const fields = {
  system: ['set-system', 'value'],
  temperature: ['set-temperature', 'value'],
  maxTokens: ['set-max-tokens', 'value'],
  thinking: ['set-thinking', 'checked'],
  reasoningBudget: ['set-reasoning-budget', 'value'],
  tools: ['set-tools', 'value'],
  toolChoice: ['set-tool-choice', 'value'],
};

let settings = loadSettings();

export function initSettings(info) {
  $('set-max-tokens').placeholder = `${info.max_tokens_default ?? ''} (server default)`;
  for (const [name, [id, prop]] of Object.entries(fields)) {
    $(id)[prop] = settings[name] === 0 ? '' : settings[name];
    const update = () => {
      settings[name] = $(id)[prop];
      saveSettings(settings);
      check();
    };
    $(id).addEventListener('input', update);
    $(id).addEventListener('change', update);
  }
  $('settings-toggle').addEventListener('click', () => {
    $('settings').hidden = !$('settings').hidden;
  });
  check();
}

function parseTools() {
  const text = (settings.tools || '').trim();
  if (!text) return null;
  const tools = JSON.parse(text);
  if (!Array.isArray(tools)) throw new Error('tools must be a JSON list');
  return tools;
}

function check() {
  const box = $('settings-error');
  try {
    parseTools();
    box.hidden = true;
  } catch (e) {
    box.textContent = `Tools: ${e.message}`;
    box.hidden = false;
  }
}

export function systemPrompt() {
  return settings.system || '';
}

// The fields of a chat request these settings set.
export function requestFields() {
  const out = {};
  const temperature = parseFloat(settings.temperature);
  if (Number.isFinite(temperature)) out.temperature = temperature;
  const maxTokens = parseInt(settings.maxTokens, 10);
  if (maxTokens > 0) out.max_tokens = maxTokens;
  out.chat_template_kwargs = { thinking: Boolean(settings.thinking) };
  const budget = parseInt(settings.reasoningBudget, 10);
  if (settings.thinking && Number.isFinite(budget)) out.reasoning_budget = budget;
  let tools = null;
  try {
    tools = parseTools();
  } catch {
    // shown in the panel; the request goes without them
  }
  if (tools?.length) {
    out.tools = tools;
    out.tool_choice = settings.toolChoice || 'auto';
  }
  return out;
}
