// The page's start: what the server says of itself (/k3/info), the API key where it asks for
// one, and the two tabs (the chat at /, the pipeline at /pipeline).

import { apiKey, getInfo } from './api.js';
import { initChat } from './chat.js';
import { initSettings } from './settings.js';
import { startPipeline, stopPipeline } from './pipeline.js';

const $ = (id) => document.getElementById(id);

function askKey() {
  const dialog = $('key-dialog');
  if (dialog.open) return;
  $('key-input').value = apiKey.get();
  dialog.showModal();
}

function showTab(tab) {
  const pipeline = tab === 'pipeline';
  $('chat-view').hidden = pipeline;
  $('pipeline-view').hidden = !pipeline;
  $('tab-chat').classList.toggle('active', !pipeline);
  $('tab-pipeline').classList.toggle('active', pipeline);
  $('settings-toggle').hidden = pipeline;
  if (pipeline) startPipeline();
  else stopPipeline();
}

async function main() {
  const info = await getInfo();
  $('model').textContent = `${info.model} · context ${info.context}`;
  $('key-form').addEventListener('submit', () => {
    apiKey.set($('key-input').value.trim());
    if (!$('pipeline-view').hidden) {
      stopPipeline();
      startPipeline();
    }
  });
  $('set-key').addEventListener('click', askKey);
  if (info.api_key_required && !apiKey.get()) askKey();
  initSettings(info);
  initChat(info, { onUnauthorized: askKey });
  for (const a of document.querySelectorAll('nav a')) {
    a.addEventListener('click', (e) => {
      e.preventDefault();
      history.pushState({}, '', a.getAttribute('href'));
      showTab(a.dataset.tab);
    });
  }
  window.addEventListener('popstate', () => {
    showTab(location.pathname === '/pipeline' ? 'pipeline' : 'chat');
  });
  showTab(location.pathname === '/pipeline' ? 'pipeline' : 'chat');
  document.body.dataset.ready = '1';
}

main().catch((e) => {
  document.body.textContent = `The page could not start: ${e.message}`;
});
