// allot live operator page: watches one activity through the server-sent
// events of GET /v1/activities/{activity}/live ("state", "event", "warning",
// "bye"). Plain JavaScript, no build step, no dependencies.
'use strict';

(() => {
  const FEED_MAX = 60;          // rows shown in the event list, and events kept per kind
  const RATE_WINDOW_MS = 5000;  // the event rate averages over this
  const CHART_MAX_POINTS = 1500;
  const CHART_SPAN_MIN_MS = 30 * 1000;
  const CHART_SPAN_MAX_MS = 10 * 60 * 1000;
  const RETRY_MS = 3000;
  const TOKEN_KEY = 'allot.token';
  const KINDS = ['granted', 'confirmed', 'held', 'promoted', 'expired', 'waitlisted', 'cancelled', 'sold_out', 'opened', 'resized'];
  const SVG_NS = 'http://www.w3.org/2000/svg';

  const $ = (id) => document.getElementById(id);
  const fmt = new Intl.NumberFormat('en-US');
  const fmtCompact = new Intl.NumberFormat('en-US', { notation: 'compact', maximumFractionDigits: 1 });

  let es = null;
  let retryTimer = 0;
  let activity = null;      // decimal string: ids go up to 2^63-1, beyond a JS number
  let points = [];          // chart points {t, confirmed, waiting, capacity}
  let recent = new Map();   // kind → its latest events, newest last: a flood of one
                            // kind never pushes the others out of the list
  let serial = 0;           // events received since the page picked the activity
  let renderedSerial = 0;
  let counts = new Map();   // kind → events received
  // Waitlist joins come by the thousand in a burst and would bury the grants
  // and promotions; the Waiting card and the chart count them. One click on
  // their chip shows them.
  const hiddenKinds = new Set(['waitlisted']);
  let arrivals = [];        // performance.now() of each event within the rate window
  let connectedAt = 0;
  let renderTimer = 0;
  let clockOffset = 0;      // browser clock minus server clock, from the states
  let holdsShown = false;   // the Held card is shown: the activity has a hold
  let holdText = '';        // the activity's hold, e.g. "2m0s"

  // ---- helpers -------------------------------------------------------------

  function parseActivity(s) {
    s = String(s || '').trim();
    if (!/^[0-9]{1,19}$/.test(s)) return null;
    const b = BigInt(s);
    if (b < 1n || b > 9223372036854775807n) return null;
    return b.toString();
  }

  function setNumber(id, v) {
    const el = $(id);
    el.textContent = v == null ? '–' : fmt.format(v);
    el.dataset.value = v == null ? '' : String(v);
  }

  function parseTime(s) {
    // RFC 3339 with nanoseconds: keep milliseconds, which Date understands.
    return Date.parse(String(s).replace(/(\.\d{3})\d+/, '$1'));
  }

  function clock(ms, withMillis) {
    const d = new Date(ms);
    const p = (n, w) => String(n).padStart(w || 2, '0');
    const s = p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds());
    return withMillis ? s + '.' + p(d.getMilliseconds(), 3) : s;
  }

  function setStatus(kind, text) {
    const el = $('status');
    el.className = 'status ' + kind;
    el.textContent = text;
    document.body.dataset.stream = kind;
  }

  function showBanner(text, kind) {
    const el = $('banner');
    el.textContent = text;
    el.className = 'banner' + (kind === 'info' ? ' info' : '');
    el.hidden = false;
  }

  function hideBanner() { $('banner').hidden = true; }

  // ---- connection ----------------------------------------------------------

  function watch(a) {
    stop();
    activity = a;
    points = []; recent = new Map(); counts = new Map(); arrivals = [];
    serial = 0; renderedSerial = 0; connectedAt = 0;
    document.body.dataset.events = '0';
    document.body.dataset.skipped = '0';
    for (const id of ['capacity', 'confirmed', 'held', 'waiting', 'remaining', 'lag']) setNumber(id, null);
    showHolds(false, '');
    $('rate').textContent = '–';
    $('activity-input').value = a;
    history.replaceState(null, '', '?activity=' + a);
    document.title = 'allot · activity ' + a;
    hideBanner();
    renderFeed();
    drawChart();
    connect();
  }

  function stop() {
    clearTimeout(retryTimer);
    if (es) { es.close(); es = null; }
  }

  function connect() {
    setStatus('connecting', 'connecting…');
    // EventSource cannot send an Authorization header, so the token (kept
    // for this tab only, in sessionStorage) rides in ?access_token=, which
    // ingest accepts on the live feed only.
    let url = '/v1/activities/' + activity + '/live';
    const tok = sessionStorage.getItem(TOKEN_KEY);
    if (tok) url += '?access_token=' + encodeURIComponent(tok);
    const src = new EventSource(url);
    es = src;
    src.addEventListener('state', (m) => { if (es === src) onState(JSON.parse(m.data)); });
    src.addEventListener('event', (m) => { if (es === src) onEvent(m.data); });
    src.addEventListener('warning', (m) => { if (es === src) showBanner(JSON.parse(m.data).warning, 'warn'); });
    src.addEventListener('bye', () => { if (es === src) setStatus('connecting', 'server restarting…'); });
    src.onerror = () => {
      if (es !== src) return;
      if (src.readyState === EventSource.CLOSED) {
        // An HTTP error (401/403: no token or no allot:operator; 503: too
        // many pages, broker or database down): EventSource gives up, so
        // retry by hand.
        setStatus('down', sessionStorage.getItem(TOKEN_KEY) ? 'feed unavailable, retrying' : 'feed unavailable (a token may be required), retrying');
        src.close();
        es = null;
        retryTimer = setTimeout(connect, RETRY_MS);
      } else {
        setStatus('connecting', 'reconnecting…');
      }
    };
  }

  // ---- state ---------------------------------------------------------------

  function onState(st) {
    if (!connectedAt) connectedAt = performance.now();
    setStatus('live', 'live');
    document.body.dataset.skipped = String(st.skipped || 0);
    $('updated').textContent = 'updated ' + clock(parseTime(st.at));
    $('applied-seq').textContent = st.applied_seq ? fmt.format(st.applied_seq) : '–';
    $('stored-seq').textContent = st.stored_seq == null ? 'unknown' : (st.stored_seq ? fmt.format(st.stored_seq) : '–');
    const sk = $('skipped');
    sk.hidden = !st.skipped;
    sk.textContent = st.skipped ? fmt.format(st.skipped) + ' events not shown (this page read too slowly); the numbers stay exact' : '';
    showPartition(st.partition);
    showShards(st.shard, st.shards);

    if (!st.opened) {
      showBanner('Activity ' + activity + ' is not open yet. This page fills in by itself as soon as it opens.', 'info');
      for (const id of ['capacity', 'confirmed', 'held', 'waiting', 'remaining', 'lag']) setNumber(id, null);
      showHolds(false, '');
      $('fill').style.width = '0';
      $('fill-text').textContent = '\u00a0';
      $('sold-out').hidden = true;
      return;
    }
    hideBanner();
    setNumber('capacity', st.capacity);
    setNumber('confirmed', st.confirmed);
    setNumber('waiting', st.waiting);
    setNumber('remaining', st.remaining);
    // The Held card shows for an activity with a hold, and for as long as
    // seats are held (a resize may have dropped the hold meanwhile).
    const held = st.held || 0;
    showHolds(!!st.hold || held > 0 || (counts.get('expired') || 0) > 0, st.hold || '');
    setNumber('held', held);

    const lag = $('lag');
    setNumber('lag', st.lag);
    lag.classList.toggle('ok', st.lag === 0);
    lag.classList.toggle('warn', st.lag > 0);
    $('lag-hint').textContent = st.lag == null ? 'unknown: stream not readable' : st.lag === 0 ? 'caught up' : 'stream messages behind';

    const pct = st.capacity > 0 ? Math.min(100, (100 * st.confirmed) / st.capacity) : 0;
    $('confirmed-hint').textContent = st.capacity > 0 ? pct.toFixed(pct < 10 ? 1 : 0) + '% of capacity' : 'seats taken';
    $('fill').style.width = pct + '%';
    $('fill-text').textContent = fmt.format(st.confirmed) + ' of ' + fmt.format(st.capacity) + ' seats taken · ' +
      (holdsShown ? fmt.format(held) + ' held · ' : '') + fmt.format(st.waiting) + ' waiting';
    $('sold-out').hidden = !(st.capacity > 0 && st.remaining === 0);
    document.title = 'allot · ' + activity + ' · ' + fmt.format(st.confirmed) + '/' + fmt.format(st.capacity);

    const t = parseTime(st.at);
    clockOffset = Date.now() - t;
    const last = points[points.length - 1];
    if (!last || t > last.t) {
      points.push({ t, confirmed: st.confirmed, waiting: st.waiting, capacity: st.capacity });
      if (points.length > CHART_MAX_POINTS) points.splice(0, points.length - CHART_MAX_POINTS);
      drawChart();
    }
  }

  // showPartition shows whether the allocator applying the activity's
  // partition makes progress, and since when it holds the partition.
  function showPartition(p) {
    const el = $('allocator');
    el.classList.toggle('ok', !!p && !p.stalled);
    el.classList.toggle('warn', !!p && p.stalled);
    if (!p) {
      el.textContent = '–';
      el.dataset.value = '';
      $('allocator-hint').textContent = 'unknown: broker not readable';
      return;
    }
    el.textContent = p.stalled ? 'stalled' : p.waiting > 0 ? 'applying' : 'idle';
    el.dataset.value = el.textContent;
    const parts = ['partition ' + p.id, fmt.format(p.waiting) + ' waiting'];
    if (p.last_applied) parts.push('last applied ' + clock(parseTime(p.last_applied)));
    if (p.pinned_since) parts.push('held since ' + clock(parseTime(p.pinned_since)));
    $('allocator-hint').textContent = parts.join(' · ');
  }

  // showShards lists the MySQL shards and whether each answers, the
  // activity's marked; hidden with one database.
  function showShards(mine, shards) {
    const el = $('shards');
    el.hidden = !shards || shards.length === 0;
    if (el.hidden) { el.textContent = ''; return; }
    el.textContent = 'shards ' + shards.map((s) =>
      (s.name === mine ? '[' + s.name + ']' : s.name) + ': ' + (s.up ? 'up' : 'down')).join(' · ');
    el.dataset.down = shards.filter((s) => !s.up).map((s) => s.name).join(',');
  }

  // showHolds shows or hides the Held card; hold is the activity's hold.
  function showHolds(on, hold) {
    holdsShown = on;
    holdText = hold;
    $('held-card').hidden = !on;
    document.querySelector('.cards').classList.toggle('with-holds', on);
    renderHeldHint();
  }

  // renderHeldHint says how many holds lapsed: the expired events received.
  function renderHeldHint() {
    const expired = counts.get('expired') || 0;
    const el = $('held-hint');
    el.dataset.expired = String(expired);
    el.textContent = (expired ? fmt.format(expired) + ' expired' : 'awaiting confirmation') +
      (holdText ? ' · hold ' + holdText : '');
  }

  // ---- events --------------------------------------------------------------

  function onEvent(raw) {
    let ev;
    try { ev = JSON.parse(raw); } catch (e) { return; }
    // Read the user id from the text: it may not fit a JS number.
    const m = /"user_id"\s*:\s*(\d+)/.exec(raw);
    ev.user = m ? m[1] : String(ev.user_id);
    ev.n = ++serial;
    document.body.dataset.events = String(serial);
    counts.set(ev.kind, (counts.get(ev.kind) || 0) + 1);
    if (ev.kind === 'expired') {
      if (!holdsShown) showHolds(true, holdText); else renderHeldHint();
    }
    arrivals.push(performance.now());
    let list = recent.get(ev.kind);
    if (!list) recent.set(ev.kind, (list = []));
    list.push(ev);
    if (list.length > FEED_MAX) list.splice(0, list.length - FEED_MAX);
    scheduleRender();
  }

  function scheduleRender() {
    if (renderTimer) return;
    renderTimer = setTimeout(() => { renderTimer = 0; renderFeed(); }, 150);
  }

  function describe(ev) {
    switch (ev.kind) {
      case 'opened': return 'activity opened';
      case 'resized': return 'capacity changed';
      case 'sold_out': return 'last free seat taken';
      case 'expired': return 'user ' + ev.user + ' · hold lapsed';
      default:
        // held, and promoted under a hold, say until when the seat is held.
        if (ev.held_until) return 'user ' + ev.user + ' · held until ' + clock(parseTime(ev.held_until));
        return 'user ' + ev.user;
    }
  }

  function renderFeed() {
    const feed = $('feed');
    let shown = [];
    for (const [k, list] of recent) if (!hiddenKinds.has(k)) shown = shown.concat(list);
    shown.sort((a, b) => b.n - a.n);
    shown = shown.slice(0, FEED_MAX);
    const fresh = serial - renderedSerial;
    const frag = document.createDocumentFragment();
    for (const ev of shown) {
      const li = document.createElement('li');
      if (fresh <= 12 && ev.n > renderedSerial) li.className = 'new';
      const time = document.createElement('time');
      time.textContent = clock(parseTime(ev.at), true);
      time.dateTime = ev.at;
      const kind = document.createElement('span');
      kind.className = 'kind kind-' + ev.kind;
      kind.textContent = ev.kind.replace('_', ' ');
      const who = document.createElement('span');
      who.className = 'who';
      who.textContent = describe(ev);
      const seq = document.createElement('span');
      seq.className = 'seq';
      seq.textContent = '#' + ev.seq;
      seq.title = 'request stream sequence';
      li.append(time, kind, who, seq);
      frag.append(li);
    }
    if (shown.length === 0) {
      const li = document.createElement('li');
      li.className = 'empty';
      li.textContent = serial ? 'No event of the shown kinds yet.' : 'Events appear here as the allocator applies requests.';
      frag.append(li);
    }
    feed.replaceChildren(frag);
    renderedSerial = serial;
    $('feed-count').textContent = serial ? fmt.format(serial) + ' received' : 'none yet';
    renderKinds();
  }

  function renderKinds() {
    const box = $('kinds');
    const frag = document.createDocumentFragment();
    for (const k of KINDS) {
      if (!counts.get(k)) continue;
      const b = document.createElement('button');
      b.type = 'button';
      b.className = 'chip' + (hiddenKinds.has(k) ? ' off' : '');
      b.dataset.kind = k;
      b.title = (hiddenKinds.has(k) ? 'Show ' : 'Hide ') + k.replace('_', ' ') + ' events';
      const dot = document.createElement('i');
      dot.className = 'dot-' + k;
      const n = document.createElement('b');
      n.textContent = fmt.format(counts.get(k) || 0);
      b.append(dot, k.replace('_', ' ') + ' ', n);
      frag.append(b);
    }
    box.replaceChildren(frag);
  }

  function updateRate() {
    if (!activity) return;
    const now = performance.now();
    let i = 0;
    while (i < arrivals.length && arrivals[i] <= now - RATE_WINDOW_MS) i++;
    if (i) arrivals.splice(0, i);
    if (!connectedAt) return;
    const span = Math.max(1000, Math.min(RATE_WINDOW_MS, now - connectedAt));
    const rate = (arrivals.length * 1000) / span;
    const el = $('rate');
    el.textContent = rate >= 10 ? fmt.format(Math.round(rate)) : rate.toFixed(1);
    el.dataset.value = rate.toFixed(2);
  }

  // ---- chart ---------------------------------------------------------------

  // niceStep is the smallest of 1, 2, 2.5, 5 × 10^k that is at least v.
  function niceStep(v) {
    if (v <= 1) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function el(name, attrs, text) {
    const e = document.createElementNS(SVG_NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text != null) e.textContent = text;
    return e;
  }

  function drawChart() {
    const svg = $('chart');
    const W = Math.max(200, svg.clientWidth || svg.parentElement.clientWidth);
    const H = Math.max(150, svg.clientHeight || svg.parentElement.clientHeight);
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    svg.dataset.points = String(points.length);
    const nodes = [];
    if (points.length === 0) {
      nodes.push(el('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'empty' },
        activity ? 'The chart starts with the first state of an open activity.' : 'Pick an activity to watch.'));
      svg.replaceChildren(...nodes);
      return;
    }
    const pad = { l: 52, r: 14, t: 10, b: 24 };
    // The lines run on to now: a flat tail is news too (nothing moves).
    const lastPoint = points[points.length - 1];
    const tN = Math.max(lastPoint.t, Date.now() - clockOffset);
    const t0 = Math.max(points[0].t, tN - CHART_SPAN_MAX_MS);
    const t1 = Math.max(tN, t0 + CHART_SPAN_MIN_MS);
    const visible = points.filter((p) => p.t >= t0);
    if (tN > lastPoint.t) visible.push({ ...lastPoint, t: tN });
    let top = 1;
    for (const p of visible) top = Math.max(top, p.confirmed, p.waiting, p.capacity);
    const step = niceStep(top / 4);
    const yMax = Math.max(step, Math.ceil((top * 1.04) / step) * step);
    const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (W - pad.l - pad.r);
    const y = (v) => pad.t + (1 - v / yMax) * (H - pad.t - pad.b);

    for (let v = 0; v <= yMax + step / 2; v += step) {
      nodes.push(el('line', { x1: pad.l, x2: W - pad.r, y1: y(v), y2: y(v), class: 'grid-line' }));
      nodes.push(el('text', { x: pad.l - 8, y: y(v) + 4, 'text-anchor': 'end', class: 'axis-text' },
        v >= 10000 ? fmtCompact.format(v) : fmt.format(v)));
    }
    for (const [t, anchor] of [[t0, 'start'], [(t0 + t1) / 2, 'middle'], [t1, 'end']]) {
      nodes.push(el('text', { x: x(t), y: H - 6, 'text-anchor': anchor, class: 'axis-text' }, clock(t)));
    }
    const line = (key) => visible.map((p) => x(p.t).toFixed(1) + ',' + y(p[key]).toFixed(1)).join(' ');
    const first = visible[0];
    const last = visible[visible.length - 1];
    nodes.push(el('polygon', {
      points: x(first.t).toFixed(1) + ',' + y(0) + ' ' + line('confirmed') + ' ' + x(last.t).toFixed(1) + ',' + y(0),
      class: 'a-confirmed',
    }));
    nodes.push(el('polyline', { points: line('capacity'), class: 'l-capacity' }));
    nodes.push(el('polyline', { points: line('waiting'), class: 'l-waiting' }));
    nodes.push(el('polyline', { points: line('confirmed'), class: 'l-confirmed' }));
    svg.replaceChildren(...nodes);
  }

  // ---- wiring --------------------------------------------------------------

  function init() {
    $('kinds').addEventListener('click', (e) => {
      const b = e.target.closest('button[data-kind]');
      if (!b) return;
      const k = b.dataset.kind;
      if (hiddenKinds.has(k)) hiddenKinds.delete(k); else hiddenKinds.add(k);
      renderFeed();
    });
    $('pick').addEventListener('submit', (e) => {
      e.preventDefault();
      const tok = $('token-input').value.trim();
      if (tok) sessionStorage.setItem(TOKEN_KEY, tok); else sessionStorage.removeItem(TOKEN_KEY);
      const a = parseActivity($('activity-input').value);
      if (!a) {
        showBanner('An activity id is a whole number from 1 to 9223372036854775807.', 'warn');
        return;
      }
      watch(a);
    });
    let resizeTimer = 0;
    window.addEventListener('resize', () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(drawChart, 100);
    });
    setInterval(updateRate, 500);
    setInterval(() => { if (points.length) drawChart(); }, 1000);

    $('token-input').value = sessionStorage.getItem(TOKEN_KEY) || '';
    const a = parseActivity(new URLSearchParams(location.search).get('activity'));
    renderFeed();
    drawChart();
    if (a) {
      watch(a);
    } else {
      setStatus('idle', 'pick an activity');
      $('activity-input').focus();
    }
  }

  init();
})();
