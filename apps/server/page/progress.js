// The prompt's progress bar, from the stream's prompt_progress chunks ({total, cache,
// processed, time_ms}; processed counts the cached tokens too), with an estimate of the time
// left at the rate of the tokens run so far.

const $ = (id) => document.getElementById(id);

function duration(ms) {
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  return `${Math.floor(s / 60)} min ${s % 60} s`;
}

export function showProgress(p) {
  const total = Math.max(1, p.total || 0);
  const fraction = Math.min(1, (p.processed || 0) / total);
  const box = $('progress');
  box.hidden = false;
  box.dataset.processed = String(p.processed || 0);
  box.dataset.total = String(p.total || 0);
  $('progress-fill').style.width = `${(fraction * 100).toFixed(1)}%`;
  const ran = (p.processed || 0) - (p.cache || 0);
  let estimate = '';
  if (ran > 0 && p.time_ms > 0 && p.processed < p.total) {
    estimate = ` · about ${duration(((p.total - p.processed) * p.time_ms) / ran)} left`;
  }
  const cached = p.cache ? `, ${p.cache} from the cache` : '';
  $('progress-text').textContent =
    `prompt ${p.processed} of ${p.total} tokens${cached} (${Math.floor(fraction * 100)}%)${estimate}`;
}

export function hideProgress() {
  const box = $('progress');
  box.hidden = true;
  delete box.dataset.processed;
  delete box.dataset.total;
}
