// The server's API as the page uses it: the key, /k3/info, and server-sent events read from a
// fetch body (EventSource cannot POST).

const KEY = 'k3.apiKey';

export const apiKey = {
  get: () => localStorage.getItem(KEY) || '',
  set: (key) => localStorage.setItem(KEY, key),
};

export function authHeaders() {
  const key = apiKey.get();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// A URL with the key as ?key= (for EventSource, which sends no headers).
export function withKey(path) {
  const key = apiKey.get();
  return key ? `${path}?key=${encodeURIComponent(key)}` : path;
}

export async function getInfo() {
  const response = await fetch('/k3/info');
  if (!response.ok) throw new Error(`/k3/info: HTTP ${response.status}`);
  return response.json();
}

// Calls onData(text) with the data of each event of a text/event-stream body, until the
// stream ends. Comments (": keep-alive") and other fields are skipped.
export async function readEvents(response, onData) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n?/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split('\n')
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(line.startsWith('data: ') ? 6 : 5));
      if (data.length) onData(data.join('\n'));
    }
  }
}

// The message of an error answer ({"error": {"message"}}), else the status.
export async function errorText(response) {
  try {
    const body = await response.json();
    if (body?.error?.message) return `${response.status}: ${body.error.message}`;
  } catch {
    // not JSON: the status says it
  }
  return `HTTP ${response.status}`;
}
