// Conversations and settings in the browser's localStorage.

const CONVERSATIONS = 'k3.conversations';
const CURRENT = 'k3.current';
const SETTINGS = 'k3.settings';

function read(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

export function loadConversations() {
  const list = read(CONVERSATIONS, []);
  return Array.isArray(list) ? list.filter((c) => c && Array.isArray(c.messages)) : [];
}

export function saveConversations(list) {
  localStorage.setItem(CONVERSATIONS, JSON.stringify(list));
}

export function currentId() {
  return localStorage.getItem(CURRENT) || '';
}

export function setCurrentId(id) {
  localStorage.setItem(CURRENT, id);
}

export function newConversation() {
  const id = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
  return { id, title: 'New chat', created: Date.now(), messages: [] };
}

export const defaultSettings = {
  system: '',
  temperature: 0.7,
  maxTokens: 0, // 0: the server's default
  thinking: true,
  reasoningBudget: '',
  tools: '',
  toolChoice: 'auto',
};

export function loadSettings() {
  return { ...defaultSettings, ...read(SETTINGS, {}) };
}

export function saveSettings(settings) {
  localStorage.setItem(SETTINGS, JSON.stringify(settings));
}
