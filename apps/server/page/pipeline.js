// The engine live, from GET /k3/events: the memory plan, the latest step's figures per layer
// (experts asked, cached, read, prefetched; when their bytes arrived against when the layer
// computed), the drives' read rate and busy fraction over the last minutes, and the queue.

import { withKey } from './api.js';
import { el } from './render.js';

const $ = (id) => document.getElementById(id);
const SVG = 'http://www.w3.org/2000/svg';
const HISTORY_MS = 5 * 60 * 1000;

let source = null;
let retry = 0;
let history = new Map(); // drive name -> [{t, rate, busy}]
let steps = 0;

function bytes(n) {
  if (!Number.isFinite(n)) return String(n);
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) {
    n /= 1000;
    i += 1;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

const percent = (x) => `${((x || 0) * 100).toFixed(1)}%`;

function fill(dl, rows) {
  const nodes = [];
  for (const [name, value] of rows) {
    nodes.push(el('dt', '', name), el('dd', '', String(value)));
  }
  $(dl).replaceChildren(...nodes);
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function showPlan(plan) {
  const rows = [['model', plan.model], ['layers', plan.layers],
    ['MoE layers', plan.moe_layers?.length ?? ''],
    ['experts', `${plan.experts_per_token} of ${plan.experts_per_layer} a token`],
    ['batch', plan.max_batch], ['context', plan.context], ['prompt chunk', plan.prefill_chunk]];
  for (const [k, v] of Object.entries(plan.memory || {})) {
    // Sizes end in _bytes; the rest are counts or words.
    if (k.endsWith('_bytes')) rows.push([k.slice(0, -6).replaceAll('_', ' '), bytes(v)]);
    else rows.push([k.replaceAll('_', ' '), String(v)]);
  }
  for (const d of plan.drives || []) rows.push([`drive ${d.name}`, (d.dirs || []).join(', ')]);
  fill('pl-plan', rows);
}

// A sparkline of points[i][key] (0..max) from the first point (at most HISTORY_MS ago) to now.
function sparkline(points, key, max, className) {
  const w = 300;
  const h = 40;
  const now = performance.now();
  const span = Math.max(1000, now - points[0].t);
  const line = svg('svg', {
    viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: 'none', class: `spark ${className}`,
  });
  const xy = points.map((p) => {
    const x = w - ((now - p.t) / span) * w;
    const y = h - (max > 0 ? (p[key] / max) * (h - 2) : 0) - 1;
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  });
  line.append(svg('polyline', { points: xy.join(' ') }));
  return line;
}

function showDrives(step) {
  const now = performance.now();
  const devices = step.devices?.length ? step.devices
    : [{ name: 'all', ...(step.disk || {}) }];
  for (const d of devices) {
    const list = history.get(d.name) || [];
    list.push({ t: now, rate: d.rate_bytes_per_second || 0, busy: d.busy_fraction || 0 });
    while (list.length && now - list[0].t > HISTORY_MS) list.shift();
    history.set(d.name, list);
  }
  const rows = [];
  for (const [name, list] of history) {
    const last = list[list.length - 1];
    const peak = Math.max(...list.map((p) => p.rate), 1);
    const row = el('div', 'drive');
    row.append(el('div', 'drive-name', name),
      el('div', 'drive-figure', `${bytes(last.rate)}/s`), sparkline(list, 'rate', peak, 'rate'),
      el('div', 'drive-figure', `busy ${percent(last.busy)}`), sparkline(list, 'busy', 1, 'busy'));
    row.title = `peak ${bytes(peak)}/s`;
    rows.push(row);
  }
  $('pl-drives').replaceChildren(...rows);
}

function timeline(layer, span) {
  const w = 300;
  const line = svg('svg', { viewBox: `0 0 ${w} 14`, class: 'timeline' });
  const x = (ms) => Math.max(0, Math.min(w, (ms / span) * w));
  const bar = (from, to, y, className) => {
    if (!(to >= from)) return;
    line.append(svg('rect', {
      x: x(from), y, width: Math.max(1, x(to) - x(from)), height: 6, class: className,
    }));
  };
  bar(layer.bytes_first_ms, layer.bytes_last_ms, 0, 'bytes');
  bar(layer.compute_start_ms, layer.compute_end_ms, 7, 'compute');
  return line;
}

function showLayers(layers) {
  const span = Math.max(1, ...layers.flatMap((l) => [l.bytes_last_ms || 0, l.compute_end_ms || 0]));
  $('pl-span').textContent = `${span.toFixed(0)} ms`;
  const rows = layers.map((l) => {
    const tr = el('tr');
    for (const v of [l.layer, l.asked, l.cached, l.read, l.prefetched]) tr.append(el('td', '', v));
    const cell = el('td', 'wide');
    cell.append(timeline(l, span));
    tr.append(cell);
    return tr;
  });
  $('pl-layers').tBodies[0].replaceChildren(...rows);
}

function showStep(step) {
  steps += 1;
  fill('pl-step', [
    ['step', step.seq], ['kind', step.kind], ['steps merged', step.steps],
    ['tokens', step.tokens], ['seconds', (step.seconds ?? 0).toFixed(3)],
    ['stall', `${(step.stall_seconds ?? 0).toFixed(3)} s`],
    ['expert hit rate', percent(step.hit_rate)],
    ['disk read', bytes(step.disk?.read_bytes ?? 0)],
  ]);
  fill('pl-requests', [
    ['waiting', step.queue?.waiting ?? 0], ['running', step.queue?.running ?? 0],
    ['prompt cache entries', step.prompt_cache?.entries ?? 0],
    ['prompt cache hits', step.prompt_cache?.hits ?? 0],
    ['finished', step.requests?.finished ?? 0], ['cancelled', step.requests?.cancelled ?? 0],
  ]);
  showDrives(step);
  showLayers(step.layers || []);
  $('pl-status').textContent = `live · ${steps} updates`;
  $('pipeline-view').dataset.updates = String(steps);
}

function parse(e) {
  try {
    return JSON.parse(e.data);
  } catch {
    return null;
  }
}

// Connects while the view is shown: a closed view costs the server nothing.
export function startPipeline() {
  if (source) return;
  source = new EventSource(withKey('/k3/events'));
  source.addEventListener('plan', (e) => {
    const plan = parse(e);
    if (plan) showPlan(plan);
    $('pl-status').textContent = 'live · waiting for a step';
  });
  source.addEventListener('step', (e) => {
    const step = parse(e);
    if (step) showStep(step);
  });
  source.addEventListener('idle', () => {
    $('pl-status').textContent = `idle · ${steps} updates`;
  });
  source.addEventListener('error', () => {
    if (source.readyState !== EventSource.CLOSED) {
      $('pl-status').textContent = 'reconnecting…';
      return;
    }
    // Refused (the server takes a few listeners at once) or gone: try again in a while.
    stopPipeline();
    $('pl-status').textContent = 'not connected; trying again in 5 s';
    retry = setTimeout(startPipeline, 5000);
  });
}

export function stopPipeline() {
  clearTimeout(retry);
  source?.close();
  source = null;
}
