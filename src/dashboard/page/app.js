// oxalign dashboard: keeps a copy of the monitor's state (snapshot from /api/state, then
// live events over SSE from /api/events) and redraws the actor cards, charts, timeline,
// checkpoints and recipe from it. Plain DOM + inline SVG; no library, no network but this server.
(function () {
  'use strict';

  var SVG_NS = 'http' + '://www.w3.org/2000/svg'; // an XML namespace name, not a fetch
  var TOKEN = new URLSearchParams(window.location.search).get('token');
  var TIMELINE_STEPS = 4;      // steps shown on the Gantt chart
  var STALE_MS = 30000;        // heartbeat age that marks a working actor as stale
  var MAX_CHART_POINTS = 600;  // points drawn per series (longer series are thinned)

  // ---------------------------------------------------------------- state
  var S = {
    mode: null, monitorRunning: false, serverNow: 0, clientAt: 0,
    run: null, finished: null, actors: [], metrics: [], spans: [], checkpoints: [], samples: null,
    limits: { metric_steps: 10000, span_steps: 8, max_spans: 20000 }, maxSpanStep: null
  };

  function withToken(path) {
    if (!TOKEN) return path;
    return path + (path.indexOf('?') >= 0 ? '&' : '?') + 'token=' + encodeURIComponent(TOKEN);
  }

  function nowMs() {
    // live: the server's clock advanced by the time since we heard from it; replay: fixed
    if (S.mode === 'live' && S.monitorRunning) return S.serverNow + (Date.now() - S.clientAt);
    return S.serverNow;
  }

  function loadSnapshot(v) {
    S.mode = v.mode;
    S.monitorRunning = !!v.monitor_running;
    S.serverNow = v.now_unix_ms || Date.now();
    S.clientAt = Date.now();
    S.run = v.run || null;
    S.finished = v.finished || null;
    S.actors = v.actors || [];
    S.metrics = v.metrics || [];
    S.spans = v.spans || [];
    S.checkpoints = v.checkpoints || [];
    S.samples = v.samples || null;
    if (v.limits) S.limits = v.limits;
    S.maxSpanStep = null;
    for (var i = 0; i < S.spans.length; i++) {
      if (S.maxSpanStep === null || S.spans[i].step > S.maxSpanStep) S.maxSpanStep = S.spans[i].step;
    }
    scheduleRender();
  }

  function findActor(name) {
    for (var i = 0; i < S.actors.length; i++) if (S.actors[i].name === name) return S.actors[i];
    return null;
  }

  // Same rules as the Rust MonitorState::apply.
  function applyEvent(ev) {
    var d = ev.data;
    switch (ev.type) {
      case 'run': S.run = d; break;
      case 'finished': S.finished = d; break;
      case 'actor': {
        var a = findActor(d.name);
        if (a) Object.assign(a, d); else S.actors.push(d);
        break;
      }
      case 'actor_update': {
        var b = findActor(d.actor);
        if (!b) {
          b = { name: d.actor, role: d.actor, devices: [], status: 'idle', current_work: null,
                queue_depth: 0, items_per_sec: 0, last_heartbeat_unix_ms: 0, restarts: 0 };
          S.actors.push(b);
        }
        b.last_heartbeat_unix_ms = Math.max(b.last_heartbeat_unix_ms || 0, d.unix_ms || 0);
        if (d.status != null) { b.status = d.status; b.current_work = d.current_work; }
        if (d.queue_depth != null) b.queue_depth = d.queue_depth;
        if (d.items_per_sec != null) b.items_per_sec = d.items_per_sec;
        if (d.restarted) b.restarts = (b.restarts || 0) + 1;
        break;
      }
      case 'span': {
        var max = S.maxSpanStep === null ? d.step : Math.max(S.maxSpanStep, d.step);
        var keepFrom = max + 1 - S.limits.span_steps;
        if (d.step < keepFrom) break;
        if (max !== S.maxSpanStep) {
          S.maxSpanStep = max;
          S.spans = S.spans.filter(function (s) { return s.step >= keepFrom; });
        }
        S.spans.push(d);
        if (S.spans.length > S.limits.max_spans) S.spans.splice(0, S.spans.length - S.limits.max_spans);
        break;
      }
      case 'metrics': {
        var lo = 0, hi = S.metrics.length;
        while (lo < hi) { var mid = (lo + hi) >> 1; if (S.metrics[mid].step < d.step) lo = mid + 1; else hi = mid; }
        if (lo < S.metrics.length && S.metrics[lo].step === d.step) {
          var m = S.metrics[lo];
          for (var k in d) if (Object.prototype.hasOwnProperty.call(d, k)) {
            if (k === 'unix_ms') m.unix_ms = Math.max(m.unix_ms || 0, d.unix_ms || 0); else m[k] = d[k];
          }
        } else {
          S.metrics.splice(lo, 0, d);
        }
        if (S.metrics.length > S.limits.metric_steps) S.metrics.splice(0, S.metrics.length - S.limits.metric_steps);
        break;
      }
      case 'checkpoint': {
        var found = false;
        for (var c = 0; c < S.checkpoints.length; c++) {
          if (S.checkpoints[c].step === d.step) { S.checkpoints[c] = d; found = true; }
        }
        if (!found) { S.checkpoints.push(d); S.checkpoints.sort(function (x, y) { return x.step - y.step; }); }
        break;
      }
      case 'samples': {
        if (!S.samples || d.step >= S.samples.step) S.samples = d;
        break;
      }
      default: return; // an event type from a newer server: ignore
    }
    if (S.mode === 'live') { S.serverNow = Date.now() - S.clientAt + S.serverNow; S.clientAt = Date.now(); }
    scheduleRender();
  }

  // ---------------------------------------------------------------- helpers
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text != null) e.textContent = text;
    return e;
  }
  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVG_NS, tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text != null) e.textContent = text;
    return e;
  }
  function isNum(v) { return typeof v === 'number' && isFinite(v); }
  function fmt(v) {
    if (!isNum(v)) return '–';
    var a = Math.abs(v);
    if (a === 0) return '0';
    if (a >= 1e6) return (v / 1e6).toFixed(2) + 'M';
    if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    if (a >= 100) return v.toFixed(1);
    if (a >= 1e-3) return String(+v.toPrecision(4));
    return v.toExponential(2);
  }
  // axis labels: as many decimals as the tick spacing needs
  function fmtTick(v, step) {
    if (Math.abs(v) < step * 1e-6) return '0';
    var a = Math.abs(v), unit = '', scale = 1;
    if (a >= 1e6) { unit = 'M'; scale = 1e6; } else if (a >= 1e4) { unit = 'k'; scale = 1e3; }
    if (!unit && step < 1e-3) return v.toExponential(1);
    var decimals = Math.max(0, -Math.floor(Math.log10(step / scale) + 1e-9));
    return (v / scale).toFixed(decimals) + unit;
  }
  function fmtDuration(ms) {
    if (!(ms >= 0)) return '–';
    var s = Math.floor(ms / 1000);
    if (s < 60) return s + 's';
    var m = Math.floor(s / 60); s %= 60;
    if (m < 60) return m + 'm ' + (s < 10 ? '0' : '') + s + 's';
    var h = Math.floor(m / 60); m %= 60;
    return h + 'h ' + (m < 10 ? '0' : '') + m + 'm';
  }
  function fmtAge(ms) {
    if (!(ms >= 0)) return '–';
    if (ms < 1000) return 'now';
    return fmtDuration(ms) + ' ago';
  }
  function fmtTime(unixMs) {
    if (!unixMs) return '–';
    var d = new Date(unixMs);
    return d.toLocaleString(undefined, { hour12: false });
  }

  var PHASE_COLORS = {
    generate: '#60a5fa', reference_logprobs: '#a78bfa', reward: '#f472b6', values: '#2dd4bf',
    advantages: '#facc15', policy_train: '#fb923c', critic_train: '#34d399', refit: '#38bdf8',
    checkpoint: '#e5e7eb'
  };
  function phaseColor(p) {
    if (PHASE_COLORS[p]) return PHASE_COLORS[p];
    var h = 0;
    for (var i = 0; i < p.length; i++) h = (h * 31 + p.charCodeAt(i)) >>> 0;
    return 'hsl(' + (h % 360) + ',65%,62%)';
  }

  // ---------------------------------------------------------------- header
  function renderHeader() {
    var run = S.run, fin = S.finished;
    document.getElementById('run-name').textContent = run && run.name ? run.name : 'waiting for a run…';
    var sub = run && run.started_unix_ms ? 'started ' + fmtTime(run.started_unix_ms) : '';
    if (fin) {
      sub += (sub ? ' · ' : '') + fin.outcome + ' after ' + fin.steps_completed + ' steps';
      if (fin.message) sub += ': ' + fin.message.split('\n')[0];
    }
    var subEl = document.getElementById('run-started');
    subEl.textContent = sub;
    subEl.title = fin && fin.message ? fin.message : '';
    var state;
    if (fin) state = fin.outcome;
    else if (S.mode === 'replay' || (S.mode === 'live' && !S.monitorRunning)) state = run ? 'incomplete' : 'waiting';
    else state = run || S.actors.length ? 'running' : 'waiting';
    var pill = document.getElementById('run-status');
    pill.setAttribute('data-state', state);
    pill.textContent = state;
    pill.title = fin && fin.message ? fin.message : '';
    var last = S.metrics.length ? S.metrics[S.metrics.length - 1].step : null;
    document.getElementById('run-step').textContent = last === null ? '–' : String(last);
    var start = run ? run.started_unix_ms : 0;
    var end = fin ? fin.finished_unix_ms : nowMs();
    document.getElementById('run-elapsed').textContent = start ? fmtDuration(end - start) : '–';
    document.getElementById('run-ckpts').textContent = String(S.checkpoints.length);
    document.getElementById('source-mode').textContent = S.mode || '–';
    document.title = (run && run.name ? run.name + ' · ' : '') + (last === null ? '' : 'step ' + last + ' · ') + 'oxalign';
  }

  function setConn(state, text) {
    var c = document.getElementById('conn');
    c.setAttribute('data-state', state);
    document.getElementById('conn-text').textContent = text || state;
  }

  // ---------------------------------------------------------------- actors
  var ROLE_COLUMNS = [['controller'], ['policy'], ['reference', 'reward', 'critic']];
  var ARROW_LABELS = ['prompts', 'rollouts'];

  function columnOf(role) {
    for (var i = 0; i < ROLE_COLUMNS.length; i++) if (ROLE_COLUMNS[i].indexOf(role) >= 0) return i;
    return ROLE_COLUMNS.length; // any other role: last column
  }

  function actorCard(a) {
    var card = el('div', { 'class': 'actor-card' });
    var head = el('div', { 'class': 'card-head' });
    head.appendChild(el('span', { 'class': 'dot' }));
    head.appendChild(el('span', { 'class': 'actor-name' }));
    head.appendChild(el('span', { 'class': 'actor-status' }));
    card.appendChild(head);
    card.appendChild(el('div', { 'class': 'actor-role' }));
    card.appendChild(el('div', { 'class': 'actor-work' }));
    var stats = el('dl', { 'class': 'actor-stats' });
    [['queue', 'actor-queue'], ['items/s', 'actor-rate'], ['heartbeat', 'actor-heartbeat'], ['restarts', 'actor-restarts']]
      .forEach(function (p) {
        var d = el('div');
        d.appendChild(el('dt', null, p[0]));
        d.appendChild(el('dd', { 'class': p[1] }));
        stats.appendChild(d);
      });
    card.appendChild(stats);
    return card;
  }

  function fillCard(card, a) {
    card.setAttribute('data-actor', a.name);
    card.setAttribute('data-role', a.role);
    card.setAttribute('data-status', a.status);
    card.querySelector('.actor-name').textContent = a.name;
    card.querySelector('.actor-status').textContent = a.status;
    var devs = a.devices && a.devices.length ? a.devices.join(', ') : 'no devices';
    card.querySelector('.actor-role').textContent = a.role + ' · ' + devs;
    card.querySelector('.actor-role').title = a.role + ' on ' + devs;
    var work = card.querySelector('.actor-work');
    work.textContent = a.current_work || '';
    work.title = a.current_work || '';
    card.querySelector('.actor-queue').textContent = String(a.queue_depth || 0);
    card.querySelector('.actor-rate').textContent = fmt(a.items_per_sec || 0);
    var r = card.querySelector('.actor-restarts');
    r.textContent = String(a.restarts || 0);
    r.classList.toggle('nonzero', (a.restarts || 0) > 0);
    updateAge(card, a);
  }

  function updateAge(card, a) {
    var hb = card.querySelector('.actor-heartbeat');
    if (!a.last_heartbeat_unix_ms) { hb.textContent = '–'; card.classList.remove('stale'); return; }
    var age = nowMs() - a.last_heartbeat_unix_ms;
    hb.textContent = fmtAge(age);
    hb.title = fmtTime(a.last_heartbeat_unix_ms);
    var live = S.mode === 'live' && S.monitorRunning && !S.finished;
    card.classList.toggle('stale', live && a.status === 'working' && age > STALE_MS);
  }

  var actorLayoutKey = '';
  function renderActors() {
    var root = document.getElementById('actors');
    var ncols = ROLE_COLUMNS.length + 1;
    var cols = [];
    for (var i = 0; i < ncols; i++) cols.push([]);
    S.actors.forEach(function (a) { cols[columnOf(a.role)].push(a); });
    // sort each column by the order of roles in ROLE_COLUMNS, then by name
    cols.forEach(function (list, ci) {
      var order = ROLE_COLUMNS[ci] || [];
      list.sort(function (x, y) {
        var dx = order.indexOf(x.role), dy = order.indexOf(y.role);
        return dx !== dy ? dx - dy : (x.name < y.name ? -1 : x.name > y.name ? 1 : 0);
      });
    });
    var key = cols.map(function (l) { return l.map(function (a) { return a.name; }).join(','); }).join('|');
    if (key !== actorLayoutKey) {
      actorLayoutKey = key;
      root.textContent = '';
      if (!S.actors.length) {
        root.appendChild(el('p', { 'class': 'empty' }, 'No actor has reported yet.'));
      }
      var shown = 0;
      cols.forEach(function (list, ci) {
        if (!list.length) return;
        if (shown > 0) {
          var arrow = el('div', { 'class': 'topo-arrow' });
          var s = svg('svg', { viewBox: '0 0 64 18' });
          s.appendChild(svg('path', { d: 'M2 9 H58 M50 3 L60 9 L50 15', fill: 'none', stroke: '#8593a6', 'stroke-width': '2' }));
          arrow.appendChild(s);
          arrow.appendChild(el('span', null, ARROW_LABELS[ci - 1] || ''));
          root.appendChild(arrow);
        }
        shown++;
        var col = el('div', { 'class': 'topo-col', 'data-column': String(ci) });
        list.forEach(function (a) { col.appendChild(actorCard(a)); });
        root.appendChild(col);
      });
    }
    root.setAttribute('data-count', String(S.actors.length));
    var cards = root.querySelectorAll('.actor-card');
    var flat = [];
    cols.forEach(function (l) { flat = flat.concat(l); });
    for (var j = 0; j < cards.length && j < flat.length; j++) fillCard(cards[j], flat[j]);
  }

  function tickAges() {
    var cards = document.querySelectorAll('.actor-card');
    for (var i = 0; i < cards.length; i++) {
      var a = findActor(cards[i].getAttribute('data-actor'));
      if (a) updateAge(cards[i], a);
    }
    renderHeader();
  }

  // ---------------------------------------------------------------- charts
  // RL runs chart reward, KL, entropy and throughput; SFT, reward-model and DPO runs their
  // loss, accuracy and margins (eval_* every eval_every steps). A chart none of whose
  // series the run reports is hidden once metrics arrive.
  var CHARTS = [
    { id: 'reward', title: 'Reward', unit: '', series: [{ key: 'reward_mean', label: 'mean ± std', color: '#7aa2f7', band: 'reward_std' }] },
    // Held-out accuracy is measured every rl.eval_every steps: its points join across the
    // steps between (sparse), where a missing value elsewhere is a gap.
    { id: 'accuracy', title: 'Accuracy', unit: '', series: [
      { key: 'heldout_greedy', label: 'held-out greedy', color: '#9ece6a', sparse: true },
      { key: 'heldout_sampled', label: 'held-out sampled', color: '#e0af68', sparse: true },
      { key: 'eval_accuracy', label: 'held-out', color: '#9ece6a', sparse: true },
      { key: 'accuracy', label: 'training', color: '#7dcfff' }] },
    { id: 'kl', title: 'KL (policy ‖ reference)', unit: 'nats', series: [{ key: 'kl', label: 'kl', color: '#bb9af7' }] },
    { id: 'loss', title: 'Losses', unit: '', series: [
      { key: 'loss', label: 'training', color: '#ff9e64' },
      { key: 'eval_loss', label: 'held-out', color: '#9ece6a', sparse: true },
      { key: 'policy_loss', label: 'policy', color: '#ff9e64' }, { key: 'value_loss', label: 'value', color: '#2ac3de' }] },
    { id: 'margin', title: 'Reward margin (chosen − rejected)', unit: '', series: [
      { key: 'margin', label: 'training', color: '#7aa2f7' },
      { key: 'eval_margin', label: 'held-out', color: '#9ece6a', sparse: true },
      { key: 'chosen_reward', label: 'chosen', color: '#73daca' },
      { key: 'rejected_reward', label: 'rejected', color: '#f7768e' }] },
    // Multi-turn episodes ([env]): turns and tool calls per episode, and the episodes that
    // failed (timed out, environment failed) or were cut by a limit.
    { id: 'episodes', title: 'Episodes', unit: 'per episode', series: [
      { key: 'episode_turns_mean', label: 'turns', color: '#7aa2f7' },
      { key: 'episode_tool_calls_mean', label: 'tool calls', color: '#9ece6a' }] },
    { id: 'episode-failures', title: 'Episode failures', unit: 'episodes', series: [
      { key: 'episode_timed_out', label: 'timed out', color: '#f7768e' },
      { key: 'episode_env_failed', label: 'environment failed', color: '#ff9e64' },
      { key: 'episode_tool_errors', label: 'tool errors', color: '#e0af68' },
      { key: 'episode_cut', label: 'cut by a limit', color: '#c0caf5' }] },
    { id: 'tool-latency', title: 'Environment latency', unit: 's per episode', series: [
      { key: 'episode_env_seconds_mean', label: 'waiting on the environment', color: '#2ac3de' }] },
    { id: 'entropy', title: 'Entropy', unit: 'nats', series: [{ key: 'entropy', label: 'entropy', color: '#9ece6a' }] },
    { id: 'gradnorm', title: 'Gradient norm', unit: '', series: [{ key: 'grad_norm', label: 'before clipping', color: '#e0af68' }] },
    { id: 'lr', title: 'Learning rate', unit: '', series: [{ key: 'lr', label: 'lr', color: '#c0caf5' }] },
    { id: 'tokens', title: 'Throughput', unit: 'tokens/s', series: [{ key: 'tokens_per_sec', label: 'tokens/s', color: '#e0af68' }] },
    { id: 'steptime', title: 'Step time', unit: 's', timePrefix: 'time_',
      series: [{ key: 'step_seconds', label: 'step', color: '#c0caf5' }] }
  ];
  var W = 480, H = 180, ML = 50, MR = 12, MT = 10, MB = 24;

  function niceStep(range, count) {
    var raw = range / Math.max(1, count);
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var f = raw / p;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
  }

  function seriesFor(spec) {
    var list = spec.series.slice();
    if (spec.timePrefix) {
      var seen = {};
      S.metrics.forEach(function (m) {
        for (var k in m) if (k.indexOf(spec.timePrefix) === 0 && !seen[k]) seen[k] = true;
      });
      Object.keys(seen).sort().forEach(function (k) {
        var ph = k.slice(spec.timePrefix.length);
        list.push({ key: k, label: ph, color: phaseColor(ph) });
      });
    }
    return list.map(function (s) {
      var pts = [];
      S.metrics.forEach(function (m) {
        var y = m[s.key];
        if (isNum(y)) {
          var p = { x: m.step, y: y };
          if (s.band && isNum(m[s.band])) { p.lo = y - m[s.band]; p.hi = y + m[s.band]; }
          pts.push(p);
        } else if (!s.sparse && pts.length && pts[pts.length - 1] !== null) {
          pts.push(null); // a gap: missing or non-finite value
        }
      });
      while (pts.length && pts[pts.length - 1] === null) pts.pop();
      return { spec: s, points: pts, count: pts.filter(function (p) { return p; }).length };
    });
  }

  function thin(points) {
    if (points.length <= MAX_CHART_POINTS) return points;
    var stride = Math.ceil(points.length / MAX_CHART_POINTS), out = [];
    for (var i = 0; i < points.length; i++) {
      if (points[i] === null || i % stride === 0 || i === points.length - 1) out.push(points[i]);
    }
    return out;
  }

  function ensureChart(spec) {
    var fig = document.getElementById('chart-' + spec.id);
    if (fig) return fig;
    fig = el('figure', { 'class': 'chart', id: 'chart-' + spec.id, 'data-metric': spec.series[0].key, 'data-points': '0' });
    var cap = el('figcaption');
    var t = el('span');
    t.appendChild(el('b', null, spec.title));
    if (spec.unit) t.appendChild(document.createTextNode(' ' + spec.unit));
    cap.appendChild(t);
    cap.appendChild(el('span', { 'class': 'last' }));
    fig.appendChild(cap);
    fig.appendChild(svg('svg', { viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none' }));
    fig.appendChild(el('div', { 'class': 'chart-legend' }));
    document.getElementById('charts').appendChild(fig);
    return fig;
  }

  function renderChart(spec) {
    var fig = ensureChart(spec);
    var all = seriesFor(spec);
    // the chart's headline series: the first one the run reports
    var main = all.filter(function (s) { return s.count; })[0] || all[0];
    var total = all.reduce(function (n, s) { return n + s.count; }, 0);
    fig.setAttribute('data-points', String(main.count));
    fig.setAttribute('data-metric', main.spec.key);
    fig.hidden = S.metrics.length > 0 && total === 0;
    var root = fig.querySelector('svg');
    root.textContent = '';
    var xs = [], ys = [];
    all.forEach(function (s) {
      s.points.forEach(function (p) {
        if (!p) return;
        xs.push(p.x); ys.push(p.y);
        if (isNum(p.lo)) { ys.push(p.lo); ys.push(p.hi); }
      });
    });
    var legend = fig.querySelector('.chart-legend');
    legend.textContent = '';
    all.forEach(function (s) {
      if (!s.count && all.length > 1) return;
      var item = el('span');
      var sw = el('i'); sw.style.background = s.spec.color;
      item.appendChild(sw);
      item.appendChild(document.createTextNode(s.spec.label));
      legend.appendChild(item);
    });
    var lastText = fig.querySelector('.last');
    var lastPt = null;
    for (var i = main.points.length - 1; i >= 0; i--) if (main.points[i]) { lastPt = main.points[i]; break; }
    lastText.textContent = lastPt ? fmt(lastPt.y) + (isNum(lastPt.hi) ? ' ± ' + fmt(lastPt.hi - lastPt.y) : '') : '';
    if (!xs.length) {
      root.appendChild(svg('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', 'class': 'nodata' }, 'waiting for data…'));
      return;
    }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { var pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
    var yp = (y1 - y0) * 0.06; y0 -= yp; y1 += yp;
    function px(x) { return ML + (x - x0) / (x1 - x0) * (W - ML - MR); }
    function py(y) { return MT + (y1 - y) / (y1 - y0) * (H - MT - MB); }

    var g = svg('g');
    var ystep = niceStep(y1 - y0, 4);
    for (var v = Math.ceil(y0 / ystep) * ystep; v <= y1 + 1e-12; v += ystep) {
      var yy = py(v);
      g.appendChild(svg('line', { x1: ML, x2: W - MR, y1: yy, y2: yy, 'class': 'grid' }));
      g.appendChild(svg('text', { x: ML - 6, y: yy + 3, 'text-anchor': 'end', 'class': 'axis' }, fmtTick(v, ystep)));
    }
    var xstep = Math.max(1, niceStep(x1 - x0, 6));
    for (var xv = Math.ceil(x0 / xstep) * xstep; xv <= x1; xv += xstep) {
      g.appendChild(svg('text', { x: px(xv), y: H - 7, 'text-anchor': 'middle', 'class': 'axis' }, String(Math.round(xv))));
    }
    root.appendChild(g);

    all.forEach(function (s) {
      var pts = thin(s.points);
      // std band
      var seg = [];
      function flushBand() {
        if (seg.length > 1) {
          var d = seg.map(function (p, k) { return (k ? 'L' : 'M') + px(p.x).toFixed(1) + ' ' + py(p.hi).toFixed(1); }).join('');
          for (var k = seg.length - 1; k >= 0; k--) d += 'L' + px(seg[k].x).toFixed(1) + ' ' + py(seg[k].lo).toFixed(1);
          root.appendChild(svg('path', { d: d + 'Z', fill: s.spec.color, 'fill-opacity': '0.18', stroke: 'none', 'class': 'band' }));
        }
        seg = [];
      }
      pts.forEach(function (p) { if (p && isNum(p.lo)) seg.push(p); else flushBand(); });
      flushBand();
      // line, broken at gaps
      var d = '', pen = false, single = [];
      pts.forEach(function (p, k) {
        if (!p) { pen = false; return; }
        d += (pen ? 'L' : 'M') + px(p.x).toFixed(1) + ' ' + py(p.y).toFixed(1);
        var prev = pts[k - 1], next = pts[k + 1];
        if (!prev && !next) single.push(p);
        pen = true;
      });
      root.appendChild(svg('path', { d: d, fill: 'none', stroke: s.spec.color, 'stroke-width': '1.8', 'class': 'line', 'data-key': s.spec.key }));
      // isolated points (a single step, or between gaps) would be invisible as lines
      single.forEach(function (p) {
        root.appendChild(svg('circle', { cx: px(p.x), cy: py(p.y), r: 3, fill: s.spec.color, 'class': 'point' }));
      });
    });

    // hover read-out
    var hover = svg('g', { 'class': 'hover', visibility: 'hidden' });
    var vline = svg('line', { y1: MT, y2: H - MB, 'class': 'hover-line' });
    var tip = svg('g', { 'class': 'tip' });
    var tipBox = svg('rect', { rx: 3, ry: 3 });
    var tipText = svg('text');
    tip.appendChild(tipBox); tip.appendChild(tipText);
    hover.appendChild(vline); hover.appendChild(tip);
    root.appendChild(hover);
    var overlay = svg('rect', { x: ML, y: MT, width: W - ML - MR, height: H - MT - MB, fill: 'transparent' });
    root.appendChild(overlay);
    overlay.addEventListener('mouseleave', function () { hover.setAttribute('visibility', 'hidden'); });
    overlay.addEventListener('mousemove', function (e) {
      var box = root.getBoundingClientRect();
      var sx = (e.clientX - box.left) / box.width * W;
      var step = Math.round(x0 + (sx - ML) / (W - ML - MR) * (x1 - x0));
      var lines = ['step ' + step];
      all.forEach(function (s) {
        for (var k = 0; k < s.points.length; k++) {
          var p = s.points[k];
          if (p && p.x === step) { lines.push(s.spec.label + ' ' + fmt(p.y) + (isNum(p.hi) ? ' ± ' + fmt(p.hi - p.y) : '')); break; }
        }
      });
      var hx = px(step);
      vline.setAttribute('x1', hx); vline.setAttribute('x2', hx);
      tipText.textContent = '';
      lines.forEach(function (t, k) { tipText.appendChild(svg('tspan', { x: 6, dy: 12 }, t)); });
      var tw = 8 + 6.2 * Math.max.apply(null, lines.map(function (t) { return t.length; }));
      var th = 6 + 12 * lines.length;
      tipBox.setAttribute('width', tw); tipBox.setAttribute('height', th);
      var tx = hx + 8 + tw > W ? hx - 8 - tw : hx + 8;
      tip.setAttribute('transform', 'translate(' + tx + ',' + (MT + 2) + ')');
      hover.setAttribute('visibility', 'visible');
    });
  }

  function renderCharts() {
    CHARTS.forEach(renderChart);
    var n = S.metrics.length;
    document.getElementById('metrics-sub').textContent = n ? n + ' steps' + (n >= S.limits.metric_steps ? ' (latest kept)' : '') : '';
    var body = document.querySelector('#latest-metrics tbody');
    body.textContent = '';
    var last = n ? S.metrics[n - 1] : null;
    if (last) {
      Object.keys(last).filter(function (k) { return k !== 'step' && k !== 'unix_ms'; }).sort().forEach(function (k) {
        var tr = el('tr', { 'data-metric': k });
        tr.appendChild(el('td', null, k));
        tr.appendChild(el('td', null, last[k] === null ? 'NaN' : fmt(last[k])));
        body.appendChild(tr);
      });
    }
  }

  // ---------------------------------------------------------------- timeline
  function renderTimeline() {
    var root = document.getElementById('timeline');
    root.textContent = '';
    var steps = [];
    S.spans.forEach(function (s) { if (steps.indexOf(s.step) < 0) steps.push(s.step); });
    steps.sort(function (a, b) { return a - b; });
    steps = steps.slice(-TIMELINE_STEPS);
    var spans = S.spans.filter(function (s) { return steps.indexOf(s.step) >= 0; });
    var lanes = S.actors.map(function (a) { return a.name; });
    spans.forEach(function (s) { if (lanes.indexOf(s.actor) < 0) lanes.push(s.actor); });
    var TW = 1200, LABEL = 120, LANE = 26, TOP = 22, BOTTOM = 22;
    var height = TOP + Math.max(1, lanes.length) * LANE + BOTTOM;
    root.setAttribute('viewBox', '0 0 ' + TW + ' ' + height);
    root.setAttribute('data-spans', String(spans.length));
    root.setAttribute('data-lanes', String(lanes.length));
    var legend = document.getElementById('phase-legend');
    legend.textContent = '';
    if (!spans.length) {
      root.appendChild(svg('text', { x: TW / 2, y: height / 2 + 4, 'text-anchor': 'middle', 'class': 'nodata' }, 'no spans yet'));
      document.getElementById('timeline-range').textContent = 'last steps, one lane per actor';
      return;
    }
    var t0 = Infinity, t1 = -Infinity;
    spans.forEach(function (s) { t0 = Math.min(t0, s.start_unix_ms); t1 = Math.max(t1, s.end_unix_ms); });
    if (t1 <= t0) t1 = t0 + 1;
    function tx(t) { return LABEL + (t - t0) / (t1 - t0) * (TW - LABEL - 10); }
    lanes.forEach(function (name, i) {
      var y = TOP + i * LANE;
      root.appendChild(svg('rect', { x: LABEL, y: y + 2, width: TW - LABEL - 10, height: LANE - 4, 'class': 'lane-bg' }));
      root.appendChild(svg('text', { x: LABEL - 8, y: y + LANE / 2 + 4, 'text-anchor': 'end', 'class': 'lane-label' }, name));
    });
    // step boundaries: where each step's first span starts
    steps.forEach(function (st) {
      var first = Infinity;
      spans.forEach(function (s) { if (s.step === st) first = Math.min(first, s.start_unix_ms); });
      var x = tx(first);
      root.appendChild(svg('line', { x1: x, x2: x, y1: TOP - 4, y2: TOP + lanes.length * LANE, 'class': 'step-line' }));
      // keep the label inside the chart when the step starts near the right edge
      var nearEnd = x > TW - 70;
      root.appendChild(svg('text', { x: nearEnd ? x - 3 : x + 3, y: TOP - 8, 'text-anchor': nearEnd ? 'end' : 'start',
        'class': 'step-label' }, 'step ' + st));
    });
    var phases = [];
    spans.forEach(function (s) {
      var lane = lanes.indexOf(s.actor);
      var x = tx(s.start_unix_ms), w = Math.max(1.5, tx(s.end_unix_ms) - x);
      var r = svg('rect', { x: x, y: TOP + lane * LANE + 4, width: w, height: LANE - 8, fill: phaseColor(s.phase),
        'class': 'span', 'data-phase': s.phase, 'data-actor': s.actor, 'data-step': String(s.step) });
      r.appendChild(svg('title', null, s.actor + ' · ' + s.phase + ' · step ' + s.step + ' · ' +
        ((s.end_unix_ms - s.start_unix_ms) / 1000).toFixed(3) + ' s'));
      root.appendChild(r);
      if (phases.indexOf(s.phase) < 0) phases.push(s.phase);
    });
    // time axis, seconds from the first span shown
    var total = (t1 - t0) / 1000, tick = niceStep(total, 8);
    for (var t = 0; t <= total + 1e-9; t += tick) {
      var x = tx(t0 + t * 1000);
      root.appendChild(svg('text', { x: x, y: height - 6, 'text-anchor': 'middle', 'class': 'axis' },
        (tick < 1 ? t.toFixed(tick < 0.1 ? 2 : 1) : t.toFixed(0)) + 's'));
    }
    phases.forEach(function (p) {
      var item = el('span', { 'data-phase': p });
      var sw = el('i'); sw.style.background = phaseColor(p);
      item.appendChild(sw);
      item.appendChild(document.createTextNode(p));
      legend.appendChild(item);
    });
    document.getElementById('timeline-range').textContent = steps.length === 1 ? 'step ' + steps[0] :
      'steps ' + steps[0] + '–' + steps[steps.length - 1] + ' · ' + total.toFixed(1) + ' s';
  }

  // ---------------------------------------------------------------- checkpoints, recipe
  function renderCheckpoints() {
    var table = document.getElementById('checkpoints');
    var body = table.querySelector('tbody');
    body.textContent = '';
    S.checkpoints.slice().reverse().forEach(function (c) {
      var tr = el('tr', { 'data-step': String(c.step) });
      tr.appendChild(el('td', null, String(c.step)));
      tr.appendChild(el('td', null, fmtTime(c.unix_ms)));
      tr.appendChild(el('td', { 'class': 'path' }, c.path));
      body.appendChild(tr);
    });
    table.setAttribute('data-count', String(S.checkpoints.length));
    document.getElementById('checkpoints-empty').hidden = S.checkpoints.length > 0;
  }

  // ---------------------------------------------------------------- samples
  function renderSamples() {
    var table = document.getElementById('samples');
    var body = table.querySelector('tbody');
    body.textContent = '';
    var rows = S.samples ? S.samples.samples : [];
    rows.forEach(function (r) {
      var tr = el('tr', { 'data-step': String(r.step) });
      tr.appendChild(el('td', { 'class': 'sample-text' }, r.prompt));
      var done = r.completion + (r.finish_reason === 'length' ? ' …' : '');
      tr.appendChild(el('td', { 'class': 'sample-text', 'title': r.answer == null ? '' : 'answer: ' + r.answer }, done));
      tr.appendChild(el('td', null, typeof r.reward === 'number' ? r.reward.toFixed(3) : String(r.reward)));
      body.appendChild(tr);
    });
    table.setAttribute('data-count', String(rows.length));
    document.getElementById('samples-sub').textContent = S.samples ? 'step ' + S.samples.step : '';
    document.getElementById('samples-empty').hidden = rows.length > 0;
  }

  var shownRecipe = null;
  function renderRecipe() {
    var text = S.run ? S.run.recipe_toml : null;
    if (text === shownRecipe) return;
    shownRecipe = text;
    var pre = document.getElementById('recipe');
    pre.textContent = '';
    if (!text) { pre.textContent = S.run ? '(the run reported no recipe)' : '(no recipe reported yet)'; return; }
    text.split('\n').forEach(function (line, i) {
      if (i) pre.appendChild(document.createTextNode('\n'));
      var t = line.trim();
      if (t.charAt(0) === '#') { pre.appendChild(el('span', { 'class': 't-comment' }, line)); return; }
      if (t.charAt(0) === '[') { pre.appendChild(el('span', { 'class': 't-section' }, line)); return; }
      var eq = line.indexOf('=');
      if (eq > 0) {
        pre.appendChild(el('span', { 'class': 't-key' }, line.slice(0, eq)));
        pre.appendChild(document.createTextNode(line.slice(eq)));
      } else {
        pre.appendChild(document.createTextNode(line));
      }
    });
  }

  // ---------------------------------------------------------------- render loop
  var renderPending = false;
  function render() {
    renderPending = false;
    renderHeader();
    renderActors();
    renderCharts();
    renderTimeline();
    renderCheckpoints();
    renderSamples();
    renderRecipe();
    document.body.setAttribute('data-rendered', String(S.metrics.length));
  }
  function scheduleRender() {
    if (renderPending) return;
    renderPending = true;
    setTimeout(render, 60); // coalesce bursts of events into one redraw
  }

  // ---------------------------------------------------------------- transport
  var source = null, retryMs = 1000, retryTimer = null;

  function connect() {
    if (source) source.close();
    setConn('connecting');
    source = new EventSource(withToken('/api/events'));
    source.addEventListener('snapshot', function (e) { retryMs = 1000; loadSnapshot(JSON.parse(e.data)); });
    source.addEventListener('monitor', function (e) { applyEvent(JSON.parse(e.data)); });
    source.addEventListener('end', function (e) {
      source.close(); source = null;
      S.monitorRunning = false;
      setConn(e.data === 'replay' ? 'replay' : 'ended', e.data === 'replay' ? 'replay' : 'run ended');
      scheduleRender();
    });
    source.onopen = function () { setConn('live', 'live'); };
    source.onerror = function () {
      if (!source) return;
      if (source.readyState === EventSource.CLOSED) {
        // the browser gave up (e.g. HTTP error): retry ourselves, backing off
        source = null;
        setConn('offline', 'offline, retrying in ' + Math.round(retryMs / 1000) + 's');
        clearTimeout(retryTimer);
        retryTimer = setTimeout(connect, retryMs);
        retryMs = Math.min(retryMs * 2, 15000);
      } else {
        setConn('reconnecting', 'reconnecting');
      }
    };
  }

  function start() {
    document.getElementById('metrics-link').setAttribute('href', withToken('/metrics'));
    var headers = TOKEN ? { Authorization: 'Bearer ' + TOKEN } : {};
    fetch(withToken('/api/state'), { cache: 'no-store', headers: headers })
      .then(function (r) {
        if (!r.ok) throw new Error('HTTP ' + r.status + (r.status === 401 ? ' (token missing or wrong)' : ''));
        return r.json();
      })
      .then(function (v) {
        loadSnapshot(v);
        render();
        if (v.mode === 'live' && v.monitor_running) connect();
        else setConn(v.mode === 'replay' ? 'replay' : 'ended', v.mode === 'replay' ? 'replay' : 'run ended');
      })
      .catch(function (err) {
        setConn('offline', 'offline: ' + err.message);
        clearTimeout(retryTimer);
        retryTimer = setTimeout(start, retryMs);
        retryMs = Math.min(retryMs * 2, 15000);
      });
  }

  render();
  start();
  setInterval(tickAges, 1000);
})();
